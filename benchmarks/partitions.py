"""``partitions``: what partitioning the outbox by day (issue 25) costs and saves.

Three measurements, each in its own throw-away database (dropped before the next,
so the disk holds one at a time):

a. **claim**: 1,000 endpoints (100 workspaces x 10) and ``pending`` pending rows
   (1 KiB payloads) in today's partition; ``EngineStore.claim`` then
   ``EngineStore.record`` of the claimed rows, as ``backlog`` runs them, with the
   claim window the worker uses (``EngineStore.claim_window``).  Then delivered
   rows are added, spread evenly over 30 daily partitions (today and the 29 days
   before: a month-old outbox) until the outbox holds each of ``totals`` rows, and
   the same is measured again at each size, in the same run.  Delivered rows are
   written set-based (INSERT ... SELECT generate_series, ids from
   ``dispatcher_first_id(day)``), without events: the claim never reads them.  At
   the largest size one claim is EXPLAINed (ANALYZE, BUFFERS): the partitions its
   plan names and those it read; and the claim is measured once more without the
   window (the widest bounds), which is what the window saves.
b. **one day's retention**: a day partition of ``day_rows`` delivered rows is
   detached and dropped by the upkeep's statement; the same rows in an unpartitioned copy of the table
   (``LIKE webhook_deliveries INCLUDING ALL``, fillfactor 50 like the legacy table)
   are deleted 5,000 per statement as ``engine_prune_deliveries`` does, then the
   VACUUM that makes their space reusable.  Seconds and WAL bytes of each
   (``pg_current_wal_lsn`` before and after, after a CHECKPOINT so the first touch
   of every page writes its full image, as it would a week after the rows were
   written).
c. **a simulated week**: ``week_rows`` rows a day for 10 days with 7 days'
   retention, in the partitioned table and in the unpartitioned copy side by side.
   Each day's rows are inserted pending, leased (the claim's HOT update) and
   written delivered (the result's update) in 10,000-row transactions, then the
   day that expired is dropped (partitioned) or deleted in 5,000-row batches
   (unpartitioned); autovacuum does what it does meanwhile.  Then table + index
   size and dead tuples of each, and again after one plain VACUUM of each (its
   seconds and WAL: the vacuum debt each side ended the week with).

WAL is the server's (``pg_current_wal_lsn``): other databases' writes on a
shared server land in it too, which matters only for the small figures (a DROP).

Progress goes to stderr; the result (JSON) is printed by ``python -m benchmarks``.
"""

from __future__ import annotations

import calendar
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import psycopg2

from benchmarks.harness import bench_database, insert_backlog, percentile, server_dsn
from dispatcher.signing import ROTATION_GRACE
from dispatcher.store import QUERIES
from dispatcher.store.engine import EVERY_ID, AttemptRecord, ClaimWindow, EngineStore, ManagedConnection, slots_of
from dispatcher_devtools.kit import Database, run_autocommit, seed_endpoints

WORKSPACES = 100
ENDPOINTS_PER_WORKSPACE = 10
DAYS = 30
CLAIMS = 30
PRUNE_BATCH = 5_000       # retention.batch's default: what engine_prune_deliveries deletes per statement
LIFECYCLE_BATCH = 10_000  # rows per simulated claim/result transaction
SIMULATED_DAYS = 10
RETAINED_DAYS = 7
# Delivered rows the benchmark writes take the upper half of their day's id range: the
# sequence's values (the pending rows written through the id default) stay far below it.
SYNTHETIC_BASE = 1 << 37
LEGACY_COPY = "bench_unpartitioned_deliveries"


@dataclass(frozen=True)
class Sizes:
    pending: int                 # pending rows in today's partition (a)
    totals: tuple[int, ...]      # outbox sizes the claim is measured at after the pending-only one (a)
    day_rows: int                # the day partition dropped / deleted (b)
    week_rows: int               # rows a day in the simulated week (c)


DEFAULT = Sizes(pending=100_000, totals=(10_000_000, 50_000_000), day_rows=1_000_000, week_rows=500_000)
TINY = Sizes(pending=500, totals=(2_000, 20_000), day_rows=2_000, week_rows=2_000)


