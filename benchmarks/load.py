"""Steady production through ``WebhookSender.send`` against the real engine:
the machinery behind ``sustained`` and ``isolation``.

Producers run in a forked process (eight paced threads, one transaction per
event: ``send`` then COMMIT) and record each event's commit time.  Every
workspace has one endpoint, so events/s = deliveries/s.  Figures:

* achieved: healthy events delivered (2xx recorded) by the end / events offered;
* backlog age: the age of the oldest *due* pending row of the healthy
  endpoints, sampled four times a second (rows in flight are leased, hence
  not due; an open breaker's rows are excluded, as in the engine's gauge);
* commit -> first attempt: the producer's commit to the attempt's start
  (``webhook_delivery_attempts.started_at``, attempt 1);
* commit -> 2xx: the producer's commit to the receiver's first 2xx for the
  event (``/_deliveries`` first_2xx_ts), over all healthy events (those that
  got a 500 first include their retry) and over those delivered at attempt 1.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    DispatcherRun,
    MachineCpu,
    cpu_split,
    engine_setup,
    load_average,
    percentile,
    summary_ms,
    wal_lsn,
)
from dispatcher_devtools.kit import Database, process_tree, seed_endpoints

PRODUCER_THREADS = 8


def produce_events(dsn: str, config_path: str, routes: list[tuple[str, float]], rate: float, seconds: float,
             payload_bytes: int, out_path: str, seed: int) -> None:
    """Child process: paced producers; writes ``event_id,workspace,commit_ts`` lines to ``out_path``."""
    import psycopg2

    from dispatcher import Event, WebhookSender, load_config

    sender = WebhookSender(load_config(config_path, env={}))
    workspaces = [w for w, _ in routes]
    weights = [share for _, share in routes]
    per_thread = rate / PRODUCER_THREADS
    started = time.time() + 0.2
    lines: list[list[str]] = [[] for _ in range(PRODUCER_THREADS)]
    pad = "x" * max(0, payload_bytes - 60)

    def run(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        conn = psycopg2.connect(dsn, application_name="benchmark producer")
        out = lines[index]
        count = 0
        try:
            while True:
                due = started + (count + index / PRODUCER_THREADS) / per_thread
                if due >= started + seconds:
                    return
                wait = due - time.time()
                if wait > 0:
                    time.sleep(wait)
                workspace = rng.choices(workspaces, weights)[0]
                stored = sender.send(conn, Event(workspace, "job.updated", {"job": f"j-{index}-{count}", "pad": pad}))
                conn.commit()
                out.append(f"{stored.id},{workspace},{time.time():.6f}\n")
                count += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(PRODUCER_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    Path(out_path).write_text("".join(line for part in lines for line in part), encoding="utf-8")


def start_producer(db: Database, dispatcher: DispatcherRun, routes: list[tuple[str, float]], rate: float,
                   seconds: float, payload_bytes: int, out_path: Path) -> multiprocessing.process.BaseProcess:
    """The paced producers (:func:`produce_events`, ``rate`` events/s over ``routes``) in a forked process."""
    producer = multiprocessing.get_context("fork").Process(
        target=produce_events, args=(db.dsn, str(dispatcher.config_path), routes, rate, seconds, payload_bytes,
                                     str(out_path), 1))
    producer.start()
    return producer


def run_load(*, label: str, seconds: float, rate: float, healthy: int, slow_share: float = 0.0,
             hang_share: float = 0.0, client: str | None = None, processes: int = 2, drain_timeout: float = 30.0,
             payload_bytes: int = 1024, retry: dict[str, Any] | None = None) -> dict[str, Any]:
    healthy_share = 1.0 - slow_share - hang_share
    with engine_setup(label, receiver_seed=7) as setup:
        db, tmp, statsd, receiver = setup.db, setup.tmp, setup.statsd, setup.receiver
        urls: list[list[str]] = [[receiver.url("latency", f"h{i}", median_ms=80, sigma=0.5, rate=0.02, status=500)]
                                 for i in range(healthy)]
        routes = [(f"ws{i}", healthy_share / healthy) for i in range(healthy)]
        if slow_share:
            urls.append([receiver.url("slow", "slow", ms=4800)])
            routes.append((f"ws{len(urls) - 1}", slow_share))
        if hang_share:
            urls.append([receiver.url("hang", "hang")])
            routes.append((f"ws{len(urls) - 1}", hang_share))
        ids = seed_endpoints(db.connect(), urls)
        faulty_ids = [row[0] for row in ids[healthy:]]
        config = setup.config(workers={"processes": processes},
                              http={"client": client} if client else {}, retry=retry or {})
        with DispatcherRun(tmp, config) as dispatcher:
            dispatcher.wait_ready(processes)
            producing: list[int] = []
            meter = setup.cpu_meter(dispatcher,
                                    producer_process=lambda: process_tree(producing[0]) if producing else [])
            machine_cpu = MachineCpu()
            load_before = load_average()
            ages: list[float] = []
            stop = threading.Event()
            sampler = threading.Thread(target=sample_backlog, args=(db, faulty_ids, ages, stop), daemon=True)
            sampler.start()
            out_path = tmp / "produced.csv"
            wal_start = wal_lsn(db)
            started = time.time()
            producer = start_producer(db, dispatcher, routes, rate, seconds, payload_bytes, out_path)
            producing.append(producer.pid)
            producer.join(seconds + 60)
            produced_for = time.time() - started
            wal_bytes = wal_lsn(db) - wal_start
            stop.set()
            sampler.join(5)
            cpu = meter.stop()
            machine_load = machine_cpu.stop(cpu["dispatcher"] + cpu["postgres_all_databases"] + cpu["receiver"])
            load_after = load_average()
            commits = read_commits(out_path)
            healthy_workspaces = {f"ws{i}" for i in range(healthy)}
            healthy_events = {e for e, (w, _) in commits.items() if w in healthy_workspaces}
            drained = wait_delivered(db, faulty_ids, len(healthy_events), drain_timeout)
            first_attempts = dict(db.query(
                """SELECT d.event_id, extract(epoch FROM a.started_at)::float8
                     FROM webhook_delivery_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
                    WHERE a.attempt = 1"""))
            delivered_at_first = {row[0] for row in db.query(
                "SELECT event_id FROM webhook_deliveries WHERE status = 'delivered' AND attempt = 1")}
            statuses = {str(k): int(v) for k, v in db.query(
                "SELECT status, count(*) FROM webhook_deliveries GROUP BY 1")}
            rows = int(db.scalar("SELECT count(*) FROM webhook_deliveries"))
        first_2xx = {d.webhook_id: d.first_2xx_ts for d in receiver.iter_deliveries() if d.first_2xx_ts}
        stats = receiver.stats()
        log_counts = dispatcher.log_counts()  # after the stop: the workers flushed their buffered lines
    offered = int(round(rate * seconds))
    healthy_offered = offered * healthy_share
    delivered_healthy = sum(1 for e in healthy_events if e in first_2xx)
    to_first = [first_attempts[e] - commits[e][1] for e in healthy_events if e in first_attempts]
    to_2xx = [first_2xx[e] - commits[e][1] for e in healthy_events if e in first_2xx]
    to_2xx_first = [first_2xx[e] - commits[e][1] for e in healthy_events if e in first_2xx and e in delivered_at_first]
    endpoints = stats["endpoints"]
    deliveries = len(first_attempts)
    return {
        "offered_per_s": rate,
        "seconds": seconds,
        "produced": len(commits),
        "produced_per_s": production_rate(commits),
        "offered": offered,
        "healthy_endpoints": healthy,
        "healthy_offered": int(round(healthy_offered)),
        "healthy_delivered": delivered_healthy,
        "achieved_ratio": round(delivered_healthy / healthy_offered, 5) if healthy_offered else None,
        "drained": drained,
        "rows": rows,
        "lost": len(commits) - rows,
        "statuses": statuses,
        "backlog_age": age_summary(ages),
        "commit_to_first_attempt": summary_ms(to_first),
        "healthy_commit_to_2xx": summary_ms(to_2xx),
        "healthy_commit_to_2xx_first_attempt": summary_ms(to_2xx_first),
        "receiver": {
            "requests": stats.get("requests"), "duplicates": stats.get("duplicates"),
            "bad_signatures": stats.get("bad_signatures"), "cpu_s": stats.get("cpu_s"),
            "slow": _endpoint_view(endpoints.get("slow")), "hang": _endpoint_view(endpoints.get("hang")),
            "healthy_max_concurrency": max((ep.get("max_concurrency", 0) for key, ep in endpoints.items()
                                            if key.startswith("h")), default=0),
        },
        **cpu_split(cpu, deliveries),
        "cores_used": {name: round(value / produced_for, 3) for name, value in cpu.items()} if produced_for else None,
        # producers' and dispatcher's WAL together (and anything else the server wrote meanwhile)
        "wal_bytes_per_event": round(wal_bytes / len(commits)) if commits else None,
        "machine": machine_load,
        "statsd": statsd.report(),
        "log": log_counts,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }


def production_rate(commits: dict[str, tuple[str, float]]) -> float | None:
    stamps = [stamp for _, stamp in commits.values()]
    if len(stamps) < 2:
        return None
    return round((len(stamps) - 1) / (max(stamps) - min(stamps)), 1)


def age_summary(ages: list[float]) -> dict[str, Any]:
    """p50/p99/max in seconds of the backlog-age samples."""
    return {"samples": len(ages), "p50_s": round_or_none(percentile(ages, 50)),
            "p99_s": round_or_none(percentile(ages, 99)), "max_s": round_or_none(max(ages) if ages else None)}


def round_or_none(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _endpoint_view(ep: dict[str, Any] | None) -> dict[str, Any] | None:
    if not ep:
        return None
    return {"requests": ep.get("requests"), "ok": ep.get("ok"), "max_concurrency": ep.get("max_concurrency"),
            "statuses": ep.get("statuses")}


def read_commits(path: Path) -> dict[str, tuple[str, float]]:
    commits: dict[str, tuple[str, float]] = {}
    if not path.exists():
        return commits
    for line in path.read_text(encoding="utf-8").splitlines():
        event_id, workspace, stamp = line.split(",")
        commits[event_id] = (workspace, float(stamp))
    return commits


# The samplers name the endpoints they leave out, the few faulty ones, rather than the thousands they
# count: Postgres checks `endpoint_id = ANY (<9,450 healthy ids>)` linearly per row, and with the faulty
# endpoints' 19,000 due rows pending one backlog sample cost 680 ms of its CPU (0.16 cores through the
# internet scenario's faulty phase, taken from the engine it measures); `<> ALL (<550 faulty ids>)` costs
# 8-10 ms.  Every endpoint of a benchmark database is either counted or named here.
BACKLOG_AGE_SQL = """SELECT coalesce(extract(epoch FROM now() - min(next_attempt_at))::float8, 0)
                       FROM webhook_deliveries
                      WHERE status = 'pending' AND next_attempt_at <= now()
                        AND endpoint_id <> ALL (%s::bigint[])"""
DELIVERED_SQL = ("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered' "
                 "AND endpoint_id <> ALL (%s::bigint[])")


def sample_backlog(db: Database, faulty_ids: list[int], ages: list[float], stop: threading.Event,
                   interval: float = 0.25) -> None:
    """Append the age of the oldest due pending row of every endpoint but ``faulty_ids`` until ``stop``."""
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            while not stop.wait(interval):
                cur.execute(BACKLOG_AGE_SQL, (faulty_ids,))
                ages.append(max(0.0, float(cur.fetchone()[0])))
    finally:
        conn.close()


def wait_delivered(db: Database, faulty_ids: list[int], expected: int, timeout: float) -> bool:
    """Wait until ``expected`` rows of the endpoints other than ``faulty_ids`` are delivered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(db.scalar(DELIVERED_SQL, (faulty_ids,))) >= expected:
            return True
        time.sleep(0.5)
    return False
