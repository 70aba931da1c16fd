"""Shadow rows are never deliveries (docs/decisions.md, Shadow rows): a shadow row the dispatcher marks
ends ``shadow``, its history entry's result is ``shadow``, and nothing that counts deliveries or failures
counts it -- the API's history and filters, ``dispatcher status``, the migration of rows marked before.

A real Postgres, the real claim and result write, rows written by the producer's own statement.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import falcon.testing
import psycopg2
import pytest

from dispatcher import Event, WebhookSender, load_config, store
from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.cli.status import status_document, thresholds
from dispatcher.engine.delivery import DeliveryMaker
from dispatcher.rules.attempt import TransportResult
from dispatcher.rules.health import Severity, Verdict
from dispatcher.rules.retry import RetryPolicies
from dispatcher.signing import new_secret
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher.store.operations import region_status
from tests.conftest import TestDatabase as Database
from tests.integration.test_api import World, bearer


class _MustNotSend:
    """A shadow row is never sent: a call fails the test."""

    def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> TransportResult:
        raise AssertionError(f"{url} must not be sent to")

    def close(self) -> None:
        pass


def _shadow_rows(db: Database, write_config: Any, events: int) -> list[str]:
    """Flag-off events sent with shadow writes on, as phase 0's producers send them."""
    admin = db.connect()
    try:
        store.create_workspace(admin, "ws", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=", {"webhook_outbox": False})
        store.add_endpoint(admin, "ws", "http://127.0.0.1:9/hook", [], new_secret())
    finally:
        admin.close()
    sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=True), env={}))
    conn = psycopg2.connect(db.dsn)
    try:
        with sender.transaction(conn) as tx:
            return [tx.send(Event("ws", "job.created", {"n": n})).id for n in range(events)]
    finally:
        conn.close()


def test_the_engine_marks_a_shadow_row_shadow_not_delivered(db: Database, write_config: Any) -> None:
    _shadow_rows(db, write_config, 1)
    engine = EngineStore(ManagedConnection(db.dsn, "test"))
    (row,) = engine.claim("w", 10, 4, [], 0, 30.0)
    assert row.mode == "shadow"
    attempt = DeliveryMaker(_MustNotSend(), RetryPolicies()).attempt(row, time.monotonic())  # type: ignore[arg-type]
    assert (attempt.record.status, attempt.record.result, attempt.record.status_code) == ("shadow", "shadow", None)
    assert attempt.latency is None and attempt.commit_to_2xx is None, "no latency sample: nothing was sent"
    assert engine.record([attempt.record]) == {row.id}
    assert db.query("SELECT status, delivered_at, finished_at IS NOT NULL FROM webhook_deliveries") == [
        ("shadow", None, True)]
    assert db.query("SELECT result, status_code FROM webhook_delivery_attempts") == [("shadow", None)]


def test_a_live_row_can_never_be_marked_shadow_nor_a_shadow_row_delivered(world: World) -> None:
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)
    live = world.delivery(ws, endpoint, world.event(ws, "e1"))
    shadow = world.delivery(ws, endpoint, world.event(ws, "e2"), mode="shadow")
    for row, status in ((live, "shadow"), (shadow, "delivered")):
        with pytest.raises(psycopg2.errors.CheckViolation):
            world.sql("UPDATE webhook_deliveries SET status = %s WHERE id = %s", (status, row))


@pytest.fixture
def client(db: Database, write_config: Any) -> Iterator[falcon.testing.TestClient]:
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    yield falcon.testing.TestClient(app)
    app.pool.close()