def parse_count(text: str) -> int:
    """``100k``, ``10M``, ``1_000_000`` or ``2e6`` as a row count."""
    cleaned = text.strip().replace("_", "").replace(",", "")
    factor = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(cleaned[-1:].lower(), 1)
    number = cleaned[:-1] if factor > 1 else cleaned
    try:
        value = int(float(number) * factor)
    except ValueError:
        raise ValueError(f"{text!r} is not a row count (e.g. 100k, 10M, 2500000)") from None
    if value < 1:
        raise ValueError(f"{text!r}: a row count must be positive")
    return value


def progress(message: str) -> None:
    """A progress line on stderr; a reader that went away (a closed pipe) never stops the run."""
    try:
        print(f"[partitions {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
    except OSError:
        pass


@contextmanager
def _stage(label: str) -> Iterator[dict[str, float]]:
    progress(f"{label} ...")
    timing: dict[str, float] = {}
    started = time.monotonic()
    yield timing
    timing["seconds"] = round(time.monotonic() - started, 1)
    progress(f"{label}: {timing['seconds']} s")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _wal(db: Database) -> str:
    return str(db.scalar("SELECT pg_current_wal_lsn()::text"))


def _wal_since(db: Database, start: str) -> int:
    return int(db.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (start,)))


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def _today(db: Database) -> date:
    value: date = db.scalar("SELECT dispatcher_today()")
    return value


def _ensure_day(db: Database, day: date) -> str:
    """``day``'s deliveries partition, created as the upkeep creates one (dispatcher_create_partition,
    migration 0028: fillfactor 50); its name."""
    db.query("SELECT dispatcher_create_partition('webhook_deliveries', %s)", (day,))
    return partition_name("webhook_deliveries", day)


# --------------------------------------------------------------------------- rows


def _endpoints(db: Database) -> tuple[list[int], list[str]]:
    rows = db.query("SELECT id, workspace_id FROM webhook_endpoints ORDER BY id")
    return [int(r[0]) for r in rows], [str(r[1]) for r in rows]


def insert_rows(cur: Any, table: str, day: date, first: int, count: int, endpoints: tuple[list[int], list[str]],
                status: str) -> int:
    """``count`` rows of ``day`` into ``table``, synthetic ids ``first_id(day) + 2^37 + first + 1 ..``,
    each for one of ``endpoints`` in turn, created through the day; ``status`` delivered (its
    result written) or pending (due).  No events: nothing here reads them."""
    cur.execute(
        f"""
        INSERT INTO {table} (id, workspace_id, endpoint_id, event_id, event_day, payload_hash, attempt, status,
                             next_attempt_at, created_at, delivered_at, finished_at, last_status_code)
        SELECT dispatcher_first_id(%(day)s) + %(base)s + g,
               (%(workspaces)s::text[])[1 + g %% %(n)s], (%(endpoints)s::bigint[])[1 + g %% %(n)s],
               md5(%(day)s::text || g)::uuid::text, %(day)s, repeat(md5(g::text), 2),
               CASE WHEN %(delivered)s THEN 1 ELSE 0 END, %(status)s, t, t,
               CASE WHEN %(delivered)s THEN t + interval '80 ms' END,
               CASE WHEN %(delivered)s THEN t + interval '80 ms' END,
               CASE WHEN %(delivered)s THEN 200 END
          FROM generate_series(%(first)s + 1, %(first)s + %(count)s) g,
               LATERAL (SELECT (%(day)s::timestamp AT TIME ZONE 'UTC')
                               + make_interval(secs => (g %% 86400)::float8)) AS at(t)
        """,
        {"day": day, "base": SYNTHETIC_BASE, "first": first, "count": count, "endpoints": endpoints[0],
         "workspaces": endpoints[1], "n": len(endpoints[0]), "status": status, "delivered": status == "delivered"})
    return int(cur.rowcount)


def _insert(db: Database, table: str, day: date, first: int, count: int,
            endpoints: tuple[list[int], list[str]], status: str = "delivered") -> None:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            insert_rows(cur, table, day, first, count, endpoints, status)
        conn.commit()
    finally:
        conn.close()


# --------------------------------------------------------------------------- (a) the claim


