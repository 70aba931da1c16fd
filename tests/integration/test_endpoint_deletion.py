"""Deleting an endpoint leaves no row that no one can ever deliver or see.

The demo re-seeds its workspace on every run by deleting the old endpoints;
their pending rows stayed pending forever (12,665 after four runs) and their
open breakers stayed in ``status``.  Deletion, one endpoint or a workspace's
all, ends the pending rows not in flight as failed ``endpoint deleted``, each
with a history entry, and takes the breaker with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatcher import store
from dispatcher.config import load_config
from dispatcher.producer import Event, WebhookSender
from dispatcher.rules.retry import ENDPOINT_DELETED
from dispatcher.signing import new_secret
from dispatcher.store import endpoints as endpoint_store
from tests.conftest import TestDatabase as Database


def _world(db: Database, config_path: Path, conn: store.Connection) -> tuple[int, int]:
    """Workspace w with two endpoints, three pending rows each (one leased to a worker), and an open breaker."""
    store.create_workspace(conn, "w", new_secret(), {"webhook_outbox": True})
    first = store.add_endpoint(conn, "w", "http://127.0.0.1:9/a", [], new_secret())
    second = store.add_endpoint(conn, "w", "http://127.0.0.1:9/b", [], new_secret())
    sender = WebhookSender(load_config(config_path))
    with sender.transaction(conn) as tx:
        for n in range(3):
            tx.send(Event("w", "job.completed", {"n": n}))
    db.query("UPDATE webhook_deliveries SET locked_by = 'w1', locked_until = now() + interval '1 hour', "
             "claim_token = 7 WHERE id IN (SELECT max(id) FROM webhook_deliveries GROUP BY endpoint_id) RETURNING id")
    db.query("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at) "
             "VALUES (%s, 'open', 5, now() + interval '1 minute', now()) RETURNING endpoint_id", (first,))
    return first, second


def _rows(db: Database, endpoint_id: int) -> list[tuple[Any, ...]]:
    return db.query("SELECT d.status, d.last_error, d.locked_until IS NOT NULL, "
                    "       (SELECT array_agg(a.result || ':' || a.error) FROM webhook_delivery_attempts a "
                    "         WHERE a.delivery_id = d.id) "
                    "  FROM webhook_deliveries d WHERE d.endpoint_id = %s ORDER BY d.id", (endpoint_id,))


ENDED = ("failed", ENDPOINT_DELETED, False, [f"failed:{ENDPOINT_DELETED}"])
IN_FLIGHT = ("pending", None, True, None)  # a request may be on the wire: the engine ends it, with its history


def test_deleting_a_workspaces_endpoints_ends_their_pending_rows(db: Database, write_config) -> None:  # type: ignore[no-untyped-def]
    conn = store.connect(db.dsn)
    try:
        first, second = _world(db, write_config(db), conn)
        assert store.delete_workspace_endpoints(conn, "w") == [first, second]
    finally:
        conn.close()
    for endpoint_id in (first, second):
        assert _rows(db, endpoint_id) == [ENDED, ENDED, IN_FLIGHT]
    assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]
    assert db.query("SELECT count(*) FROM endpoint_state") == [(0,)], "a deleted endpoint's breaker stays open"
    assert db.query("SELECT action, endpoint_id FROM api_audit ORDER BY id") == [
        ("endpoint.create", first), ("endpoint.create", second),
        ("endpoint.delete", first), ("endpoint.delete", second)]


def test_deleting_one_endpoint_writes_each_ended_rows_history(db: Database, write_config) -> None:  # type: ignore[no-untyped-def]
    conn = store.connect(db.dsn)
    try:
        first, second = _world(db, write_config(db), conn)
        endpoint_store.delete_endpoint(conn, "w", first, token_id=None)
    finally:
        conn.close()
    assert _rows(db, first) == [ENDED, ENDED, IN_FLIGHT]
    assert [row[0] for row in _rows(db, second)] == ["pending"] * 3
    assert db.query("SELECT endpoint_id FROM endpoint_state") == []


def _pause(conn: store.Connection, endpoint_id: int) -> None:
    change = endpoint_store.pause_endpoint(conn, "w", endpoint_id, "operator", token_id=None)
    assert change.rows == 2, "the pause held the two rows not in flight"


def test_a_confirmed_delete_ends_held_rows_with_their_history(db: Database, write_config) -> None:  # type: ignore[no-untyped-def]
    conn = store.connect(db.dsn)
    try:
        first, second = _world(db, write_config(db), conn)
        _pause(conn, first)
        try:
            endpoint_store.delete_endpoint(conn, "w", first, token_id=None)
            raise AssertionError("deleting a paused endpoint that holds rows needs a confirmation")
        except endpoint_store.HeldRowsUnconfirmed:
            pass
        assert [row[0] for row in _rows(db, first)] == ["held", "held", "pending"], "nothing changed"
        endpoint_store.delete_endpoint(conn, "w", first, token_id=None, confirm_held=True)
    finally:
        conn.close()
    assert _rows(db, first) == [ENDED, ENDED, IN_FLIGHT]
    assert db.query("SELECT action, detail->>'held_ended' FROM api_audit WHERE endpoint_id = %s ORDER BY id",
                    (first,)) == [("endpoint.create", None), ("endpoint.pause", None), ("endpoint.delete", "2")]


def test_deleting_a_workspaces_endpoints_ends_held_rows_too(db: Database, write_config) -> None:  # type: ignore[no-untyped-def]
    conn = store.connect(db.dsn)
    try:
        first, second = _world(db, write_config(db), conn)
        _pause(conn, second)
        assert store.delete_workspace_endpoints(conn, "w") == [first, second]
    finally:
        conn.close()
    for endpoint_id in (first, second):
        assert _rows(db, endpoint_id) == [ENDED, ENDED, IN_FLIGHT]
