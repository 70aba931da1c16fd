"""The wake read (``engine_wake_mark``; ``rules.wake``) against a real Postgres: it counts the ids
handed out, and it lists every transaction in progress, the newest too."""

from __future__ import annotations

import psycopg2

from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace


def _mark(db):  # type: ignore[no-untyped-def]
    return EngineStore(ManagedConnection(db.dsn, "test")).wake_mark()


def _insert(cur, endpoint: int) -> None:  # type: ignore[no-untyped-def]
    cur.execute("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                "VALUES ('ws', %s, 'ev', 'h')", (endpoint,))


def test_the_first_row_moves_the_mark(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    before = _mark(db).last_id
    conn = psycopg2.connect(db.dsn)
    try:
        with conn.cursor() as cur:
            _insert(cur, endpoint)
        conn.commit()
    finally:
        conn.close()
    assert _mark(db).last_id == before + 1
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries") == [(1,)]


def test_an_open_producer_transaction_is_in_progress_until_it_ends(db) -> None:
    """The newest transaction is past every completed one's id: the snapshot's list of
    transactions in progress would leave it out; the mark must not."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    conn = psycopg2.connect(db.dsn)
    try:
        with conn.cursor() as cur:
            _insert(cur, endpoint)
            cur.execute("SELECT pg_current_xact_id()::text::bigint")
            (xid,) = cur.fetchone()
        assert xid in _mark(db).in_progress
        conn.commit()
    finally:
        conn.close()
    assert xid not in _mark(db).in_progress