def test_the_history_shows_a_shadow_row_as_shadow_not_sent(world: World, client: falcon.testing.TestClient) -> None:
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)
    delivered = world.delivery(ws, endpoint, world.event(ws, "e_live"), "delivered", attempt=1)
    world.attempt(delivered, endpoint, 1, "delivered", 200)
    shadow = world.delivery(ws, endpoint, world.event(ws, "e_shadow"), "shadow", attempt=1, mode="shadow")
    world.attempt(shadow, endpoint, 1, "shadow", None, duration_ms=0)
    headers = bearer(world.token(ws, auth.READ))

    one = client.simulate_get(f"/v2/webhooks/deliveries/{shadow}", headers=headers).json
    assert (one["status"], one["mode"], one["delivered_at"]) == ("shadow", "shadow", None)
    assert [(a["result"], a["status_code"]) for a in one["attempts"]] == [("shadow", None)]

    def listed(status: str) -> list[int]:
        result = client.simulate_get("/v2/webhooks/deliveries", query_string=f"status={status}", headers=headers)
        assert result.status_code == 200, result.text
        return [d["id"] for d in result.json["data"]]

    assert (listed("delivered"), listed("shadow")) == ([delivered], [shadow])
    overview = client.simulate_get(f"/v2/webhooks/endpoints/{endpoint}", headers=headers).json
    assert overview["success_rate_24h"] == {"attempts": 1, "delivered": 1, "rate": 1.0}


def test_status_counts_shadow_rows_apart_and_never_as_failures(db: Database, world: World,
                                                                write_config: Any) -> None:
    ws = world.workspace("acme")
    endpoint, failing = world.endpoint(ws), world.endpoint(ws, "https://failing.example.test/")
    delivered = world.delivery(ws, endpoint, world.event(ws, "e_live"), "delivered", attempt=1)
    world.attempt(delivered, endpoint, 1, "delivered", 200)
    for n in range(2):
        shadow = world.delivery(ws, endpoint, world.event(ws, f"e_shadow{n}"), "shadow", attempt=1, mode="shadow")
        world.attempt(shadow, endpoint, 1, "shadow", None, duration_ms=0)
    dead = world.delivery(ws, failing, world.event(ws, "e_dead"), "dead", attempt=1, age=timedelta(minutes=5))
    world.attempt(dead, failing, 1, "http_5xx", 503)
    config = load_config(write_config(db), env={})
    conn = db.connect()
    try:
        raw = region_status(conn, thresholds(config))
    finally:
        conn.close()
    document = status_document(config, raw, Verdict(Severity.OK, ()))
    assert document["statuses"]["last_hour"] == {"pending": 0, "delivered": 1, "failed": 0, "dead": 1,
                                                 "shadow": 2}
    assert [(t["endpoint_id"], t["failures"]) for t in document["top_failing"]] == [(failing, 1)]


def test_the_migration_turns_rows_marked_delivered_into_shadow_rows(empty_db: Database) -> None:
    """Rows a dispatcher marked before 0015 (status delivered, result delivered) become what they are."""
    conn = empty_db.connect()
    try:
        real = store.migrations()
        with conn, conn.cursor() as cur:  # up to 0014 by hand, as the previous release did
            cur.execute(store.QUERIES["migrations_table"])
            for migration in real:
                if migration.version < 15:
                    cur.execute(migration.sql)
                    cur.execute(store.QUERIES["record_migration"],
                                {"version": migration.version, "name": migration.name})
            cur.execute("INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                        "status, mode, attempt, delivered_at, finished_at) VALUES "
                        "(1, 'w', 1, 'e1', 'h', 'delivered', 'shadow', 1, now(), now()), "
                        "(2, 'w', 1, 'e2', 'h', 'delivered', 'live', 1, now(), now())")
            cur.execute("INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                        "duration_ms, result, status_code) VALUES (1, 1, 1, now(), 0, 'delivered', NULL), "
                        "(2, 1, 1, now(), 40, 'delivered', 200)")
        assert 15 in store.migrate(conn)
    finally:
        conn.close()
    assert empty_db.query("SELECT id, status, delivered_at IS NULL, finished_at IS NOT NULL "
                          "FROM webhook_deliveries ORDER BY id") == [(1, "shadow", True, True),
                                                                     (2, "delivered", False, True)]
    assert empty_db.query("SELECT delivery_id, result FROM webhook_delivery_attempts ORDER BY delivery_id") == [
        (1, "shadow"), (2, "delivered")]


@pytest.fixture
def world(db: Database) -> Iterator[World]:
    w = World(db)
    yield w
    w.conn.close()
