"""The circuit breaker across processes: opens, holds, probes once, closes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts, wait_until
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(120)


def _state(dsn: str) -> tuple[str, int, float]:
    rows = query(dsn, "SELECT state, consecutive_failures, extract(epoch FROM open_until - now())::float8 "
                      "FROM endpoint_state")
    return rows[0] if rows else ("closed", 0, 0.0)  # type: ignore[return-value]


def test_breaker_opens_holds_probes_once_and_closes(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("status", "flaky", code=500)])
        config = write_config(db, breaker={"failure_threshold": 20, "open_for": "2s"},
                              retry={"base": "1h", "max_interval": "2h"},
                              workers={"processes": 2, "poll_interval": "50ms"})
        produce(config, db.dsn, "ws", 40)
        count = lambda: receiver.endpoint("flaky")["count"]  # noqa: E731
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: _state(db.dsn)[0] == "open", message="the breaker to open")
            time.sleep(0.3)  # answers already in flight when it opened land now
            at_open, failures, remaining = count(), _state(db.dsn)[1], _state(db.dsn)[2]
            assert 20 <= failures <= at_open
            time.sleep(max(0.0, remaining - 0.3))
            assert count() == at_open, "no POST while the breaker is open"
            pending_untouched = query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE attempt = 0")[0][0]
            assert pending_untouched == 40 - at_open, "open breaker consumes no attempts"

            # The window ends: exactly one probe, which fails and reopens the breaker.
            wait_until(lambda: count() > at_open, message="the probe")
            wait_until(lambda: _state(db.dsn)[0] == "open" and _state(db.dsn)[2] > 1.0, message="reopen")
            time.sleep(0.3)
            assert count() == at_open + 1, "a single probe per window, across both processes"

            # The endpoint recovers: the next probe succeeds and closes the breaker.
            receiver.set_profile("flaky", {"profile": "ok"})
            wait_until(lambda: _state(db.dsn)[:2] == ("closed", 0), timeout=30,
                       message="the breaker to close with a reset count")
            wait_until(lambda: status_counts(db.dsn).get("delivered", 0) >= 40 - at_open - 1,
                       message="the held rows to flow again")
        log = dispatcher.log()
        assert "breaker opened" in log and "breaker reopened" in log and "breaker closed" in log
        assert "notify endpoint owner" in log