def _claims(store: EngineStore, window: ClaimWindow, cursor: int,
            claims: int) -> tuple[dict[str, Any], int]:
    """``claims`` claims and result writes as ``backlog`` measures them (results written as
    retries due at once: the rows stay pending and the outbox keeps its size)."""
    claim_s: list[float] = []
    record_s: list[float] = []
    rows_claimed = 0
    for n in range(claims + 3):
        started = time.perf_counter()
        rows = store.claim("bench:partitions", 200, 4, [], cursor, 60.0, window=window)
        claimed = time.perf_counter()
        if not rows:
            break
        wrapped = [r.endpoint_id for r in rows if r.endpoint_id <= cursor]
        cursor = max(wrapped) if wrapped else max(r.endpoint_id for r in rows)
        now = time.monotonic()
        store.record([AttemptRecord(r.id, r.claim_token, r.endpoint_id, "pending", r.attempt, 0.0, "HTTP 500", 500,
                                    "http_5xx", now, 1, "") for r in rows], slots_of(rows))
        recorded = time.perf_counter()
        if n >= 3:  # warm-up: prepared statements and caches
            claim_s.append(claimed - started)
            record_s.append(recorded - claimed)
            rows_claimed += len(rows)
    per_claim = rows_claimed / len(claim_s) if claim_s else 0
    return {
        "claims": len(claim_s), "rows_per_claim": round(per_claim, 1),
        "claim_p50_ms": _ms(percentile(claim_s, 50)), "claim_p99_ms": _ms(percentile(claim_s, 99)),
        "record_p50_ms": _ms(percentile(record_s, 50)), "record_p99_ms": _ms(percentile(record_s, 99)),
        "claim_us_per_delivery": round(statistics.median(claim_s) * 1e6 / per_claim, 1) if per_claim else None,
        "record_us_per_delivery": round(statistics.median(record_s) * 1e6 / per_claim, 1) if per_claim else None,
    }, cursor


def _plan_relations(node: dict[str, Any], found: dict[str, int]) -> int:
    """Walk a JSON plan: {relation: loops} of every scan of a deliveries partition; returns the
    subplans removed by run-time pruning."""
    removed = int(node.get("Subplans Removed", 0))
    relation = node.get("Relation Name")
    if relation and relation.startswith("webhook_deliveries_"):  # a partition (the parent: an UPDATE target)
        found[relation] = found.get(relation, 0) + int(node.get("Actual Loops", 0))
    for child in node.get("Plans", []):
        removed += _plan_relations(child, found)
    return removed


def explain_claim(db: Database, cursor: int, window: ClaimWindow) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim, rolled back: the partitions it planned and read."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            params = {"owner": "bench:explain", "limit": 200, "per_endpoint": 4, "share": 4, "busy": [],
                      "after": cursor, "lease": 60.0, "grace": ROTATION_GRACE, "refill": "[]",
                      "floor": window.floor, "ceiling": window.ceiling}
            cur.execute("SAVEPOINT text_form")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["engine_claim"], params)
            text = [r[0] for r in cur.fetchall()]
            cur.execute("ROLLBACK TO SAVEPOINT text_form")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["engine_claim"], params)
            plan = cur.fetchone()[0][0]
        conn.rollback()
    finally:
        conn.close()
    relations: dict[str, int] = {}
    removed = _plan_relations(plan["Plan"], relations)
    top = plan["Plan"]
    return {"planning_ms": round(plan.get("Planning Time", 0.0), 3),
            "execution_ms": round(plan.get("Execution Time", 0.0), 3),
            "shared_hit_blocks": top.get("Shared Hit Blocks"), "shared_read_blocks": top.get("Shared Read Blocks"),
            "rows": top.get("Actual Rows"),
            "partitions_in_plan": sorted(relations), "partitions_read": sorted(r for r, n in relations.items() if n),
            "subplans_removed_at_run_time": removed, "text": text}


def _partition_count(db: Database) -> int:
    return int(db.scalar("SELECT count(*) FROM pg_partition_tree('webhook_deliveries') WHERE isleaf"))


