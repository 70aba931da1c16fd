"""The circuit breaker across processes: opens, holds, probes once, closes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from dispatcher_devtools.kit import (
    SECRET,
    Dispatcher,
    SessionActivity,
    produce,
    query,
    seed_workspace,
    status_counts,
    wait_until,
)
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(120)

LEASED = "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL"


def _state(dsn: str) -> tuple[str, int, float]:
    rows = query(dsn, "SELECT state, consecutive_failures, extract(epoch FROM open_until - now())::float8 "
                      "FROM endpoint_state")
    return rows[0] if rows else ("closed", 0, 0.0)  # type: ignore[return-value]


def _open_until(dsn: str) -> datetime | None:
    """When the breaker's current open window ends (None unless it is open): one value per window."""
    rows = query(dsn, "SELECT open_until FROM endpoint_state WHERE state = 'open'")
    return rows[0][0] if rows else None


def _nothing_in_flight(dsn: str) -> bool:
    """No row is leased: every POST a worker made has been answered and recorded."""
    return bool(query(dsn, LEASED)[0][0] == 0)


def _posts_after_claims(dsn: str, window: datetime | None, posts: Callable[[], int], what: str) -> int:
    """``posts()`` once both workers' claim loops polled a few more times, all within the
    open ``window`` (else the count would prove nothing)."""
    SessionActivity(dsn, "claim").wait_for(6, sessions=2)
    seen = posts()
    assert window is not None and _open_until(dsn) == window, (
        f"the open window ended before both workers polled {what}; raise breaker.open_for")
    return seen


def test_breaker_opens_holds_probes_once_and_closes(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("status", "flaky", code=500)])
        config = write_config(db, breaker={"failure_threshold": 20, "open_for": "4s"},
                              retry={"base": "1h", "max_interval": "2h"},
                              workers={"processes": 2, "poll_interval": "50ms"})
        produce(config, db.dsn, "ws", 40)
        count = lambda: receiver.endpoint("flaky")["count"]  # noqa: E731
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: _state(db.dsn)[0] == "open", message="the breaker to open")
            window = _open_until(db.dsn)
            # The answers already in flight when it opened land and are recorded.
            wait_until(lambda: _nothing_in_flight(db.dsn), message="the sends in flight at the opening to end")
            at_open, failures = count(), _state(db.dsn)[1]
            assert 20 <= failures <= at_open
            assert _posts_after_claims(db.dsn, window, count, "while it was open") == at_open, (
                "no POST while the breaker is open")
            pending_untouched = query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE attempt = 0")[0][0]
            assert pending_untouched == 40 - at_open, "open breaker consumes no attempts"

            # The window ends: exactly one probe, which fails and reopens the breaker.
            wait_until(lambda: count() > at_open, message="the probe")
            wait_until(lambda: _state(db.dsn)[0] == "open" and _state(db.dsn)[2] > 1.0, message="reopen")
            reopened = _open_until(db.dsn)
            wait_until(lambda: _nothing_in_flight(db.dsn), message="the probe to be recorded")
            assert _posts_after_claims(db.dsn, reopened, count, "after the probe") == at_open + 1, (
                "a single probe per window, across both processes")

            # The endpoint recovers: the next probe succeeds and closes the breaker.
            receiver.set_profile("flaky", {"profile": "ok"})
            wait_until(lambda: _state(db.dsn)[:2] == ("closed", 0), timeout=30,
                       message="the breaker to close with a reset count")
            wait_until(lambda: status_counts(db.dsn).get("delivered", 0) >= 40 - at_open - 1,
                       message="the held rows to flow again")
        log = dispatcher.log()
        assert "breaker opened" in log and "breaker reopened" in log and "breaker closed" in log
        assert "notify endpoint owner" in log
