"""``failover``: how long deliveries stop when the primary dies and a standby is promoted.

A primary and a synchronous streaming standby (``pg_basebackup -R``, the kit's
:class:`ReplicationPair`) on loopback ports.  The dispatcher (2 workers) and a
producer committing one event per transaction use the multi-host DSN
``host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write``; three
endpoints on the kit's capture receiver answer 200.  Under load the primary is
stopped in immediate mode (a crash), the standby promoted ``promote_after``
seconds later (what failover tooling takes is its own figure; this one counts
the dispatcher's part), and the run measures:

* ``stop_to_first_delivery_s``: primary stop -> the first delivery recorded
  on the new primary (the earliest ``delivered_at`` after the promotion
  began: only the new primary can have recorded it);
* ``promote_to_first_delivery_s``: the same from the promotion;
* ``promote_to_first_commit_s``: promotion -> the producer's first COMMIT;
* ``lost`` (committed events not delivered to every endpoint) and duplicates.

Once with ``database.reconnect_max`` at its default (30 s) and once at 1 s: the
reconnect backoff, not libpq, decides how soon a worker looks again.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.harness import DispatcherRun, StatsdSink, workdir
from dispatcher_devtools.kit import (
    ReplicationPair,
    SteadyProducer,
    bench_config,
    capture_server,
    query,
    seed_workspace,
    wait_until,
)

ENDPOINTS = 3


def run(tiny: bool = False) -> dict[str, Any]:
    promote_after = 0.5 if tiny else 3.0
    events = 30 if tiny else 200  # delivered before the crash, and committed after the promotion
    runs = {"reconnect_max_1s": _one_run("1s", promote_after, events)}
    if not tiny:
        runs["reconnect_max_default_30s"] = _one_run(None, promote_after, events)
    worst = max(r["promote_to_first_delivery_s"] for r in runs.values())
    result: dict[str, Any] = {
        "promote_after_s": promote_after,
        "runs": runs,
        "lost": sum(r["lost"] for r in runs.values()),
        "duplicates": sum(r["duplicates"] for r in runs.values()),
        "supervisor_restarts": sum(r["supervisor_restarts"] for r in runs.values()),
        "worker_restarts": sum(r["worker_restarts"] for r in runs.values()),
    }
    result["met"] = result["lost"] == 0 and result["supervisor_restarts"] == 0
    result["table"] = [("lost committed events", result["lost"], "0"),
                       ("duplicates", result["duplicates"], "<= rows in flight at the crash")]
    for name, figures in runs.items():
        result["table"] += [(f"{name}: stop -> first delivery s", figures["stop_to_first_delivery_s"], ""),
                            (f"{name}: promote -> first delivery s", figures["promote_to_first_delivery_s"], "")]
    result["table"].append(("worst promote -> first delivery s", worst, "<= reconnect_max + a few s"))
    return result


def _one_run(reconnect_max: str | None, promote_after: float, events: int) -> dict[str, Any]:
    database: dict[str, Any] = {"connect_timeout": "2s", **({"reconnect_max": reconnect_max} if reconnect_max else {})}
    with ReplicationPair(synchronous=True) as pair, workdir("failover") as tmp, StatsdSink() as statsd, \
            capture_server() as capture:
        dsn = pair.failover_dsn
        paths = [f"/e{n}" for n in range(ENDPOINTS)]
        seed_workspace(dsn, "ws", [capture.url + path for path in paths])
        config = bench_config(dsn, tmp / "dispatcher.log", statsd.port,
                              database={"dsn": dsn, **database},
                              workers={"processes": 2, "poll_interval": "50ms", "lease": "30s"})
        with DispatcherRun(tmp, config) as dispatcher:
            dispatcher.wait_ready(2)
            with SteadyProducer(dispatcher.config_path, dsn, "ws", interval=0.005) as producer:
                wait_until(lambda: len(capture.captured) >= events * ENDPOINTS, timeout=30,
                           message="deliveries to flow")
                stopped_wall = time.time()
                pair.primary.stop("immediate")
                time.sleep(promote_after)
                promoted, promoted_wall = time.monotonic(), time.time()
                pair.promote()
                wait_until(lambda: producer.ids() - producer.ids(promoted), timeout=60, message="a commit")
                first_commit = min(at for _, at in producer.committed if at >= promoted)
                wait_until(lambda: len(producer.ids()) > len(producer.ids(promoted)) + events, timeout=60,
                           message=f"{events} events on the new primary")
            committed = producer.ids()
            expected = {(event_id, path) for event_id in committed for path in paths}
            wait_until(lambda: expected <= capture.by_event().keys(), timeout=90, interval=0.2,
                       message="every committed event delivered")
            # Only the new primary records anything after the promotion began (a result
            # written in the instant before the crash is older, and replicated).  A result is
            # recorded after its POST is captured, by a result connection that may still be
            # reconnecting: wait for it rather than read it once.
            first_delivery = wait_until(
                lambda: query(dsn, "SELECT extract(epoch FROM min(delivered_at)) FROM webhook_deliveries "
                                   "WHERE delivered_at >= to_timestamp(%s)", (promoted_wall,))[0][0],
                timeout=60, interval=0.2, message="a delivery recorded on the new primary")
            log = dispatcher.log_path.read_text(errors="replace")
        posts = capture.by_event()
    return {
        "reconnect_max": reconnect_max or "30s (default)",
        "stop_to_first_delivery_s": round(float(first_delivery) - stopped_wall, 2),
        "promote_to_first_delivery_s": round(float(first_delivery) - promoted_wall, 2),
        "promote_to_first_commit_s": round(first_commit - promoted, 2),
        "committed_events": len(committed),
        "producer_failed_attempts": len(producer.failures),
        "lost": len(expected - posts.keys()),
        "duplicates": sum(count - 1 for count in posts.values() if count > 1),
        "claim_failures_logged": log.count("claim failed, backing off"),
        "result_write_retries_logged": log.count("result write failed, will retry"),
        "supervisor_restarts": log.count("event=supervisor_started") - 1,
        "worker_restarts": log.count("event=worker_restarting"),
    }
