"""The due index keeps one entry per delivery (migration 0030): its entries are never merged into
posting lists, so the entries of delivered rows are marked dead by the first scan that passes them.

A burst committed in one transaction (a producer's batch, a bulk replay, a backlog) gives an
endpoint's rows one due time, so their keys in ``webhook_deliveries_due`` are all equal.  Postgres
merges equal keys into posting lists (``deduplicate_items``), and a posting list is marked dead
only once every row in it is: while an endpoint's lane drains the burst, the list at its frontier
holds delivered and pending rows, and every claim's walk read each delivered row's heap tuple
again, hundreds of pages per step (docs/benchmarks.md, "Merged index entries")."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2

from dispatcher_devtools.kit import query, seed_workspace
from tests.conftest import TestDatabase as Database

ENDPOINTS = 10
BURST = 1000      # events, each to every endpoint
ROUND = 100       # the first endpoint's rows delivered between two looks, as a lane drains them
ROUNDS = 8
# Once the first scan of a round has marked the round's delivered rows dead, a scan reads a few
# index pages and the first pending row's heap page (15-17 pages measured); where they stay in a
# posting list with pending rows, it reads a heap page for every two of them (29-91 a round).
PAGES_A_LOOK = 25
LOOKS = 40

DUE_SCAN = ("SELECT id FROM webhook_deliveries WHERE endpoint_id = %(endpoint)s AND status = 'pending' "
            "ORDER BY next_attempt_at LIMIT %(rows)s")


def _burst(dsn: str) -> None:
    """BURST events and their deliveries to every endpoint of the workspace, in one transaction: one
    due time.  An endpoint's rows are then spread over the heap, a few to a page, as in a real outbox."""
    query(dsn, """
        WITH e AS (
            INSERT INTO events (id, workspace_id, type, sequence, payload)
            SELECT 'evt-' || g, 'ws', 'job.created', g, '{}'::jsonb FROM generate_series(1, %(n)s) g
            RETURNING id, workspace_id, day, sequence)
        INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, next_attempt_at, event_day)
        SELECT e.workspace_id, p.id, e.id, md5(e.id), now(), e.day
          FROM e JOIN webhook_endpoints p ON p.workspace_id = e.workspace_id ORDER BY e.sequence, p.id""",
          {"n": BURST})


@contextmanager
def _due_index_cursor(dsn: str) -> Iterator[Any]:
    """A cursor in a transaction of its own whose scans by endpoint go through the due index."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("SET LOCAL enable_bitmapscan = off")
            yield cur
    finally:
        conn.close()


def _deliver_oldest(dsn: str, endpoint_id: int) -> None:
    """Deliver the first ROUND pending rows in the due index's order, as the engine's lane does."""
    with _due_index_cursor(dsn) as cur:
        cur.execute(DUE_SCAN, {"endpoint": endpoint_id, "rows": ROUND})
        ids = [row[0] for row in cur.fetchall()]
        cur.execute("UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), "
                    "finished_at = now() WHERE id = ANY (%s)", (ids,))


def _due_scan_pages(dsn: str, endpoint_id: int) -> int:
    """Shared buffers one due scan of the endpoint (its first pending row) hits."""
    with _due_index_cursor(dsn) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + DUE_SCAN, {"endpoint": endpoint_id, "rows": 1})
        plan: dict[str, Any] = cur.fetchone()[0][0]["Plan"]
    assert "next_attempt_at_idx" in str(plan), plan  # a partition's due index
    return int(plan["Shared Hit Blocks"]) + int(plan.get("Shared Read Blocks", 0))


def _settled_scan_pages(dsn: str, endpoint_id: int) -> int:
    """The fewest pages a due scan hits once the scans before it have marked what they could.

    A scan marks an entry dead only once its row is dead to every transaction of the server's
    horizon, which another test's transaction (of another database, while it connects) can hold
    back for a moment: so look again, a little later, until the scan is down to a few pages or
    LOOKS looks have found no fewer."""
    fewest = _due_scan_pages(dsn, endpoint_id)
    for _ in range(LOOKS):
        if fewest <= PAGES_A_LOOK:
            break
        time.sleep(0.05)
        fewest = min(fewest, _due_scan_pages(dsn, endpoint_id))
    return fewest


def test_a_draining_burst_is_passed_over_by_index_pages_not_heap_pages(db: Database) -> None:
    endpoint_id, *_ = seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/ok/{n}" for n in range(ENDPOINTS)])
    # Nothing but the scans below may clean the rows up.
    for (part,) in query(db.dsn, "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c "
                                 "ON c.oid = i.inhrelid WHERE i.inhparent = 'webhook_deliveries'::regclass"):
        query(db.dsn, f"ALTER TABLE {part} SET (autovacuum_enabled = off)")
    _burst(db.dsn)
    looks = []
    for _ in range(ROUNDS):
        _deliver_oldest(db.dsn, endpoint_id)
        looks.append(_settled_scan_pages(db.dsn, endpoint_id))
    assert sum(looks) <= ROUNDS * PAGES_A_LOOK, (
        f"due scans past delivered rows hit {looks} pages: their index entries were not marked dead "
        "(merged into posting lists with pending rows?)")


def _due_index_options(dsn: str) -> dict[str, list[str] | None]:
    """Each partition's due index (the leaves of webhook_deliveries_due) and its storage options."""
    return dict(query(dsn, "SELECT x.indrelid::regclass::text, c.reloptions FROM pg_inherits i "
                           "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_index x ON x.indexrelid = c.oid "
                           "WHERE i.inhparent = 'webhook_deliveries_due'::regclass"))


def test_every_partition_of_the_outbox_keeps_due_entries_apart(db: Database) -> None:
    ahead = query(db.dsn, "SELECT dispatcher_today()")[0][0] + datetime.timedelta(days=30)
    made = query(db.dsn, "SELECT dispatcher_create_partition('webhook_deliveries', %s)", (ahead,))[0][0]
    options = _due_index_options(db.dsn)
    assert made in options, options
    assert "webhook_deliveries_default" in options, options
    merged = {part: found for part, found in options.items() if "deduplicate_items=off" not in (found or [])}
    assert not merged, f"due indexes that merge equal keys into posting lists: {merged}"