def load_day(db: Database, day: date, rows: int, endpoints: tuple[list[int], list[str]]) -> None:
    """``day``'s partition rebuilt holding ``rows`` delivered rows, the bulk-load way: a table of the
    partition's shape is filled without indexes, then attached (a CHECK proves its bound, so ATTACH
    does not scan it, and builds each index in one sorted pass: about 2.5 times faster than inserting
    through the indexes)."""
    name = partition_name("webhook_deliveries", day)
    if db.scalar("SELECT to_regclass(%s) IS NOT NULL", (name,)):
        db.execute_autocommit(f"ALTER TABLE webhook_deliveries DETACH PARTITION {name}")
        db.execute_autocommit(f"DROP TABLE {name}")
    db.execute_autocommit(f"CREATE TABLE {name} (LIKE webhook_deliveries INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                          " WITH (fillfactor = 50)")
    _insert(db, name, day, 0, rows, endpoints)
    lo = f"dispatcher_first_id('{day.isoformat()}')"
    hi = f"dispatcher_first_id('{(day + timedelta(days=1)).isoformat()}')"
    db.execute_autocommit(f"ALTER TABLE {name} ADD CONSTRAINT bench_bound CHECK (id >= {lo} AND id < {hi})")
    db.execute_autocommit("SET maintenance_work_mem = '256MB'; "
                          f"ALTER TABLE webhook_deliveries ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})")
    db.execute_autocommit(f"ALTER TABLE {name} DROP CONSTRAINT bench_bound")
    db.execute_autocommit(f"VACUUM ANALYZE {name}")


def fill_month(db: Database, days: list[date], delivered: int, before: int,
               endpoints: tuple[list[int], list[str]]) -> None:
    """``delivered`` rows spread evenly over ``days`` (the last one today, which holds the pending rows
    too, and so takes its share through the indexes; ``before``: the delivered rows written so far)."""
    def share(total: int, index: int) -> int:
        return total // len(days) + (1 if index < total % len(days) else 0)

    for index, day in enumerate(days):
        started = time.monotonic()
        if index < len(days) - 1:
            load_day(db, day, share(delivered, index), endpoints)
        else:
            _insert(db, "webhook_deliveries", day, share(before, index), share(delivered, index) - share(before, index),
                    endpoints)
            db.execute_autocommit(f"VACUUM ANALYZE {partition_name('webhook_deliveries', day)}")
        progress(f"  day {index + 1}/{len(days)} {day}: {share(delivered, index):,} delivered rows, "
                 f"{time.monotonic() - started:.1f} s")


def claim_cost(sizes: Sizes) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    with bench_database("partitions_claim") as db:
        seed_endpoints(db.connect(), [[f"http://127.0.0.1:9/ok/e{w}-{i}" for i in range(ENDPOINTS_PER_WORKSPACE)]
                                      for w in range(WORKSPACES)])
        endpoints = _endpoints(db)
        today = _today(db)
        days = [today - timedelta(days=DAYS - 1 - n) for n in range(DAYS)]
        for day in days:
            _ensure_day(db, day)
        with _stage(f"claim: {sizes.pending:,} pending rows in today's partition"):
            conn = db.connect()
            with conn.cursor() as cur:
                insert_backlog(cur, WORKSPACES, sizes.pending // ENDPOINTS_PER_WORKSPACE, 1024)
            conn.commit()
            conn.close()
            db.execute_autocommit("VACUUM ANALYZE")
        connection = ManagedConnection(db.dsn, "dispatcher partitions probe")
        store = EngineStore(connection)
        cursor = 0
        delivered = 0
        for total in (0, *sizes.totals):
            if total:
                target = total - sizes.pending
                with _stage(f"claim: {target:,} delivered rows over {DAYS} days (outbox {total:,})") as filled:
                    fill_month(db, days, target, delivered, endpoints)
                    db.execute_autocommit("ANALYZE webhook_deliveries")
                delivered = target
            window = store.claim_window()
            figures, cursor = _claims(store, window, cursor, CLAIMS)
            step = {"outbox_rows": sizes.pending + delivered, "pending": sizes.pending, "delivered": delivered,
                    "partitions": _partition_count(db), "window": [window.floor, window.ceiling], **figures}
            if total:
                step["fill_seconds"] = filled["seconds"]
            steps.append(step)
            progress(f"claim at {step['outbox_rows']:,} rows: {figures['claim_p50_ms']} ms p50, "
                     f"{figures['claim_us_per_delivery']} us/delivery")
        largest = steps[-1]
        largest["explain"] = explain_claim(db, cursor, window)
        largest["without_window"], cursor = _claims(store, EVERY_ID, cursor, CLAIMS)
        largest["explain_without_window"] = explain_claim(db, cursor, EVERY_ID)
        largest["bytes"] = _sizes(db)
        connection.close()
    return {"steps": steps}


def _sizes(db: Database) -> dict[str, int]:
    (heap, total), = db.query(
        "SELECT sum(pg_relation_size(relid)), sum(pg_total_relation_size(relid)) "
        "FROM pg_partition_tree('webhook_deliveries') WHERE isleaf")
    return {"heap": int(heap), "heap_and_indexes": int(total)}


# --------------------------------------------------------------------------- (b) one day's retention

# engine_prune_deliveries (dispatcher/sql/engine.sql) on the unpartitioned copy: the statement the
# upkeep repeats until a batch comes back short.
PRUNE_COPY = f"""
SET LOCAL enable_seqscan = off;
WITH doomed AS (
    SELECT id FROM {LEGACY_COPY}
     WHERE status = ANY (%(statuses)s::text[])
       AND created_at < now() - make_interval(secs => %(older_than)s)
     LIMIT %(batch)s
)
DELETE FROM {LEGACY_COPY} d USING doomed WHERE d.id = doomed.id;
"""


def _create_copy(db: Database) -> None:
    """The outbox as one table: the partitioned parent's columns, defaults, constraints and indexes,
    and the legacy table's fillfactor."""
    db.execute_autocommit(f"CREATE TABLE {LEGACY_COPY} (LIKE webhook_deliveries INCLUDING ALL) WITH (fillfactor = 50)")


def drop_day(db: Database, day: date) -> dict[str, Any]:
    """Detach and drop ``day``'s partition with the upkeep's statement (``partitions_drop``: under a
    lock_timeout, dispatcher_drop_partition checks under the lock that no pending or held row is left,
    then drops): seconds and WAL bytes."""
    name = partition_name("webhook_deliveries", day)
    start = _wal(db)
    started = time.perf_counter()
    conn = db.connect()
    try:
        with conn, conn.cursor() as cur:
            cur.execute(QUERIES["partitions_drop"], {"parent": "webhook_deliveries", "name": name,
                                                     "lock_timeout": "5s"})
            (kept,) = cur.fetchone()
    finally:
        conn.close()
    seconds = time.perf_counter() - started
    if kept is not None:
        raise RuntimeError(f"{name} was not dropped: {kept}")
    return {"seconds": round(seconds, 4), "wal_bytes": _wal_since(db, start)}


def delete_day(db: Database, day: date) -> dict[str, Any]:
    """Delete the copy's rows created before the end of ``day``, ``PRUNE_BATCH`` per statement (each
    its own transaction) until a batch comes back short: seconds, WAL bytes, statements, rows."""
    cutoff = calendar.timegm((day + timedelta(days=1)).timetuple())  # the day's end (UTC) as an epoch
    start = _wal(db)
    started = time.perf_counter()
    statements = deleted = 0
    conn = db.connect()
    try:
        while True:
            with conn, conn.cursor() as cur:
                # Half a second short of the day's end: the statement's now() is a little later than
                # this clock, and the next day's first row is written at its very first second.
                cur.execute(PRUNE_COPY, {"statuses": ["delivered", "shadow"], "batch": PRUNE_BATCH,
                                         "older_than": time.time() - cutoff + 0.5})
                done = int(cur.rowcount)
            statements += 1
            deleted += done
            if done < PRUNE_BATCH:
                break
    finally:
        conn.close()
    return {"seconds": round(time.perf_counter() - started, 3), "wal_bytes": _wal_since(db, start),
            "statements": statements, "rows": deleted}


def _vacuum(db: Database, table: str) -> dict[str, Any]:
    """A plain VACUUM of ``table`` (every partition of a partitioned one): seconds and WAL bytes."""
    start = _wal(db)
    started = time.perf_counter()
    db.execute_autocommit(f"VACUUM {table}")
    return {"seconds": round(time.perf_counter() - started, 3), "wal_bytes": _wal_since(db, start)}


def one_day_retention(sizes: Sizes) -> dict[str, Any]:
    with bench_database("partitions_retention") as db:
        seed_endpoints(db.connect(), [[f"http://127.0.0.1:9/ok/e{w}-{i}" for i in range(ENDPOINTS_PER_WORKSPACE)]
                                      for w in range(WORKSPACES)])
        endpoints = _endpoints(db)
        day = _today(db) - timedelta(days=RETAINED_DAYS + 1)
        name = partition_name("webhook_deliveries", day)
        _create_copy(db)
        with _stage(f"retention: {sizes.day_rows:,} delivered rows in {name} and in the copy") as filled:
            load_day(db, day, sizes.day_rows, endpoints)
            db.execute_autocommit(f"INSERT INTO {LEGACY_COPY} SELECT * FROM {name}")
            db.execute_autocommit(f"VACUUM ANALYZE {LEGACY_COPY}")
        held = {"partition": _total_size(db, name), "copy": _total_size(db, LEGACY_COPY)}
        db.execute_autocommit("CHECKPOINT")
        with _stage("retention: detach + drop the partition"):
            dropped = drop_day(db, day)
        db.execute_autocommit("CHECKPOINT")
        with _stage(f"retention: batched delete from the copy ({PRUNE_BATCH:,} per statement)"):
            deleted = delete_day(db, day)
        with _stage("retention: VACUUM of the copy"):
            vacuumed = _vacuum(db, LEGACY_COPY)
        left = int(db.scalar(f"SELECT count(*) FROM {LEGACY_COPY}"))
    return {"rows": sizes.day_rows, "fill_seconds": filled["seconds"], "bytes_before": held,
            "drop": dropped, "delete": deleted, "vacuum_after_delete": vacuumed, "rows_left_in_copy": left,
            "delete_to_drop_seconds": _ratio(deleted["seconds"], dropped["seconds"]),
            "delete_to_drop_wal": _ratio(deleted["wal_bytes"], dropped["wal_bytes"])}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 1) if b else None


def _total_size(db: Database, table: str) -> int:
    return int(db.scalar("SELECT pg_total_relation_size(%s::regclass)", (table,)))


# --------------------------------------------------------------------------- (c) a simulated week

LEASE = """UPDATE {table} SET locked_by = 'bench:w1', locked_until = now() + interval '60 s', claim_token = %(token)s
 WHERE id > %(lo)s AND id <= %(hi)s AND status = 'pending'"""
RESULT = """UPDATE {table} SET status = 'delivered', attempt = 1, last_status_code = 200,
       delivered_at = created_at + interval '80 ms', finished_at = created_at + interval '80 ms',
       locked_by = NULL, locked_until = NULL, claim_token = NULL
 WHERE id > %(lo)s AND id <= %(hi)s AND claim_token = %(token)s AND status = 'pending'"""


def live_through(db: Database, table: str, day: date, rows: int) -> None:
    """Each row of ``day`` leased (the claim's update: columns no index names) and written delivered
    (the result's update), ``LIFECYCLE_BATCH`` rows per transaction, as workers would."""
    first = int(db.scalar("SELECT dispatcher_first_id(%s)", (day,))) + SYNTHETIC_BASE
    conn = db.connect()
    try:
        for token, lo in enumerate(range(0, rows, LIFECYCLE_BATCH), start=1):
            bounds = {"lo": first + lo, "hi": first + lo + LIFECYCLE_BATCH, "token": token}
            with conn, conn.cursor() as cur:
                cur.execute(LEASE.format(table=table), bounds)
            with conn, conn.cursor() as cur:
                cur.execute(RESULT.format(table=table), bounds)
    finally:
        conn.close()


def _side_stats(db: Database, relations: Sequence[str]) -> dict[str, Any]:
    (total, heap, live, dead, inserted, autovacuums), = db.query(
        """SELECT sum(pg_total_relation_size(s.relid)), sum(pg_relation_size(s.relid)), sum(s.n_live_tup),
                  sum(s.n_dead_tup), sum(s.n_tup_ins), sum(s.autovacuum_count)
             FROM pg_stat_user_tables s WHERE s.relname = ANY(%s)""", (list(relations),))
    return {"heap_and_indexes_bytes": int(total or 0), "heap_bytes": int(heap or 0), "live_tuples": int(live or 0),
            "dead_tuples": int(dead or 0), "inserted": int(inserted or 0), "autovacuum_runs": int(autovacuums or 0)}


def _partitions(db: Database) -> list[str]:
    return [str(r[0]) for r in db.query(
        "SELECT relid::regclass::text FROM pg_partition_tree('webhook_deliveries') WHERE isleaf")]


def _settled_stats(db: Database, inserted: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Both sides' figures once every writer's table counters have reached the statistics
    (a backend reports them at exit; pg_stat_force_next_flush covers only the caller)."""
    deadline = time.monotonic() + 10.0
    while True:
        stats = {"partitioned": _side_stats(db, _partitions(db)), "unpartitioned": _side_stats(db, [LEGACY_COPY])}
        if all(stats[side]["inserted"] >= n for side, n in inserted.items()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def simulated_week(sizes: Sizes) -> dict[str, Any]:
    sides = {"partitioned": "webhook_deliveries", "unpartitioned": LEGACY_COPY}
    retention: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    lifecycle_s = {side: 0.0 for side in sides}
    with bench_database("partitions_week") as db:
        seed_endpoints(db.connect(), [[f"http://127.0.0.1:9/ok/e{w}-{i}" for i in range(ENDPOINTS_PER_WORKSPACE)]
                                      for w in range(WORKSPACES)])
        endpoints = _endpoints(db)
        _create_copy(db)
        first_day = _today(db) - timedelta(days=SIMULATED_DAYS)
        for k in range(SIMULATED_DAYS):
            day = first_day + timedelta(days=k)
            started = time.monotonic()
            _ensure_day(db, day)
            for side, table in sides.items():
                begun = time.monotonic()
                _insert(db, table, day, 0, sizes.week_rows, endpoints, status="pending")
                live_through(db, table, day, sizes.week_rows)
                lifecycle_s[side] += time.monotonic() - begun
            expired = day - timedelta(days=RETAINED_DAYS)
            if expired >= first_day:
                retention["partitioned"].append(drop_day(db, expired))
                retention["unpartitioned"].append(delete_day(db, expired))
            progress(f"week: day {k + 1}/{SIMULATED_DAYS} {day}: {sizes.week_rows:,} rows each side"
                     f"{', day ' + str(expired) + ' expired' if expired >= first_day else ''} "
                     f"in {time.monotonic() - started:.1f} s")
        kept = RETAINED_DAYS * sizes.week_rows
        stats = _settled_stats(db, {"partitioned": kept, "unpartitioned": SIMULATED_DAYS * sizes.week_rows})
        rows = {side: int(db.scalar(f"SELECT count(*) FROM {table}")) for side, table in sides.items()}
        vacuumed = {side: _vacuum(db, table) for side, table in sides.items()}
        after = _settled_stats(db, {})
    out: dict[str, Any] = {"rows_per_day": sizes.week_rows, "days": SIMULATED_DAYS, "retained_days": RETAINED_DAYS}
    for side in sides:
        spent = retention[side]
        out[side] = {**stats[side], "rows": rows[side], "lifecycle_seconds": round(lifecycle_s[side], 1),
                     "vacuum": {**vacuumed[side], "heap_and_indexes_bytes_after": after[side]["heap_and_indexes_bytes"],
                                "dead_tuples_after": after[side]["dead_tuples"]},
                     "retention_rounds": len(spent),
                     "retention_seconds": round(sum(r["seconds"] for r in spent), 3),
                     "retention_wal_bytes": sum(r["wal_bytes"] for r in spent),
                     "retention_per_day": spent}
    return out


# --------------------------------------------------------------------------- the scenario


def _part(label: str, measure: Any, sizes: Sizes) -> dict[str, Any]:
    """One measurement; a failure is reported in its place and the others still run."""
    started = time.monotonic()
    try:
        result: dict[str, Any] = measure(sizes)
    except Exception as exc:  # one broken part must not hide the others' figures
        import traceback

        progress(f"{label} failed: {type(exc).__name__}: {exc}")
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6)}
    result["wall_s"] = round(time.monotonic() - started, 1)
    return result


# What a delivered row takes with its indexes in a day partition (fillfactor 50), measured at 5 M rows:
# 3.28 GB.  The pre-flight check asks for this much per row of the largest outbox, and a tenth more.
BYTES_PER_ROW = 660


def _leftovers() -> list[str]:
    """Databases of a killed run of this scenario (``bench_partitions_*_<pid>`` whose process is gone)."""
    conn = psycopg2.connect(server_dsn())
    try:
        with conn.cursor() as cur:
            cur.execute(r"SELECT datname FROM pg_database WHERE datname LIKE 'bench\_partitions\_%'")
            names = [str(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()
    return [name for name in names if name.rsplit("_", 1)[-1].isdigit()
            and not os.path.exists(f"/proc/{name.rsplit('_', 1)[-1]}")]


def _data_directory() -> str | None:
    """The server's data directory, if this session may read it (a superuser's)."""
    conn = psycopg2.connect(server_dsn())
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW data_directory")
            return str(cur.fetchone()[0])
    except psycopg2.Error:
        return None
    finally:
        conn.close()


def preflight(sizes: Sizes) -> dict[str, Any]:
    """Drop a killed run's databases, then refuse to start without room for the largest outbox (checked
    when the server's data directory is on this machine)."""
    for name in _leftovers():
        progress(f"dropping {name}, left by a run that was killed")
        run_autocommit(server_dsn(), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    needed = int(max(sizes.totals) * BYTES_PER_ROW * 1.1)
    directory = _data_directory()
    if directory is None or not os.path.isdir(directory):
        return {"needed_bytes": needed}
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise RuntimeError(f"{free / 2**30:.1f} GiB free under {directory}, and the largest outbox "
                           f"({max(sizes.totals):,} rows) needs about {needed / 2**30:.1f} GiB")
    return {"free_bytes": free, "needed_bytes": needed}


def run(tiny: bool = False, pending: int | None = None, totals: Sequence[int] | None = None,
        day_rows: int | None = None, week_rows: int | None = None) -> dict[str, Any]:
    base = TINY if tiny else DEFAULT
    sizes = Sizes(pending=pending or base.pending, totals=tuple(sorted(totals)) if totals else base.totals,
                  day_rows=day_rows or base.day_rows, week_rows=week_rows or base.week_rows)
    if sizes.totals[0] <= sizes.pending:
        raise ValueError(f"every outbox size ({sizes.totals}) must exceed the pending rows ({sizes.pending})")
    progress(f"sizes: {sizes.pending:,} pending; outbox {', '.join(f'{t:,}' for t in sizes.totals)}; "
             f"{sizes.day_rows:,} rows in the day dropped; {sizes.week_rows:,} rows a day in the week")
    disk = preflight(sizes)
    claim = _part("claim", claim_cost, sizes)
    retention = _part("retention", one_day_retention, sizes)
    week = _part("week", simulated_week, sizes)
    result: dict[str, Any] = {"sizes": {"pending": sizes.pending, "totals": list(sizes.totals),
                                        "day_rows": sizes.day_rows, "week_rows": sizes.week_rows},
                              "disk": disk,
                              "claim": claim, "retention": retention, "week": week, "lost": 0}
    errors = [name for name, part in (("claim", claim), ("retention", retention), ("week", week)) if "error" in part]
    result["errors"] = errors
    result["table"] = _table(result)
    result["met"] = None if not errors else False  # reports; no target
    return result


def _table(result: dict[str, Any]) -> list[tuple[str, Any, str]]:
    rows: list[tuple[str, Any, str]] = []
    for step in result["claim"].get("steps", []):
        rows.append((f"claim us/delivery, {step['outbox_rows']:,} rows", step["claim_us_per_delivery"], "report"))
    largest = (result["claim"].get("steps") or [{}])[-1]
    if "explain" in largest:
        rows.append(("partitions the largest claim read", len(largest["explain"]["partitions_read"]), "report"))
        rows.append(("claim us/delivery there without the window", largest["without_window"]["claim_us_per_delivery"],
                     "report"))
    retention = result["retention"]
    if "drop" in retention:
        rows.append((f"drop a day of {retention['rows']:,} rows, s", retention["drop"]["seconds"], "report"))
        rows.append(("delete the same rows in batches, s", retention["delete"]["seconds"], "report"))
        rows.append(("WAL: drop, bytes", retention["drop"]["wal_bytes"], "report"))
        rows.append(("WAL: batched delete, bytes", retention["delete"]["wal_bytes"], "report"))
    week = result["week"]
    for side in ("partitioned", "unpartitioned"):
        if side in week:
            rows.append((f"week: {side} MB", round(week[side]["heap_and_indexes_bytes"] / 2**20, 1), "report"))
            rows.append((f"week: {side} dead tuples", week[side]["dead_tuples"], "report"))
    return rows
