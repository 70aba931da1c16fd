"""``outage`` (G1): an endpoint down for its whole retry window, then back, then recovered.

A compressed schedule stands in for the 24 h one (the same code, other
numbers): retries from 200 ms doubling to 1 s, a retry ceiling of 6 s, the
breaker opening after 20 consecutive failures for 1 s.  The endpoint's port is
bound but not listening (connection refused) while the events are produced
and until every row is ``dead``.  Then a receiver starts on that very port and
``POST /v2/webhooks/endpoints/{id}/recover`` (``store.deliveries.recover``, what
the API runs) re-queues the dead rows.  Checks: no row lost, every row dead
at (not before) the ceiling -- those behind the open breaker once a probe after
it failed -- every event delivered after the recover.
"""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.harness import (
    DispatcherRun,
    StatsdSink,
    bench_database,
    workdir,
)
from dispatcher import Event, WebhookSender
from dispatcher.config import config_from_mapping
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.rules.retry import LAST_CHANCE_SPENT
from dispatcher.store import deliveries
from dispatcher_devtools.kit import SECRET, bench_config, seed_endpoints, wait_until
from dispatcher_devtools.receiver import ReceiverProcess


def run(tiny: bool = False, client: str | None = None, processes: int = 2) -> dict[str, Any]:
    events = 40 if tiny else 1000
    ceiling = 3.0 if tiny else 6.0
    reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserved.bind(("127.0.0.1", 0))  # bound, never listening: connects are refused
    port = reserved.getsockname()[1]
    url = f"http://127.0.0.1:{port}/ok/down"
    with bench_database("outage") as db, workdir("outage") as tmp, StatsdSink() as statsd:
        ((endpoint_id,),) = seed_endpoints(db.connect(), [[url]])
        config = bench_config(
            db.dsn, tmp / "dispatcher.log", statsd.port, workers={"processes": processes, "poll_interval": "100ms"},
            http={"client": client} if client else {},
            retry={"base": "200ms", "max_interval": "1s", "ceiling": f"{ceiling:g}s", "jitter": 0.2},
            breaker={"failure_threshold": 20, "open_for": "1s"}, alerts={"check_interval": "500ms"})
        with DispatcherRun(tmp, config) as dispatcher:
            dispatcher.wait_ready(processes)
            sender = WebhookSender(config_from_mapping({"database": {"dsn": db.dsn}}, env={}))
            conn = db.connect()
            started = datetime.now(UTC)
            with sender.transaction(conn) as tx:
                ids = [tx.send(Event("ws0", "job.completed", {"job": f"j-{n}"})).id for n in range(events)]
            wait_until(lambda: db.scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'dead'") == events,
                       timeout=ceiling + 60, interval=0.2, message="every row to die")
            dead_at = db.query(
                """SELECT min(extract(epoch FROM finished_at - created_at)),
                          max(extract(epoch FROM finished_at - created_at)), min(attempt), max(attempt), avg(attempt)
                     FROM webhook_deliveries WHERE status = 'dead'""")[0]
            swept = int(db.scalar("SELECT count(*) FROM webhook_deliveries WHERE position(%s IN last_error) > 0",
                                  (LAST_CHANCE_SPENT,)))
            attempts_while_down = int(db.scalar("SELECT count(*) FROM webhook_delivery_attempts"))
            breaker_opened = dispatcher.log_path.read_text(errors="replace").count("breaker opened")
            reserved.close()
            with ReceiverProcess(secrets=[SECRET], port=port) as receiver:
                back_at = time.monotonic()
                recovered = deliveries.recover(db.connect(), "ws0", endpoint_id, started - timedelta(minutes=1), None,
                                               ReplayBudget(100), token_id=None)  # no API token: no audit row
                wait_until(lambda: db.scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")
                           == events, timeout=60, interval=0.2, message="every recovered row to be delivered")
                delivered_after_s = time.monotonic() - back_at
                got = {d.webhook_id for d in receiver.iter_deliveries() if d.ok}
                stats = receiver.stats()
            statuses = {str(k): int(v)
                        for k, v in db.query("SELECT status, count(*) FROM webhook_deliveries GROUP BY 1")}
    missing = [event_id for event_id in ids if event_id not in got]
    min_dead, max_dead, min_attempt, max_attempt, avg_attempt = dead_at
    result: dict[str, Any] = {
        "events": events,
        "retry_ceiling_s": ceiling,
        "dead_after_s": {"min": round(float(min_dead), 3), "max": round(float(max_dead), 3)},
        "attempts_per_dead_row": {"min": min_attempt, "max": max_attempt, "avg": round(float(avg_attempt), 2)},
        "attempts_while_down": attempts_while_down,
        "swept_dead_while_breaker_open": swept,
        "breaker_opened_log_lines": breaker_opened,
        "recovered_rows": recovered.queued,
        "replay_units_charged": recovered.units,
        "delivered_after_recover_s": round(delivered_after_s, 2),
        "statuses": statuses,
        "received_events": len(got),
        "duplicates": stats.get("duplicates"),
        "lost": len(missing),
    }
    result["met"] = bool(not missing and float(min_dead) >= ceiling - 0.01 and recovered.queued == events)
    result["table"] = [
        ("lost", result["lost"], "0"),
        ("dead after s (min..max)", f"{result['dead_after_s']['min']}..{result['dead_after_s']['max']}",
         f">= ceiling {ceiling:g}"),
        ("recovered then delivered", f"{recovered.queued}/{events}", "all"),
    ]
    return result
