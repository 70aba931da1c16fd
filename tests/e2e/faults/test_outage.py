"""A receiver down for the whole retry window, on a compressed clock, then recovered
through the API.

The 24 h window is compressed to 3 s (``retry.base`` 100 ms, ``max_interval``
500 ms, ``ceiling`` 3 s).  Two endpoints are down: one gets enough failures to
open its breaker, so its rows wait past the ceiling for the breaker's probe,
which fails, and are swept to ``dead`` by upkeep then (docs/decisions.md, "Last
chance"); the other stays under the breaker threshold, so its rows die by their
last attempt, which the schedule puts at the ceiling.  Then the endpoints come back
and ``POST /v2/webhooks/endpoints/{id}/recover`` sends every event again with
the same ``webhook-id``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from dispatcher.rules.retry import LAST_CHANCE_SPENT
from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess, closed_port_url
from tests.support.faults import ApiServer, create_token, settle

pytestmark = pytest.mark.timeout(90)

CEILING = 3.0
OPEN_FOR = 1.0


def test_rows_die_at_the_ceiling_of_an_outage_and_recover_delivers_them(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    busy, quiet = seed_workspace(db.dsn, "ws", [closed_port_url("busy"), closed_port_url("quiet")])
    query(db.dsn, "UPDATE webhook_endpoints SET event_types = '{job.rare}' WHERE id = %s", (quiet,))
    config = write_config(db, retry={"base": "100ms", "max_interval": "500ms", "ceiling": "3s", "jitter": 0},
                          breaker={"failure_threshold": 20, "open_for": "1s"},
                          alerts={"check_interval": "200ms"}, workers={"poll_interval": "50ms"},
                          api={"listen": "127.0.0.1:0"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, db.dsn, lambda: "started (client=" in dispatcher.log(), "the worker")
        # 20 rows to `busy` (its breaker opens), 2 to `quiet` (at most 9 attempts each: 18 < 20 failures,
        # so its breaker never opens).
        busy_events = produce(config, db.dsn, "ws", 20)
        quiet_events = produce(config, db.dsn, "ws", 2, event_type="job.rare")
        total = 24
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"dead": total}, f"all {total} rows dead")

        rows = query(db.dsn, "SELECT endpoint_id, attempt, last_error, "
                             "extract(epoch FROM finished_at - created_at)::float8 FROM webhook_deliveries")
        assert len(rows) == total, "nothing lost"
        for endpoint_id, attempt, last_error, lived in rows:
            # `busy`'s rows wait for the first probe after their ceiling: at most one window more.
            bound = CEILING + (OPEN_FOR if endpoint_id == busy else 0.0) + 1.5
            assert CEILING - 0.05 <= lived <= bound, (endpoint_id, attempt, lived)
            assert "connection refused" in last_error, last_error
        # `quiet` used its schedule (nominally 9 attempts, 0 s ... 2.7 s, 3 s; each gap counts
        # from the previous attempt's end, so one may fall off) and made the last one at the ceiling.
        assert all(r[1] >= 7 for r in rows if r[0] == quiet), rows
        last = query(db.dsn, "SELECT extract(epoch FROM max(a.started_at) - min(d.created_at))::float8 "
                             "FROM webhook_delivery_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id "
                             "WHERE d.endpoint_id = %s GROUP BY d.id", (quiet,))
        assert all(CEILING - 0.05 <= offset <= CEILING + 1.0 for (offset,) in last), last
        assert query(db.dsn, "SELECT state FROM endpoint_state WHERE endpoint_id = %s", (busy,)) in (
            [("open",)], [("half_open",)])
        assert any(LAST_CHANCE_SPENT in r[2] for r in rows if r[0] == busy)
        assert "swept" in dispatcher.log()

        # The endpoints come back (the customer fixed them), and recover is called through the API.
        query(db.dsn, "UPDATE webhook_endpoints SET url = %s WHERE id = %s", (receiver.url("ok", "busy"), busy))
        query(db.dsn, "UPDATE webhook_endpoints SET url = %s WHERE id = %s", (receiver.url("ok", "quiet"), quiet))
        (created,) = query(db.dsn, "SELECT min(created_at) FROM webhook_deliveries")[0]
        since = (created - timedelta(minutes=1)).isoformat()
        token = create_token(config, "ws")
        with ApiServer(config) as api:
            assert api.request("POST", f"/v2/webhooks/endpoints/{busy}/recover", token, {"since": since})[0] == 202
            status, body = api.request("POST", f"/v2/webhooks/endpoints/{quiet}/recover", token, {"since": since})
            assert status == 202, body
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"dead": total, "delivered": total},
                   "every recovered row delivered")
            status, body = api.request("GET", f"/v2/webhooks/endpoints/{busy}", token)
            assert status == 200 and body["breaker"]["state"] == "closed", body

    seen = {(d.webhook_id, d.endpoint) for d in receiver.deliveries() if d.ok}
    expected = {(e, "busy") for e in busy_events + quiet_events} | {(e, "quiet") for e in quiet_events}
    assert seen == expected, "each event sent again with its own webhook-id"
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries n JOIN webhook_deliveries o ON o.id = n.replay_of "
                         "WHERE n.status = 'delivered' AND o.status = 'dead' AND o.event_id = n.event_id") == [(total,)]
