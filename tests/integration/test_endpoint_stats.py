"""GET /v2/webhooks/endpoints/stats (issue 12, section 5): the console overview's
success-rate sparkline and p95, per endpoint, in time buckets, against a real Postgres.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import falcon.testing
import pytest

from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.config import load_config
from dispatcher.engine.delivery import DeliveryMaker
from dispatcher.rules.attempt import TransportResult
from dispatcher.rules.breaker import BreakerSignal
from dispatcher.rules.retry import Outcome, RetryPolicies, RetryPolicy, classify, terminal
from dispatcher.store.engine import ClaimedRow
from tests.integration import test_api
from tests.integration.test_api import World, assert_problem, bearer

STATS = "/v2/webhooks/endpoints/stats"
HALF_HOUR = timedelta(minutes=30)
Client = falcon.testing.TestClient


world = test_api.world  # the same seeded world as the API tests


@pytest.fixture
def client(db: Any, write_config: Any) -> Iterator[Client]:
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    yield falcon.testing.TestClient(app)
    app.pool.close()


def _stats(client: Client, token: str, query: str = "") -> dict[str, Any]:
    result = client.simulate_get(STATS, query_string=query, headers=bearer(token))
    assert result.status_code == 200, result.text
    return result.json  # type: ignore[no-any-return]


def test_every_endpoint_gets_its_totals_and_buckets_of_sent_attempts(world: World, client: Client) -> None:
    ws, other = world.workspace("acme"), world.workspace("globex")
    busy = world.endpoint(ws, "https://hooks.example.test/busy")
    idle = world.endpoint(ws, "https://hooks.example.test/idle", active=False)
    theirs = world.endpoint(other)
    row = world.delivery(ws, busy, world.event(ws, "evt_1"))
    # The last hour (bucket 23 of 24): 19 answered 2xx, one 503.
    for n in range(18):
        world.attempt(row, busy, n + 1, "delivered", 200, duration_ms=100, ago=HALF_HOUR)
    world.attempt(row, busy, 19, "delivered", 204, duration_ms=300, ago=HALF_HOUR)
    world.attempt(row, busy, 20, "http_5xx", 503, duration_ms=5000, ago=HALF_HOUR)
    # The first hour of the window (bucket 0): a timeout.
    world.attempt(row, busy, 21, "timeout", None, duration_ms=10000, ago=timedelta(hours=23, minutes=30))
    # Not counted: older than the window, a shadow row, a blocked URL, a row that could never be sent.
    world.attempt(row, busy, 22, "delivered", 200, ago=timedelta(hours=25))
    world.attempt(row, busy, 23, "delivered", None, duration_ms=0, ago=HALF_HOUR)
    world.attempt(row, busy, 24, "blocked", None, duration_ms=1, ago=HALF_HOUR)
    world.attempt(row, busy, 25, "failed", None, duration_ms=0, ago=HALF_HOUR)
    world.attempt(world.delivery(other, theirs, world.event(other, "evt_2")), theirs, 1, "delivered", 200,
                  ago=HALF_HOUR)

    body = _stats(client, world.token(ws, auth.READ))
    until, since = datetime.fromisoformat(body["until"]), datetime.fromisoformat(body["since"])
    assert abs(until - datetime.now(UTC)) < timedelta(minutes=1) and until - since == timedelta(hours=24)
    assert body["window_seconds"] == 86400 and body["bucket_seconds"] == 3600
    # Newest first, and not another workspace's.
    assert [e["endpoint_id"] for e in body["data"]] == sorted([busy, idle], reverse=True)
    first, second = sorted(body["data"], key=lambda e: e["endpoint_id"] != busy)
    # percentile_disc: an observed duration, the 20th of 21 sorted values.
    assert {k: first[k] for k in ("attempts", "succeeded", "success_rate", "p95_ms")} == {
        "attempts": 21, "succeeded": 19, "success_rate": 0.9048, "p95_ms": 5000}
    assert len(first["buckets"]) == 24
    assert first["buckets"][23] == {"start": (since + timedelta(hours=23)).isoformat(), "attempts": 20,
                                    "succeeded": 19, "success_rate": 0.95, "p95_ms": 300}
    assert first["buckets"][0] == {"start": since.isoformat(), "attempts": 1, "succeeded": 0,
                                   "success_rate": 0.0, "p95_ms": 10000}
    assert all(b["attempts"] == 0 and b["success_rate"] is None for b in first["buckets"][1:23])
    # An endpoint without attempts (here an inactive one) is listed with zeros.
    assert second["attempts"] == 0 and second["success_rate"] is None and second["p95_ms"] is None
    assert len(second["buckets"]) == 24

    short = _stats(client, world.token(ws, auth.READ), "window=100m&buckets=4")
    assert short["bucket_seconds"] == 1500 and short["window_seconds"] == 6000
    busy_short = next(e for e in short["data"] if e["endpoint_id"] == busy)
    assert [b["attempts"] for b in busy_short["buckets"]] == [0, 0, 20, 0]


def test_bad_windows_and_bucket_counts_are_400_problems(world: World, client: Client) -> None:
    ws = world.workspace("acme")
    token = world.token(ws, auth.READ)
    for query in ("window=0h", "window=59m", "window=8d", "window=169h", "window=24", "window=1.5h",
                  "window=24h&window=1h", "buckets=0", "buckets=97", "buckets=x", "windows=24h"):
        body = assert_problem(client.simulate_get(STATS, query_string=query, headers=bearer(token)), 400)
        assert body["type"] == "urn:dispatcher:problem:bad-request", query
    for query in ("window=1h&buckets=96", "window=7d", "window=60m&buckets=1"):
        assert client.simulate_get(STATS, query_string=query, headers=bearer(token)).status_code == 200, query
    assert_problem(client.simulate_get(STATS), 401)
    assert_problem(client.simulate_get(STATS, headers=bearer(world.token(ws, auth.WRITE))), 403)


class _MustNotSend:
    """A transport for rows that are settled without a POST; a call fails the test."""

    def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> TransportResult:
        raise AssertionError(f"{url} must not be sent to")

    def close(self) -> None:
        pass


def _unsent(mode: str, url: str | None, active: bool | None) -> tuple[str, int | None, BreakerSignal]:
    """What DeliveryMaker records for a row it settles without sending."""
    row = ClaimedRow(id=1, claim_token=1, grants_slot=True, endpoint_id=1, event_id="evt", attempt=1, mode=mode,
                     age=1.0, db_now=1.8e9, is_probe=False, event_type="job.completed", sequence=1, occurred_at="",
                     payload="{}", url=url, active=active, secret=None, previous_secret=None, workspace_id="acme")
    attempt = DeliveryMaker(_MustNotSend(), RetryPolicies(RetryPolicy())).attempt(row, 0.0)  # type: ignore[arg-type]
    return attempt.record.result, attempt.record.status_code, attempt.breaker


def _sent(status: int | None = None, error: str | None = None) -> tuple[str, int | None, BreakerSignal]:
    """What DeliveryMaker records for a transport result: classify's label, the result's status."""
    result = TransportResult(status=status, body=b"", error=error, detail="", retry_after=None,  # type: ignore[arg-type]
                             duration=0.1)
    outcome: Outcome = classify(result, 1, 1.0, RetryPolicy(), 1.8e9, 0.5)
    return outcome.result, status, outcome.breaker


def _cases() -> dict[str, tuple[str, int | None, BreakerSignal]]:
    cases = {f"HTTP {code}": _sent(status=code) for code in (200, 204, 301, 400, 404, 410, 429, 500, 503)}
    cases |= {error: _sent(error=error)
              for error in ("timeout", "connection", "tls", "dns", "protocol", "blocked", "invalid_url")}
    cases["shadow row"] = _unsent("shadow", "https://hooks.example.test/in", True)
    cases["endpoint deleted"] = _unsent("live", None, None)
    cases["endpoint deactivated"] = _unsent("live", "https://hooks.example.test/in", False)
    cases["terminal"] = (terminal("event not found").result, None, terminal("event not found").breaker)
    return cases


def test_the_aggregate_counts_exactly_the_attempts_the_breaker_counts(world: World, client: Client) -> None:
    """One endpoint per case: an attempt is counted iff it gives the breaker a signal,
    and succeeds iff that signal is a success; the endpoint list's 24 h rate counts the same."""
    ws = world.workspace("acme")
    cases = _cases()
    endpoints = {}
    for name, (result, status_code, _) in cases.items():
        endpoint = world.endpoint(ws, active=False)  # inactive: more than the 10-active cap
        world.attempt(world.delivery(ws, endpoint, world.event(ws, f"evt_{endpoint}")), endpoint, 1, result,
                      status_code, ago=HALF_HOUR)
        endpoints[endpoint] = name
    token = world.token(ws)
    counted = {endpoints[e["endpoint_id"]]: (e["attempts"], e["succeeded"])
               for e in _stats(client, token, "window=1h&buckets=1")["data"]}
    expected = {name: (int(signal is not BreakerSignal.IGNORE), int(signal is BreakerSignal.SUCCESS))
                for name, (_, _, signal) in cases.items()}
    assert counted == expected
    listed = client.simulate_get("/v2/webhooks/endpoints", params={"limit": "100"}, headers=bearer(token)).json
    assert {endpoints[e["id"]]: (e["success_rate_24h"]["attempts"], e["success_rate_24h"]["delivered"])
            for e in listed["data"]} == expected
    # The table covers both sides of the rule.
    assert {signal for _, _, signal in cases.values()} == set(BreakerSignal)


@pytest.mark.parametrize("path", ["/v2/webhooks/endpoints/stats/recover", "/v2/webhooks/endpoints/stats/"])
def test_stats_is_never_taken_for_an_endpoint_id(world: World, client: Client, path: str) -> None:
    ws = world.workspace("acme")
    assert_problem(client.simulate_request("POST" if path.endswith("recover") else "GET", path,
                                           headers=bearer(world.token(ws)), json={"since": "2026-01-01T00:00:00Z"}),
                   404)
