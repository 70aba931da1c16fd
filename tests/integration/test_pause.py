"""Lossless pause and resume (issue 24, section 1) and the lifecycle that pauses by itself (section 2),
against a real Postgres: the producer's function, the claim, the result write, the upkeep's held
sweeps, the API and the notices round.  Times are compressed by moving stored timestamps back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from typing import Any

import falcon.testing
import pytest

from dispatcher.api.app import create_app
from dispatcher.config import config_from_mapping, load_config
from dispatcher.engine.notifier import OwnerNotices
from dispatcher.rules.breaker import BreakerBatch, BreakerPolicy, BreakerSignal, Signal
from dispatcher.rules.retry import HELD_EXPIRED
from dispatcher.store import connect
from dispatcher.store import endpoints as endpoint_store
from dispatcher.store.engine import AttemptRecord, ClaimedRow, EngineStore, ManagedConnection
from dispatcher.store.notices import NoticeStore
from dispatcher_devtools.kit import config_for_test, query, seed_workspace
from tests.integration.test_api import World, assert_problem, bearer
from tests.support.smtp import smtp_server

pytestmark = pytest.mark.timeout(60)


def _engine(db: Any) -> EngineStore:
    return EngineStore(ManagedConnection(db.dsn, "test"))


def _send(db: Any, event_id: str, workspace: str = "ws") -> int:
    """The producer's one statement (dispatcher_send_event, migration 0020); returns deliveries written."""
    rows = query(db.dsn, "SELECT deliveries FROM dispatcher_send_event(%s, %s, 't', NULL, '{}'::jsonb, 'h', "
                         "false, 0)", (workspace, event_id))
    return int(rows[0][0])


def _statuses(db: Any, endpoint_id: int) -> dict[str, int]:
    return dict(query(db.dsn, "SELECT status, count(*) FROM webhook_deliveries WHERE endpoint_id = %s "
                              "GROUP BY status", (endpoint_id,)))


def _pause(db: Any, endpoint_id: int, cause: str = "operator") -> endpoint_store.PauseChange:
    with closing(connect(db.dsn)) as conn:
        return endpoint_store.pause_endpoint(conn, None, endpoint_id, cause, token_id=None)


def _resume(db: Any, endpoint_id: int) -> endpoint_store.PauseChange:
    with closing(connect(db.dsn)) as conn:
        return endpoint_store.resume_endpoint(conn, None, endpoint_id, token_id=None)


def _retry(row: ClaimedRow) -> AttemptRecord:
    return AttemptRecord(row.id, row.claim_token, row.endpoint_id, "pending", row.attempt, 60.0, "HTTP 500", 500,
                         "http_5xx", time.monotonic(), 5, "")


def test_a_paused_endpoint_holds_new_and_pending_rows_and_none_is_claimed(db) -> None:
    paused, other = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/p", "http://127.0.0.1:9/o"])
    for n in range(3):
        _send(db, f"before-{n}")
    engine = _engine(db)
    (in_flight,) = [r for r in engine.claim("w", 100, 1, [], 0, 30.0) if r.endpoint_id == paused]
    change = _pause(db, paused)
    assert change.changed and change.cause == "operator"
    assert change.rows == 2, "the row leased to a worker is its worker's"
    assert _send(db, "during") == 2, "the event is still written for both endpoints"
    assert _statuses(db, paused) == {"held": 3, "pending": 1}
    assert _statuses(db, other) == {"pending": 4}, "the other endpoint's are not touched"
    # The in-flight attempt fails: its retry is held, not pending.
    engine.record([_retry(in_flight)], [])
    assert _statuses(db, paused) == {"held": 4}
    claimed = engine.claim("w", 100, 4, [], 0, 30.0)
    assert {r.endpoint_id for r in claimed} == {other}
    assert query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts WHERE endpoint_id = %s", (paused,)) == [(1,)]


