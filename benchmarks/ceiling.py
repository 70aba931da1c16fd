"""``ceiling``: what this machine and stack allow, with no engine feature on.

Three measurements against the loopback mock receiver:

* **transports**: one gevent process, 32 greenlets, POSTing a 1 KiB body
  through each ``http.client`` transport (urllib3, geventhttpclient) for a few
  seconds, twice each, alternating; the receiver verifies nothing here;
* **receiver**: its own ceiling, driven by two such client processes (64
  greenlets each) with signed requests that it verifies; reported as
  requests/s and CPU microseconds per request;
* **bare loop**: the ``throughput`` outbox (same rows, same endpoints), drained
  by two processes of :mod:`benchmarks.bare_loop` (claim 200, POST, mark done
  in batches; gevent + geventhttpclient; no signing, history, metrics,
  breaker, fairness or per-attempt logging).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.harness import (
    REPO,
    CpuMeter,
    PostgresProcesses,
    bench_database,
    cpu_split,
    insert_backlog,
)
from dispatcher_devtools.kit import SECRET, process_tree, seed_endpoints
from dispatcher_devtools.receiver import ReceiverProcess

KINDS = ("urllib3", "geventhttpclient")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def bare_process(*args: str) -> subprocess.Popen[bytes]:
    """``python -m benchmarks.bare_loop ARGS`` (gevent-patched) with its output piped."""
    return subprocess.Popen([sys.executable, "-m", "benchmarks.bare_loop", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(), cwd=REPO)


def bare_result(process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The JSON a :func:`bare_process` printed last; RuntimeError when it failed."""
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"bare loop failed ({process.returncode}): {err.decode(errors='replace')[-2000:]}")
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def transports(seconds: float, rounds: int = 2) -> dict[str, Any]:
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu_per_request: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with ReceiverProcess() as receiver:
        url = receiver.url("ok", "probe")
        for _ in range(rounds):
            for kind in KINDS:
                result = bare_result(bare_process("--probe", url, "--client", kind, "--seconds", str(seconds)),
                                     seconds + 60)
                runs[kind].append(round(result["requests"] / result["seconds"], 1))
                cpu_per_request[kind].append(round(result["cpu_s"] * 1e6 / max(1, result["requests"]), 1))
    best = {kind: max(values) for kind, values in runs.items()}
    return {"requests_per_s": runs, "best_requests_per_s": best,
            "client_cpu_us_per_request_incl_boot": cpu_per_request,
            "speedup": round(best["geventhttpclient"] / best["urllib3"], 2) if best["urllib3"] else None,
            "greenlets": 32, "body_bytes": 1011}


def receiver_ceiling(seconds: float) -> dict[str, Any]:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        url = receiver.url("ok", "ceiling")
        before = receiver.stats(fast=True)
        clients = [bare_process("--probe", url, "--client", "geventhttpclient", "--seconds", str(seconds),
                         "--concurrency", "64", "--secret", SECRET) for _ in range(2)]
        results = [bare_result(c, seconds + 60) for c in clients]
        after = receiver.stats(fast=True)
    requests = sum(r["requests"] for r in results)
    elapsed = max(r["seconds"] for r in results)
    cpu = after["cpu_s"] - before["cpu_s"]
    per_request_us = cpu * 1e6 / requests if requests else None
    return {"requests_per_s": round(requests / elapsed, 1), "verified_signatures": after.get("requests"),
            "bad_signatures": after.get("bad_signatures"), "cpu_s": round(cpu, 3),
            "cpu_us_per_request": round(per_request_us, 1) if per_request_us else None,
            "ceiling_per_core_requests_per_s": round(1e6 / per_request_us) if per_request_us else None}


def bare_loop(events: int, workspaces: int = 100, processes: int = 2) -> dict[str, Any]:
    with bench_database("ceiling") as db, ReceiverProcess() as receiver:
        seed_endpoints(db.connect(), [[receiver.url("ok", f"ep{w}-{i}") for i in range(10)]
                                      for w in range(workspaces)])
        conn = db.connect()
        with conn.cursor() as cur:
            expected = insert_backlog(cur, workspaces, events, 1024)
            cur.execute("ANALYZE webhook_deliveries")
            cur.execute("ANALYZE events")
        conn.commit()
        conn.close()
        pg = PostgresProcesses(db.name)
        loops: list[subprocess.Popen[bytes]] = []
        meter = CpuMeter({"postgres": pg.ours, "receiver": lambda: process_tree(receiver.pid)}).start()
        loops.extend(bare_process("--dsn", db.dsn) for _ in range(processes))
        results = [bare_result(loop, 600) for loop in loops]
        cpu = meter.stop()
        # The loops report their own CPU (getrusage at exit, boot included): a
        # sampler would miss their last moments.
        cpu["dispatcher"] = round(sum(r["cpu_s"] for r in results), 3)
        pg.close()
        first_claim = min(r["first_claim"] for r in results if "first_claim" in r)
        last_done = float(db.scalar("SELECT extract(epoch FROM max(finished_at))::float8 FROM webhook_deliveries"))
        delivered = int(db.scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'"))
    seconds = last_done - first_claim
    return {"deliveries": expected, "delivered": delivered, "lost": expected - delivered,
            "processes": processes, "seconds": round(seconds, 3),
            "deliveries_per_s": round(expected / seconds, 1) if seconds > 0 else None, **cpu_split(cpu, expected)}


def run(tiny: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    seconds = 1.0 if tiny else 5.0
    result: dict[str, Any] = {
        "transports": transports(seconds, rounds=1 if tiny else 2),
        "receiver": receiver_ceiling(seconds),
        "bare_loop": bare_loop(50 if tiny else 20_000, workspaces=10 if tiny else 100),
    }
    result["met"] = None  # report only
    result["lost"] = result["bare_loop"]["lost"]
    best = result["transports"]["best_requests_per_s"]
    result["table"] = [
        ("urllib3 requests/s (1 proc, 32 greenlets)", best["urllib3"], "report (issue: ~2,700)"),
        ("geventhttpclient requests/s", best["geventhttpclient"], "report (issue: ~7,800)"),
        ("receiver requests/s (verifying)", result["receiver"]["requests_per_s"], "report"),
        ("receiver CPU us/request", result["receiver"]["cpu_us_per_request"], "report"),
        ("bare loop deliveries/s (2 procs)", result["bare_loop"]["deliveries_per_s"], "report"),
    ]
    result["seconds_total"] = round(time.monotonic() - started, 1)
    return result
