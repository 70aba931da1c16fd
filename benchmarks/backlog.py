"""``backlog``: claim latency and per-delivery cost as the outbox grows, and
what the ``throughput`` drain leaves behind for vacuum.

One database grows to 10k, 100k and 1M pending rows (1,000 endpoints, 1 KiB
payloads), vacuumed and analysed at each size like a table autovacuum keeps
up with.  At each size the engine's own statements run as the worker runs
them (``EngineStore.claim`` with the rotating cursor, then
``EngineStore.record`` of the claimed rows), and one claim and one result
write are EXPLAINed with ANALYZE and BUFFERS.  Target: claim cost flat within
2x from 10k to 1M.

Results are written as retries due at once (HTTP 500, delay 0), so the rows
stay pending and each size holds while it is measured.

The dead-tuple and bloat figures come from the ``throughput`` run of the same
invocation (its outbox after the drain, then after one plain VACUUM); run
alone, this scenario drains a smaller outbox itself to get them.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.harness import (
    bench_database,
    insert_backlog,
    percentile,
    size_sql,
)
from dispatcher.signing import ROTATION_GRACE
from dispatcher.store import QUERIES
from dispatcher.store.engine import AttemptRecord, EngineStore, ManagedConnection, result_rows, slots_of
from dispatcher_devtools.kit import Database, seed_endpoints

WORKSPACES = 100
ENDPOINTS_PER_WORKSPACE = 10
CLAIMS = 30


def _measure(db: Database, store: EngineStore, cursor: int, claims: int) -> tuple[dict[str, Any], int]:
    claim_s: list[float] = []
    record_s: list[float] = []
    rows_claimed = 0
    window = store.claim_window()  # as the worker claims: within the window of ids (docs/claim.md)
    for n in range(claims + 3):
        started = time.perf_counter()
        rows = store.claim("bench:backlog", 200, 4, [], cursor, 60.0, window=window)
        claimed = time.perf_counter()
        if not rows:
            break
        wrapped = [r.endpoint_id for r in rows if r.endpoint_id <= cursor]
        cursor = max(wrapped) if wrapped else max(r.endpoint_id for r in rows)
        now = time.monotonic()
        # Written as retries due at once (an HTTP 500, delay 0): the rows stay
        # pending, so the backlog keeps its size while it is measured.
        store.record([AttemptRecord(r.id, r.claim_token, r.endpoint_id, "pending", r.attempt, 0.0, "HTTP 500", 500,
                                    "http_5xx", now, 1, "") for r in rows], slots_of(rows))
        recorded = time.perf_counter()
        if n >= 3:  # warm-up: the first claims load the prepared statements and caches
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


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _explain(db: Database, cursor: int) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of one claim and of the result write of its rows."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT floor, ceiling FROM dispatcher_claim_window()")
            (floor, ceiling), = cur.fetchall()
            params = {"owner": "bench:explain", "limit": 200, "per_endpoint": 4, "share": 4, "busy": [],
                      "after": cursor, "lease": 60.0, "grace": ROTATION_GRACE, "refill": "[]",
                      "floor": floor, "ceiling": ceiling}
            # Each statement runs twice: as text inside a savepoint that is
            # rolled back, then as JSON for real (the record needs the claim).
            cur.execute("SAVEPOINT text_form")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["engine_claim"], params)
            claim_text = [r[0] for r in cur.fetchall()]
            cur.execute("ROLLBACK TO SAVEPOINT text_form")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["engine_claim"], params)
            claim_plan = cur.fetchone()[0][0]
            cur.execute("SELECT id, claim_token, endpoint_id FROM webhook_deliveries "
                        "WHERE locked_by = 'bench:explain' AND status = 'pending'")
            claimed = cur.fetchall()
            now = time.monotonic()
            results = result_rows([AttemptRecord(i, t, e, "delivered", 1, 0.0, None, 200, "delivered", now - 0.01, 1,
                                                 "") for i, t, e in claimed], now)
            # (rolled back below, like the claim: the backlog keeps its size)
            cur.execute("SAVEPOINT text_form")
            ids = "{" + ",".join(str(i) for i, _, _ in claimed) + "}"
            cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + QUERIES["engine_record"],
                        {"results": results, "slots": "[]", "ids": ids})
            record_text = [r[0] for r in cur.fetchall()]
            cur.execute("ROLLBACK TO SAVEPOINT text_form")
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["engine_record"],
                        {"results": results, "slots": "[]", "ids": ids})
            record_plan = cur.fetchone()[0][0]
        conn.rollback()
    finally:
        conn.close()

    def digest(plan: dict[str, Any]) -> dict[str, Any]:
        top = plan["Plan"]
        return {"planning_ms": round(plan.get("Planning Time", 0.0), 3),
                "execution_ms": round(plan.get("Execution Time", 0.0), 3),
                "shared_hit_blocks": top.get("Shared Hit Blocks"), "shared_read_blocks": top.get("Shared Read Blocks"),
                "shared_dirtied_blocks": top.get("Shared Dirtied Blocks"), "rows": top.get("Actual Rows")}

    return {"claim": digest(claim_plan), "record": digest(record_plan),
            "claim_text": claim_text, "record_text": record_text}


def growth(sizes: list[int], payload_bytes: int = 1024) -> list[dict[str, Any]]:
    out = []
    with bench_database("backlog") as db:
        seed_endpoints(db.connect(), [[f"http://127.0.0.1:9/ok/e{w}-{i}" for i in range(ENDPOINTS_PER_WORKSPACE)]
                                      for w in range(WORKSPACES)])
        store = EngineStore(ManagedConnection(db.dsn, "dispatcher backlog probe"))
        events = 0
        cursor = 0
        for size in sizes:
            target_events = size // ENDPOINTS_PER_WORKSPACE
            started = time.monotonic()
            conn = db.connect()
            with conn.cursor() as cur:
                insert_backlog(cur, WORKSPACES, target_events - events, payload_bytes, first_event=events)
            conn.commit()
            conn.close()
            events = target_events
            db.execute_autocommit("VACUUM ANALYZE webhook_deliveries")
            db.execute_autocommit("VACUUM ANALYZE events")
            seeded_s = time.monotonic() - started
            pending = int(db.scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'"))
            figures, cursor = _measure(db, store, cursor, CLAIMS)
            explain = _explain(db, cursor)
            sizes_bytes = dict(db.query(  # summed over the partitions (migration 0027)
                f"SELECT 'webhook_deliveries', {size_sql('webhook_deliveries')} UNION ALL "
                f"SELECT 'webhook_deliveries_due', {size_sql('webhook_deliveries_due')} UNION ALL "
                f"SELECT 'events', {size_sql('events')}"))
            entry = {"size": size, "pending": pending, "seed_seconds": round(seeded_s, 1), **figures,
                     "explain": {"claim": explain["claim"], "record": explain["record"]},
                     "sizes_bytes": {k: int(v) for k, v in sizes_bytes.items()}}
            if size == sizes[-1]:
                entry["explain_text"] = {"claim": explain["claim_text"], "record": explain["record_text"]}
            out.append(entry)
    return out


def run(tiny: bool = False, throughput_outbox: dict[str, Any] | None = None) -> dict[str, Any]:
    sizes = [1_000, 2_000, 5_000] if tiny else [10_000, 100_000, 1_000_000]
    steps = growth(sizes)
    first, last = steps[0], steps[-1]
    ratio = (round(last["claim_us_per_delivery"] / first["claim_us_per_delivery"], 2)
             if first["claim_us_per_delivery"] and last["claim_us_per_delivery"] else None)
    source = "throughput run of this invocation"
    if throughput_outbox is None:
        from benchmarks.throughput import drain

        events = 50 if tiny else 5_000
        drained = drain(events=events, workspaces=10 if tiny else 100, label="backlog_drain")
        throughput_outbox = {"outbox_after": drained["outbox_after"], "outbox_timeline": drained["outbox_timeline"],
                             "deliveries": drained["deliveries"], "seconds": drained["seconds"]}
        source = f"own drain of {drained['deliveries']} deliveries (throughput not run in this invocation)"
    after = throughput_outbox["outbox_after"]
    timeline = throughput_outbox.get("outbox_timeline") or []
    result: dict[str, Any] = {
        "sizes": steps,
        "claim_cost_ratio_1m_to_10k": ratio,
        "after_drain": {"source": source, "deliveries": throughput_outbox.get("deliveries"),
                        "seconds": throughput_outbox.get("seconds"), **after},
        "dead_tuples_timeline": timeline[:: max(1, len(timeline) // 12)],
        "lost": 0,
    }
    result["met"] = ratio is not None and ratio <= 2.0
    result["table"] = [(f"claim us/delivery, {s['size']:,} pending", s["claim_us_per_delivery"], "report")
                       for s in steps]
    result["table"].append(("claim cost 1M / 10k", ratio, "<= 2"))
    pg = after.get("pgstattuple", {})
    result["table"].append(("dead tuples after drain", pg.get("dead_tuples"), "report"))
    result["table"].append(("VACUUM of that outbox, s", after.get("vacuum", {}).get("vacuum_seconds"), "report"))
    return result