def test_a_straggler_written_pending_after_the_pause_is_neither_claimed_nor_kept_pending(db) -> None:
    (paused,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/p"])
    _pause(db, paused)
    # As a producer whose statement ran before the pause committed would have written it.
    _send(db, "e1")
    query(db.dsn, "UPDATE webhook_deliveries SET status = 'pending'")
    engine = _engine(db)
    assert engine.claim("w", 100, 4, [], 0, 30.0) == []
    assert engine.hold_stragglers() == 1
    assert _statuses(db, paused) == {"held": 1}


def test_resume_releases_in_order_and_the_retry_window_did_not_run_while_paused(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/p"])
    _send(db, "old")
    _pause(db, endpoint)
    _send(db, "new")
    # Compressed clock: the row was written 5 h ago, the pause began 4 h ago, "new" 1 h ago.
    query(db.dsn, "UPDATE webhook_endpoints SET paused_at = now() - interval '4 hours'")
    query(db.dsn, "UPDATE webhook_deliveries SET created_at = now() - interval '5 hours', "
                  "next_attempt_at = now() - interval '5 hours' WHERE event_id = 'old'")
    query(db.dsn, "UPDATE webhook_deliveries SET created_at = now() - interval '1 hour', "
                  "next_attempt_at = now() - interval '1 hour' WHERE event_id = 'new'")
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until) "
                  "VALUES (%s, 'open', 20, now() + interval '1 hour')", (endpoint,))
    change = _resume(db, endpoint)
    assert change.changed and change.rows == 2 and change.cause == "operator"
    assert query(db.dsn, "SELECT state FROM endpoint_state") == [("closed",)], "a resume is a fresh start"
    first = _engine(db).claim("w", 100, 1, [], 0, 30.0)
    assert [r.event_id for r in first] == ["old"], "oldest first"
    second = _engine(db).claim("w", 100, 2, [], 0, 30.0)
    assert [r.event_id for r in second] == ["new"]
    ages = {r.event_id: r.age for r in first + second}
    assert 3500 < ages["old"] < 3700, "5 h old, 4 h of it held: 1 h of its retry window spent"
    assert ages["new"] < 60, "written while paused: none of its window spent"
    assert _resume(db, endpoint).changed is False


