"""``throughput``: a pre-filled outbox drained end to end by the real engine.

200,000 pending deliveries over 1,000 endpoints (100 workspaces x 10), 1 KiB
payloads, an instant receiver that verifies every signature (``--receiver nginx``:
Debian's nginx answering 204 instead, see benchmarks/nginx.py), and every
feature on: signing, attempt history, statsd metrics to a local UDP sink,
INFO logging to a file, the breaker.  The rows are inserted in one
transaction while the dispatcher is already up and idle, and the clock starts
at that COMMIT; it stops at the last row's ``finished_at`` (recorded in the
database), so the figure is outbox -> 2xx -> recorded for every row.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

from benchmarks.harness import (
    DispatcherRun,
    EngineSetup,
    MachineCpu,
    bloat,
    cpu_split,
    drained_probe,
    engine_setup,
    insert_backlog,
    leaves,
    load_average,
    outbox_stats,
    size_sql,
    timed_vacuum,
    wal_lsn,
)
from benchmarks.nginx import NginxReceiver
from dispatcher_devtools.kit import Database, process_tree, seed_endpoints, wait_until

TARGET_PER_SECOND = 5000.0


def drain(*, events: int, workspaces: int = 100, endpoints_per_workspace: int = 10, payload_bytes: int = 1024,
          client: str | None = None, processes: int = 2, receiver_processes: int = 1, label: str = "throughput",
          timeout: float = 300.0, extra_workers: dict[str, Any] | None = None,
          keep_db: Any = None, tls: bool = False, max_per_second: float | None = None,
          supervisors: int = 1, receiver_kind: str = "mock", keep_receiver: Any = None,
          sections: dict[str, Any] | None = None, traced_events: bool = False) -> dict[str, Any]:
    """Seed ``events`` x ``endpoints_per_workspace`` deliveries and let the engine drain them.

    ``keep_db``, when given, is called with the database before it is dropped
    (the backlog scenario reads the outbox's bloat from it).  ``tls``: every
    endpoint is https on a TLS receiver.  ``max_per_second``: every endpoint
    gets that rate limit (set high, it measures what the limit costs, not what
    it holds back).  ``supervisors``: that many supervisors (as separate hosts would run them,
    each with its own owner ids) share the ``processes`` worker processes.  ``receiver_kind``:
    ``mock`` (verifies every signature) or ``nginx`` (answers 204; its access log shows that
    every request carried the signature headers, not that they verify).  ``keep_receiver``,
    when given, is called with the receiver before it stops.  ``sections``: more config
    sections for the engine (the tracing scenario's ``tracing``); ``traced_events``: the events
    carry a producer's trace context (insert_backlog).
    """
    if supervisors < 1 or processes % supervisors:
        raise ValueError(f"{processes} worker processes do not split evenly over {supervisors} supervisors")
    with engine_setup(label, receiver_processes=receiver_processes, tls=tls,
                      receiver_kind=receiver_kind) as setup:
        db, statsd, receiver = setup.db, setup.statsd, setup.receiver
        urls = [[receiver.url("ok", f"ep{w}-{i}") for i in range(endpoints_per_workspace)]
                for w in range(workspaces)]
        seed_endpoints(db.connect(), urls)
        if max_per_second is not None:
            db.query("UPDATE webhook_endpoints SET max_per_second = %s", (max_per_second,))
        handshakes_before = receiver.stats(fast=True).get("tls_handshakes", 0)
        http: dict[str, Any] = {"client": client} if client else {}
        workers = {"processes": processes, **(extra_workers or {})}
        runs = supervisor_runs(setup, supervisors, workers=workers, http=http, **(sections or {}))
        with contextlib.ExitStack() as stack:
            for run in runs:
                stack.enter_context(run)
            for run in runs:
                run.wait_ready(run.config["workers"]["processes"])
            conn = db.connect()
            cur = conn.cursor()
            expected = insert_backlog(cur, workspaces, events, payload_bytes, traced=traced_events)
            cur.execute("ANALYZE webhook_deliveries")
            cur.execute("ANALYZE events")
            meter = setup.cpu_meter(runs, harness=lambda: process_tree(os.getpid())[:1])
            machine_cpu = MachineCpu()
            timeline: list[dict[str, Any]] = []
            stop_sampling = threading.Event()
            load_before = load_average()
            conn.commit()
            committed = time.time()
            wal_start = wal_lsn(db)
            sampler = threading.Thread(target=_sample_outbox, args=(db, committed, timeline, stop_sampling),
                                       daemon=True)
            sampler.start()
            try:
                # NOT EXISTS stops at the first pending row of the due index: a count(*)
                # here read the whole outbox five times a second (56 ms a call at
                # 200,000 rows), CPU taken from the engine being measured.
                with drained_probe(db, "SELECT NOT EXISTS (SELECT 1 FROM webhook_deliveries"
                                   " WHERE status = 'pending')") as drained:
                    wait_until(drained, timeout=timeout, interval=0.2, message="the outbox to drain")
            finally:
                cpu = meter.stop()
                machine_load = machine_cpu.stop(cpu["dispatcher"] + cpu["postgres_all_databases"] + cpu["receiver"]
                                                + cpu["harness"])
                stop_sampling.set()
                sampler.join(5)
            load_after = load_average()
            wal_bytes = wal_lsn(db) - wal_start
            conn.close()
            (last_finished, first_started, delivered, attempts, statuses) = _db_figures(db)
        if isinstance(receiver, NginxReceiver):
            receiver.wait_logged(attempts, timeout=10.0)  # its log buffer is flushed every 100 ms
        stats = receiver.stats()
        # Each control request (/_stats) is a TLS connection of its own, this one too: not the engine's.
        handshakes = stats.get("tls_handshakes", 0) - handshakes_before - 1
        # After the stop: the workers flushed their buffered lines.
        log_counts = {key: sum(c[key] for c in (run.log_counts() for run in runs)) for key in runs[0].log_counts()}
        after = outbox_stats(db)
        after["pgstattuple"] = bloat(db)
        after["vacuum"] = timed_vacuum(db)
        if keep_db is not None:
            keep_db(db)
        if keep_receiver is not None:
            keep_receiver(receiver)
        seconds = last_finished - committed
        rate = expected / seconds if seconds > 0 else None
        received_ok = sum(ep.get("ok", 0) for ep in stats["endpoints"].values())
        lost = expected - delivered
        return {
            "deliveries": expected,
            "endpoints": workspaces * endpoints_per_workspace,
            "payload_bytes": payload_bytes,
            "client": client or "default",
            "tls": tls,
            "max_per_second": max_per_second,
            "tls_handshakes": handshakes if tls else None,
            "tls_resumed": stats.get("tls_resumed") if tls else None,
            "worker_processes": processes,
            "supervisors": supervisors,
            "owners": sorted(owner for run in runs for owner in run.owners()),
            "committed_at": committed,
            "seconds": round(seconds, 3),
            "deliveries_per_s": round(rate, 1) if rate else None,
            "first_attempt_after_commit_s": round(first_started - committed, 3),
            "statuses": statuses,
            "lost": lost,
            "attempt_rows": attempts,
            "receiver": _receiver_figures(stats, received_ok, committed),
            **cpu_split(cpu, expected),
            "wal_bytes_per_delivery": round(wal_bytes / expected) if expected else None,
            "measured_for_s": round(meter.elapsed, 2),
            "machine": machine_load,
            "statsd": statsd.report(),
            "log": log_counts,
            "outbox_after": after,
            "outbox_timeline": timeline,
            "load_average_before": load_before,
            "load_average_after": load_after,
        }


def _receiver_figures(stats: dict[str, Any], received_ok: int, committed: float) -> dict[str, Any]:
    """What the receiver saw; nginx's log adds the signature-header check, its connections and
    the time of the last request it answered (from the commit)."""
    figures: dict[str, Any] = {
        "kind": "nginx" if "signature_headers_missing" in stats else "mock",
        "requests": stats.get("requests"), "ok": received_ok,
        "unique": stats.get("total") - (stats.get("duplicates") or 0) if stats.get("total") is not None else None,
        "duplicates": stats.get("duplicates"), "bad_signatures": stats.get("bad_signatures"),
        "cpu_s": stats.get("cpu_s")}
    if figures["kind"] == "nginx":
        last = stats.get("last_at")
        figures.update({"signature_headers_missing": stats["signature_headers_missing"],
                        "id_mismatch": stats["id_mismatch"], "statuses": stats["statuses"],
                        "connections": stats["connections"],
                        "last_request_after_commit_s": None if last is None else round(last - committed, 3)})
    return figures


def supervisor_runs(setup: EngineSetup, supervisors: int, *, workers: dict[str, Any],
                    **sections: dict[str, Any]) -> list[DispatcherRun]:
    """``supervisors`` dispatcher runs on the setup's database, ``workers["processes"]`` split
    evenly between them, each with its own directory, config and log (one: the setup's own)."""
    each = {**workers, "processes": workers["processes"] // supervisors}
    if supervisors == 1:
        return [DispatcherRun(setup.tmp, setup.config(workers=each, **sections))]
    runs = []
    for index in range(supervisors):
        home = setup.tmp / f"supervisor{index}"
        home.mkdir()
        config = setup.config(workers=each, logging={"file": str(home / "dispatcher.log")}, **sections)
        runs.append(DispatcherRun(home, config))
    return runs


def _sample_outbox(db: Database, started: float, timeline: list[dict[str, Any]],
                   stop: threading.Event) -> None:
    """Dead tuples and autovacuum runs of the outbox, once a second while it drains."""
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            while not stop.wait(1.0):
                # Sums over the outbox's partitions (migration 0027).
                cur.execute(f"""SELECT sum(n_live_tup), sum(n_dead_tup), sum(autovacuum_count),
                                       {size_sql('webhook_deliveries')}, {size_sql('webhook_deliveries_due')}
                                  FROM pg_stat_user_tables WHERE relid IN ({leaves('webhook_deliveries')})""")
                live, dead, autovac, heap, due = cur.fetchone()
                timeline.append({"t": round(time.time() - started, 1), "live": live, "dead": dead,
                                 "autovacuums": autovac, "heap_mb": round(heap / 2**20, 1),
                                 "due_index_mb": round(due / 2**20, 2)})
    finally:
        conn.close()


def _db_figures(db: Database) -> tuple[float, float, int, int, dict[str, int]]:
    last_finished = float(db.scalar("SELECT extract(epoch FROM max(finished_at))::float8 FROM webhook_deliveries"))
    first_started = float(db.scalar(
        "SELECT extract(epoch FROM min(started_at))::float8 FROM webhook_delivery_attempts"))
    statuses = {str(k): int(v) for k, v in db.query("SELECT status, count(*) FROM webhook_deliveries GROUP BY 1")}
    attempts = int(db.scalar("SELECT count(*) FROM webhook_delivery_attempts"))
    return last_finished, first_started, statuses.get("delivered", 0), attempts, statuses


def run(tiny: bool = False, client: str | None = None, processes: int = 2,
        ceiling: float | None = None, max_per_second: float | None = None,
        receiver: str = "mock") -> dict[str, Any]:
    events = 50 if tiny else 20_000
    workspaces = 10 if tiny else 100
    result = drain(events=events, workspaces=workspaces, client=client, processes=processes,
                   max_per_second=max_per_second, receiver_kind=receiver)
    rate = result["deliveries_per_s"] or 0.0
    result["target_per_s"] = TARGET_PER_SECOND
    result["ratio_to_ceiling"] = round(rate / ceiling, 3) if ceiling else None
    total = sum(result["cpu_ms_per_delivery"][k] or 0.0 for k in ("dispatcher", "postgres", "receiver"))
    cores = os.cpu_count() or 1
    # What the same CPU cost per delivery would allow if this machine ran
    # nothing else: a projection, labelled as such, never the measured figure.
    result["cpu_bound_projection_per_s"] = round(cores * 1000.0 / total) if total else None
    result["met"] = rate >= TARGET_PER_SECOND and result["lost"] == 0
    split = result["cpu_ms_per_delivery"]
    result["table"] = [
        ("deliveries/s end to end", result["deliveries_per_s"], f">= {TARGET_PER_SECOND:,.0f}"),
        ("ratio to ceiling", result["ratio_to_ceiling"], "report"),
        ("CPU ms/delivery dispatcher", split["dispatcher"], "report"),
        ("CPU ms/delivery postgres", split["postgres"], "report"),
        ("CPU ms/delivery receiver", split["receiver"], "report"),
        ("other processes' cores during run", result["machine"]["others_cores"], "report (noise)"),
        ("lost", result["lost"], "0"),
    ]
    return result
