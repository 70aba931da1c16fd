"""G1's last chance at the retry ceiling, on a compressed clock (docs/decisions.md,
"Last chance"): a row whose window ends behind an open breaker waits for the
breaker's probe.  An endpoint back by then gets every row; one that is still
down fails the probe, and its rows die then, at most one ``breaker.open_for``
after their ceiling.

The 24 h window is 2 s here (``retry.base`` 100 ms, ``max_interval`` 500 ms,
``ceiling`` 2 s); the upkeep leader runs every 200 ms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(90)

CEILING = 2.0
RETRY = {"base": "100ms", "max_interval": "500ms", "ceiling": "2s", "jitter": 0}
QUICK = {"alerts": {"check_interval": "200ms"}, "workers": {"poll_interval": "50ms"}}


def _breaker(dsn: str) -> list[tuple[str, bool]]:
    return query(dsn, "SELECT state, open_until > now() FROM endpoint_state")  # type: ignore[return-value]


def test_an_endpoint_back_after_the_ceiling_gets_every_row(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("status", "back", code=500)])
        # The window (8 s) outlasts the rows' ceiling: no probe before it.
        config = write_config(db, retry=RETRY, breaker={"failure_threshold": 5, "open_for": "8s"}, **QUICK)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            settle(dispatcher, db.dsn, lambda: "started (client=" in dispatcher.log(), "the worker")
            events = produce(config, db.dsn, "ws", 10)
            settle(dispatcher, db.dsn, lambda: _breaker(db.dsn) == [("open", True)], "the breaker to open")
            settle(dispatcher, db.dsn, lambda: query(
                db.dsn, "SELECT bool_and(now() - created_at > interval '3 seconds') FROM webhook_deliveries"
            ) == [(True,)], "every row a second (five upkeep rounds) past its ceiling")
            assert status_counts(db.dsn) == {"pending": 10}, "no row dies before the breaker lets an attempt through"
            assert _breaker(db.dsn) == [("open", True)], "the probe is still ahead"

            receiver.set_profile("back", "ok")  # the endpoint comes back inside the window
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 10},
                   "every row delivered after its ceiling")
            assert _breaker(db.dsn)[0][0] == "closed"
        lived = [age for (age,) in query(db.dsn, "SELECT extract(epoch FROM delivered_at - created_at)::float8 "
                                                 "FROM webhook_deliveries")]
        assert min(lived) > CEILING, lived
        assert {d.webhook_id for d in receiver.deliveries() if d.ok} == set(events)


def test_behind_a_breaker_that_never_closes_rows_die_once_a_probe_after_their_ceiling_fails(
        db, write_config, tmp_path: Path) -> None:
    open_for = 1.5
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("status", "down", code=500)])
        config = write_config(db, retry=RETRY, breaker={"failure_threshold": 5, "open_for": "1500ms"}, **QUICK)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            settle(dispatcher, db.dsn, lambda: "started (client=" in dispatcher.log(), "the worker")
            produce(config, db.dsn, "ws", 10)
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"dead": 10}, "every row dead")
    rows = query(db.dsn, """
        SELECT d.id, extract(epoch FROM d.finished_at - d.created_at)::float8,
               -- failed attempts to the endpoint that ended at or after the row's ceiling, before it died
               (SELECT count(*) FROM webhook_delivery_attempts a
                 WHERE a.endpoint_id = d.endpoint_id AND a.result <> 'delivered'
                   AND a.started_at + make_interval(secs => a.duration_ms / 1000.0)
                       >= d.created_at + make_interval(secs => %s)
                   AND a.started_at <= d.finished_at)
          FROM webhook_deliveries d""", (CEILING,))
    for row_id, lived, chances in rows:
        assert chances >= 1, f"row {row_id} died {lived:.2f} s after creation, no failed attempt after its ceiling"
        assert CEILING <= lived <= CEILING + open_for + 1.5, (row_id, lived)
    assert len(rows) == 10
