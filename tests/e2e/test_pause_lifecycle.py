"""A compressed 24 h disable (issue 24, "Tests and measures"), run through the real dispatcher and CLI.

An endpoint fails; its breaker keeps reopening until the lifecycle pauses it (endpoints.disable_after
of 3 s instead of 3 days, the warning 1 s before); 5,000 events arrive while it is paused and are
held, none sent; it comes back and an operator resumes it (``dispatcher endpoint resume``).  Every
event then arrives exactly once (beyond lease-bound duplicates), never more than the endpoint's
concurrency at once, while another workspace's endpoint is delivered throughout; the owner hears
each stage once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, wait_until
from dispatcher_devtools.receiver import ReceiverProcess
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(300)

HELD_EVENTS = 5000
CONCURRENCY = 4


def _count(dsn: str, endpoint_id: int, status: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s AND status = %s",
                     (endpoint_id, status))[0][0])


def _attempts(dsn: str, endpoint_id: int) -> int:
    return int(query(dsn, "SELECT count(*) FROM webhook_delivery_attempts WHERE endpoint_id = %s",
                     (endpoint_id,))[0][0])


def test_paused_by_the_lifecycle_5000_held_then_resumed_each_arrives_once(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        (failing,) = seed_workspace(db.dsn, "ws", [receiver.url("status", "failing", code=500)])
        (steady,) = seed_workspace(db.dsn, "other", [receiver.url("ok", "steady")])
        config = write_config(
            db, workers={"processes": 2, "per_endpoint_concurrency": CONCURRENCY, "poll_interval": "50ms",
                         "lease": "10s"},
            breaker={"failure_threshold": 3, "open_for": "500ms"},
            retry={"base": "200ms", "max_interval": "500ms"},
            alerts={"check_interval": "300ms"},
            endpoints={"disable_after": "3s", "warn_before": "1s", "flap_window": "500ms", "hold_for": "1h"})
        early = produce(config, db.dsn, "ws", 20)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: query(db.dsn, "SELECT paused_at IS NOT NULL FROM webhook_endpoints WHERE id = %s",
                                     (failing,))[0][0], timeout=60, message="the lifecycle to pause the endpoint")
            # Rows in flight at the pause finish their attempt; then nothing more is attempted.
            wait_until(lambda: _count(db.dsn, failing, "pending") == 0, message="every row held")
            attempts_at_pause = _attempts(db.dsn, failing)
            held = produce(config, db.dsn, "ws", HELD_EVENTS)
            during = produce(config, db.dsn, "other", 100)
            wait_until(lambda: _count(db.dsn, steady, "delivered") == 100, timeout=60,
                       message="the other workspace delivered while this one is paused")
            assert _count(db.dsn, failing, "held") == len(early) + HELD_EVENTS
            assert _attempts(db.dsn, failing) == attempts_at_pause, "no attempt while paused"
            # The receiver comes back, a little slow so that concurrency shows; an operator resumes.
            receiver.set_profile("failing", {"profile": "latency", "latency_ms": 5})
            resumed = subprocess.run([sys.executable, str(REPO / "bin" / "dispatcher"), "-c", str(config),
                                      "endpoint", "resume", str(failing)], capture_output=True, text=True,
                                     timeout=60)
            assert resumed.returncode == 0, resumed.stderr
            assert f"{len(early) + HELD_EVENTS} held row(s) pending again" in resumed.stdout
            after = produce(config, db.dsn, "other", 100)
            wait_until(lambda: _count(db.dsn, failing, "delivered") == len(early) + HELD_EVENTS, timeout=200,
                       message="every held event delivered after the resume")
            wait_until(lambda: _count(db.dsn, steady, "delivered") == 200, message="the other endpoint too")
            wait_until(lambda: query(db.dsn, "SELECT count(*) FROM breaker_notices WHERE kind = 'recovered'")[0][0],
                       message="the recovered notice")
        assert "Traceback" not in dispatcher.log()
        seen, other = receiver.endpoint("failing"), receiver.endpoint("steady")
        delivered = [d for d in receiver.deliveries() if d.endpoint == "failing" and d.first_2xx_ts]
    assert {d.webhook_id for d in delivered} == set(early) | set(held), "every event arrived"
    assert max(d.ok for d in delivered) == 1, "none twice"
    assert seen["max_concurrency"] <= CONCURRENCY, seen
    # Exactly once: a 2xx is sent again only if its result was not written before a lease lapsed
    # (a lease-bound duplicate; no lease lapses here) -- so no row has two 2xx.
    assert query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts WHERE endpoint_id = %s "
                         "AND result = 'delivered'", (failing,)) == [(len(early) + HELD_EVENTS,)]
    assert other["unique"] == len(during) + len(after)
    kinds = query(db.dsn, "SELECT kind, count(*) FROM breaker_notices WHERE endpoint_id = %s GROUP BY kind "
                          "ORDER BY kind", (failing,))
    assert kinds == [("opened", 1), ("paused", 1), ("recovered", 1), ("will_pause", 1)]


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "bin" / "dispatcher"), "-c", str(config), *args],
                          capture_output=True, text=True, timeout=60)


def test_operator_pause_resume_and_delete_asks_for_yes(db, write_config) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/hook"])
    config = write_config(db)
    produce(config, db.dsn, "ws", 3)
    paused = _cli(config, "endpoint", "pause", str(endpoint))
    assert paused.returncode == 0 and "paused, 3 pending row(s) held" in paused.stdout, paused.stderr
    listed = _cli(config, "endpoint", "list", "--workspace", "ws")
    assert "paused (operator) held 3" in listed.stdout, listed.stdout
    refused = _cli(config, "endpoint", "delete", str(endpoint))
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "holds 3" in refused.stderr and "--yes" in refused.stderr
    assert _count(db.dsn, endpoint, "held") == 3, "nothing changed"
    resumed = _cli(config, "endpoint", "resume", str(endpoint))
    assert "resumed, 3 held row(s) pending again (paused by operator" in resumed.stdout, resumed.stderr
    _cli(config, "endpoint", "pause", str(endpoint))
    deleted = _cli(config, "endpoint", "delete", str(endpoint), "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert query(db.dsn, "SELECT status, last_error, count(*) FROM webhook_deliveries GROUP BY 1, 2") == [
        ("failed", "endpoint deleted", 3)]
    assert [a for (a,) in query(db.dsn, "SELECT action FROM api_audit ORDER BY id")] == [
        "endpoint.pause", "endpoint.resume", "endpoint.pause", "endpoint.delete"]