def test_held_rows_end_dead_after_hold_for_and_younger_ones_stay(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/p"])
    _pause(db, endpoint)
    _send(db, "old")
    _send(db, "young")
    query(db.dsn, "UPDATE webhook_endpoints SET paused_at = now() - interval '8 days'")
    query(db.dsn, "UPDATE webhook_deliveries SET created_at = now() - interval '8 days' WHERE event_id = 'old'")
    assert _engine(db).expire_held(7 * 86400.0, 100) == 1
    assert query(db.dsn, "SELECT event_id, status, last_error FROM webhook_deliveries ORDER BY event_id") == [
        ("old", "dead", HELD_EXPIRED), ("young", "held", None)]
    assert _engine(db).held_figures() == (1, 1)


@pytest.fixture
def api(db: Any, write_config: Any) -> Iterator[tuple[World, falcon.testing.TestClient]]:
    """Rows seeded with SQL (test_api's World) and an in-process client of the API."""
    world = World(db)
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    yield world, falcon.testing.TestClient(app)
    app.pool.close()
    world.conn.close()


def test_deleting_a_paused_endpoint_asks_for_confirmation_and_is_audited(api: Any) -> None:
    world, client = api
    ws = world.workspace("ws")
    endpoint = world.endpoint(ws)
    world.delivery(ws, endpoint, world.event(ws, "e1"))
    token = world.token(ws)
    paused = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/pause", headers=bearer(token))
    assert paused.status_code == 200, paused.text
    assert paused.json["paused"]["cause"] == "customer" and paused.json["lifecycle"]["stage"] == "paused"
    # World's row is leased (by 'worker-7', no deadline: lapsed), so the pause held it.
    assert paused.json["held"]["count"] == 1
    listed = client.simulate_get("/v2/webhooks/deliveries", query_string="status=held", headers=bearer(token))
    assert [d["status"] for d in listed.json["data"]] == ["held"]
    refused = assert_problem(client.simulate_delete(f"/v2/webhooks/endpoints/{endpoint}", headers=bearer(token)),
                             409)
    assert "holds 1" in refused["detail"] and "confirm=held" in refused["detail"]
    assert world.count("status = 'held'") == 1, "nothing changed"
    assert_problem(client.simulate_delete(f"/v2/webhooks/endpoints/{endpoint}", query_string="confirm=yes",
                                          headers=bearer(token)), 400)
    done = client.simulate_delete(f"/v2/webhooks/endpoints/{endpoint}", query_string="confirm=held",
                                  headers=bearer(token))
    assert done.status_code == 204, done.text
    assert world.count("status = 'failed'") == 1
    assert world.sql("SELECT action, detail->>'held_ended' FROM api_audit ORDER BY id") == [
        ("endpoint.pause", None), ("endpoint.delete", "1")]


def test_resume_through_the_api_shows_the_endpoint_pending_again(api: Any) -> None:
    world, client = api
    ws = world.workspace("ws")
    endpoint = world.endpoint(ws)
    token = world.token(ws)
    client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/pause", headers=bearer(token))
    world.delivery(ws, endpoint, world.event(ws, "e1"), status="held")
    resumed = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/resume", headers=bearer(token))
    assert resumed.status_code == 200, resumed.text
    assert resumed.json["paused"] == {"paused": False, "paused_at": None, "cause": None}
    assert resumed.json["pending"]["count"] == 1 and resumed.json["held"]["count"] == 0
    assert [a for (a,) in world.sql("SELECT action FROM api_audit ORDER BY id")] == ["endpoint.pause",
                                                                                     "endpoint.resume"]


# ---------------------------------------------------------------- the lifecycle pauses by itself

POLICY = BreakerPolicy(failure_threshold=3, open_for=60.0)


def _open(db: Any, endpoint_id: int) -> None:
    batch = BreakerBatch(POLICY, [Signal(endpoint_id, BreakerSignal.FAILURE, "HTTP 500")] * 3)
    _engine(db).update_breakers([endpoint_id], batch)


def test_the_lifecycle_warns_pauses_losslessly_and_tells_each_stage_once(db) -> None:
    endpoint, other = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a", "https://b.example.com/"])
    for n in range(3):
        _send(db, f"e{n}")
    with smtp_server() as smtp:
        raw = config_for_test(db.dsn, notifier={"kind": "smtp", "smtp_host": "127.0.0.1", "smtp_port": smtp.port,
                                                "smtp_security": "none", "smtp_to": "ops@example.com",
                                                "smtp_timeout": "5s"})
        notices = OwnerNotices(config_from_mapping(raw, env={}), NoticeStore(ManagedConnection(db.dsn, "n")))

        def rounds(ago: timedelta | None = None) -> list[str]:
            if ago is not None:  # the episode began this long ago
                query(db.dsn, "UPDATE endpoint_lifecycle SET failing_since = now() - %s", (ago,))
            before = len(smtp.received())
            for _ in range(3):
                notices.run_once()
            return [m.subject for m in smtp.received()[before:]]

        _open(db, endpoint)
        assert rounds() == [f"Webhook endpoint {endpoint} is failing; its deliveries wait"]
        assert rounds(timedelta(days=1)) == []
        (warning,) = rounds(timedelta(days=2, minutes=1))
        assert warning.startswith(f"Webhook endpoint {endpoint} will be paused at ")
        assert _statuses(db, endpoint) == {"pending": 3}
        assert rounds(timedelta(days=3, minutes=1)) == [f"Webhook endpoint {endpoint} is paused; its events are held"]
        assert _statuses(db, endpoint) == {"held": 3}, "paused losslessly"
        assert query(db.dsn, "SELECT pause_cause FROM webhook_endpoints WHERE id = %s", (endpoint,)) == [("lifecycle",)]
        assert query(db.dsn, "SELECT action, detail->>'cause' FROM api_audit") == [("endpoint.pause", "lifecycle")]
        assert rounds(timedelta(days=4)) == [], "each stage once"
        _resume(db, endpoint)
        assert rounds() == [f"Webhook endpoint {endpoint} recovered"]
        assert rounds() == []
    assert _statuses(db, endpoint) == {"pending": 3} and _statuses(db, other) == {"pending": 3}
    assert query(db.dsn, "SELECT kind FROM breaker_notices ORDER BY created_at, kind") == [
        ("opened",), ("will_pause",), ("paused",), ("recovered",)]


def test_held_rows_of_an_endpoint_no_longer_paused_are_released(db) -> None:
    """A producer that read the endpoint paused commits after the resume; an endpoint deleted by SQL."""
    resumed, gone, paused = seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/{n}" for n in range(3)])
    for endpoint in (resumed, gone, paused):
        _pause(db, endpoint)
    _send(db, "e1")
    _resume(db, resumed)
    query(db.dsn, "UPDATE webhook_deliveries SET status = 'held' WHERE endpoint_id = %s", (resumed,))
    query(db.dsn, "DELETE FROM webhook_endpoints WHERE id = %s", (gone,))
    assert _engine(db).release_unpaused() == 2
    assert [_statuses(db, e) for e in (resumed, gone, paused)] == [{"pending": 1}, {"pending": 1}, {"held": 1}]
