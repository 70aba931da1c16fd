"""``peer``: W1 by this project and by PgQueuer + aiohttp, alternating in one run.

W1: 100,000 signed 1 KiB POSTs over 1,000 endpoints (100 workspaces x 10; an
event goes to the 10 endpoints of its workspace), 2 worker processes, Debian's
nginx answering 204 (one nginx worker: the machine's 2 cores are shared by
Postgres, the senders, nginx and the harness).  Machines differ between
sessions by up to 3x, so the figure is the ratio measured here, now.

* **ours**: the throughput drain (benchmarks/throughput.py) with every feature
  on and nginx as the receiver: the backlog is inserted in one transaction
  while the dispatcher idles, the clock starts at that COMMIT and stops at the
  last delivery's ``finished_at``.
* **peer**: benchmarks/peers/pgqueuer_webhooks.py: 100,000 PgQueuer jobs
  enqueued in one batch and one transaction while 2 worker processes idle
  (each listening), the clock starts at that COMMIT and stops at the last
  ``successful`` row of PgQueuer's log, once nginx has logged every request
  and no job is left queued or picked.

Both clocks stop at a result recorded in the database; the time of the last
request nginx answered is reported too (``..._to_last_request``).  nginx does
not read bodies, so no signature is verified in this scenario: its access log
shows that every request carried ``webhook-id`` (= ``Idempotency-Key``),
``webhook-timestamp`` and a ``v1,`` signature.  Unique deliveries, duplicates
and losses are counted from that log by (path, ``Idempotency-Key``).

The peer at its best: first a sweep drains W1 itself (10,000 events, 100,000
deliveries, the same 1,000 endpoints) once per point of a grid of the peer's
tunings (``batch_size`` x ``max_concurrent_tasks``, see ``GRID``); the point with
the most deliveries/s is the peer's tuning for the comparison.  At W1's size,
not a smaller one: the peer's Postgres cost per job grows with its backlog, so a
smaller drain ranks its tunings differently (half of W1 picked 100 / 300, which
drains W1 at two thirds of 500 / 1,000's rate).  Then
runs alternate peer, ours, ours, peer (ABBA) ``rounds`` times at W1's full
size; the ratio is ours' median deliveries/s over the peer's (at its best
tuning).  Target: at least 1.6.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg2.extensions

from benchmarks.harness import (
    REPO,
    CpuMeter,
    MachineCpu,
    PostgresProcesses,
    load_average,
    server_dsn,
    server_setting,
    workdir,
)
from benchmarks.nginx import WORKER_PROCESSES, NginxReceiver, nginx_binary, nginx_version
from benchmarks.throughput import drain
from dispatcher_devtools.kit import SECRET, Database, WaitTimeout, process_tree, scratch_database

TARGET_RATIO = 1.6
ORDER = ("peer", "ours", "ours", "peer")
# The sweep: (batch_size, max_concurrent_tasks).  PgQueuer refuses fewer tasks than twice the
# batch, so of {50, 100, 500} x {100, 300, 1000} these six remain.  --tiny sweeps two of them.
GRID: tuple[tuple[int, int], ...] = ((50, 100), (50, 300), (50, 1000), (100, 300), (100, 1000), (500, 1000))
TINY_GRID: tuple[tuple[int, int], ...] = ((50, 100), (500, 1000))
ENDPOINTS_PER_WORKSPACE = 10
PAYLOAD_BYTES = 1024
BENCH_PACKAGES = ("pgqueuer", "aiohttp", "asyncpg")


class ToolMissing(RuntimeError):
    """nginx or the bench extra is not installed."""


def missing_tools() -> str | None:
    """Why the scenario cannot run here, or None."""
    try:
        nginx_binary()
    except RuntimeError as exc:
        return str(exc)
    missing = [name for name in BENCH_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return (f"the bench extra is not installed ({', '.join(missing)} missing): "
                f"pip install -e '.[bench]'")
    return None


@dataclass(frozen=True)
class PeerTuning:
    """The peer's knobs (benchmarks/peers/pgqueuer_webhooks.py has the defaults and why)."""

    batch_size: int
    max_concurrent_tasks: int
    queuers: int
    connections: int

    @classmethod
    def default(cls) -> PeerTuning:
        from benchmarks.peers import pgqueuer_webhooks as peer

        return cls(peer.BATCH_SIZE, peer.MAX_CONCURRENT_TASKS, peer.QUEUERS, peer.CONNECTIONS)

    def with_batch(self, batch_size: int, max_concurrent_tasks: int) -> PeerTuning:
        """This tuning with another batch size and cap on tasks in flight."""
        return dataclasses.replace(self, batch_size=batch_size, max_concurrent_tasks=max_concurrent_tasks)

    def arguments(self) -> list[str]:
        return ["--batch-size", str(self.batch_size), "--max-concurrent-tasks", str(self.max_concurrent_tasks),
                "--queuers", str(self.queuers), "--connections", str(self.connections)]


# --------------------------------------------------------------------------- the peer's run


def url_dsn(dsn: str) -> str:
    """``dsn`` (any syntax psycopg2 takes) as the postgresql:// URL asyncpg takes."""
    params = psycopg2.extensions.parse_dsn(dsn)
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host, port = params.pop("host", ""), params.pop("port", None)
    dbname = quote(params.pop("dbname", ""), safe="")
    if host.startswith("/"):  # a unix socket directory has no place in the URL's authority: it goes as ?host=
        params = {"host": host, **({"port": port} if port else {}), **params}
        host, port = "", None
    query = urlencode(params)
    return f"postgresql://{auth}{host}{':' + port if port else ''}/{dbname}" + (f"?{query}" if query else "")


class PeerWorkers:
    """``processes`` peer worker processes, each in its own process group, stopped with TERM."""

    def __init__(self, tmp: Path, dsn: str, processes: int, tuning: PeerTuning) -> None:
        self._tmp, self._dsn, self._count, self._tuning = tmp, dsn, processes, tuning
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> PeerWorkers:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                                             if p)}
        for index in range(self._count):
            command = [sys.executable, "-m", "benchmarks.peers.pgqueuer_webhooks", "worker", "--dsn", self._dsn,
                       "--secret", SECRET, "--ready-file", str(self._ready(index)), *self._tuning.arguments()]
            with open(self._log(index), "ab") as out:
                self.procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                   stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True))
        try:
            self._wait_ready(timeout=60.0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ready(self, index: int) -> Path:
        return self._tmp / f"peer-worker{index}.ready"

    def _log(self, index: int) -> Path:
        return self._tmp / f"peer-worker{index}.log"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(self._ready(i).exists() for i in range(self._count)):
            for index, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise RuntimeError(f"peer worker exited with {proc.returncode}: {self.tail(index)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"peer workers not listening within {timeout:.0f}s: {self.tail(0)}")
            time.sleep(0.05)

    def tail(self, index: int, chars: int = 3000) -> str:
        path = self._log(index)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def tree(self) -> list[Any]:
        return [p for proc in self.procs for p in process_tree(proc.pid)]

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _deliveries(events: int, workspaces: int, nginx: NginxReceiver) -> tuple[list[bytes], set[tuple[str, str]]]:
    """The peer's job payloads (the drain's events, in its order) and the (path, key) pairs expected."""
    from benchmarks.peers.pgqueuer_webhooks import job_payload

    occurred_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    pad = "x" * max(0, PAYLOAD_BYTES - 40)  # what insert_backlog pads the drain's payloads with
    payloads, expected = [], set()
    for g in range(events):
        workspace = g % workspaces
        event = {"id": f"evt-{g}", "type": "job.created", "workspace_id": f"ws{workspace}", "sequence": g,
                 "occurred_at": occurred_at, "data": {"job": f"j-{g}", "n": g, "pad": pad}}
        for index in range(ENDPOINTS_PER_WORKSPACE):
            key = f"ep{workspace}-{index}"
            payloads.append(job_payload(nginx.url("ok", key), event))
            expected.add((f"/{key}", event["id"]))
    return payloads, expected


def _wait_peer_drained(db: Database, nginx: NginxReceiver, count: int, timeout: float) -> None:
    """Until nginx logged ``count`` requests and no job is queued or picked.  The queue is looked
    at every 2 s before that (through its partial indexes: cheap) so a failing peer ends early."""
    deadline = time.monotonic() + timeout
    looked = time.monotonic()
    while True:
        if nginx.logged() >= count or time.monotonic() - looked > 2.0:
            looked = time.monotonic()
            if not db.scalar("SELECT EXISTS (SELECT 1 FROM pgqueuer WHERE status IN ('queued', 'picked'))"):
                return
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for the peer to drain")
        time.sleep(0.2)


def peer_drain(*, events: int, workspaces: int, processes: int = 2, tuning: PeerTuning | None = None,
               label: str = "peer_pgqueuer", timeout: float = 600.0) -> dict[str, Any]:
    """W1 by PgQueuer + aiohttp: seed, enqueue in one batch, drain, count."""
    from benchmarks.peers import pgqueuer_webhooks as peer

    tuning = tuning or PeerTuning.default()
    name = f"bench_{label}_{os.getpid()}"
    with scratch_database(server_dsn(), name, replace=True, quiet_drop=True,
                          application_name="benchmark harness") as db, workdir(label) as tmp, \
            NginxReceiver(tmp) as nginx:
        dsn = url_dsn(db.dsn)
        asyncio.run(peer.install(dsn))
        payloads, expected = _deliveries(events, workspaces, nginx)
        pg = PostgresProcesses(db.name, sender_apps=(peer.APPLICATION_NAME,))
        try:
            with PeerWorkers(tmp, dsn, processes, tuning) as workers:
                started: dict[str, Any] = {}

                def start_meters() -> None:
                    started["load"] = load_average()
                    started["meter"] = CpuMeter({"senders": workers.tree, **pg.groups(),
                                                 "receiver": lambda: process_tree(nginx.pid),
                                                 "harness": lambda: process_tree(os.getpid())[:1]}).start()
                    started["machine"] = MachineCpu()

                committed = asyncio.run(peer.enqueue(dsn, payloads, before_commit=start_meters))
                del payloads
                try:
                    _wait_peer_drained(db, nginx, len(expected), timeout)
                finally:
                    cpu = started["meter"].stop()
                    machine_load = started["machine"].stop(cpu["senders"] + cpu["postgres_all_databases"]
                                                           + cpu["receiver"] + cpu["harness"])
                load_after = load_average()
        finally:
            pg.close()
        nginx.wait_logged(len(expected), timeout=10.0)
        log = nginx.figures()
        last_recorded = db.scalar("SELECT extract(epoch FROM max(created))::float8 FROM pgqueuer_log "
                                  "WHERE status = 'successful'")
        statuses = {str(k): int(v) for k, v in db.query("SELECT status, count(*) FROM pgqueuer_log GROUP BY 1")}
        left = int(db.scalar("SELECT count(*) FROM pgqueuer"))
    return _figures("peer", len(expected), committed, last_recorded, log, expected, cpu, machine_load,
                    started["load"], load_after,
                    extra={"tuning": asdict(tuning), "pgqueuer_log": statuses, "jobs_left": left})


# --------------------------------------------------------------------------- figures common to both


def _figures(system: str, deliveries: int, committed: float, last_recorded: float | None, log: Any,
             expected: set[tuple[str, str]] | None, cpu: dict[str, float], machine_load: dict[str, float],
             load_before: list[float], load_after: list[float], extra: dict[str, Any]) -> dict[str, Any]:
    """One run's figures in the same shape for both systems."""
    seconds = None if last_recorded is None else last_recorded - committed
    to_request = None if log.last_at is None else log.last_at - committed
    # The same names for both systems' CPU groups: "senders" are the dispatcher's or the peer's workers.
    cpu = {("postgres_senders" if k == "postgres_dispatcher" else k): v for k, v in cpu.items()}
    received = log.pairs & expected if expected is not None else log.pairs
    lost = deliveries - len(received)
    return {
        "system": system,
        "deliveries": deliveries,
        "seconds": None if seconds is None else round(seconds, 3),
        "deliveries_per_s": round(deliveries / seconds, 1) if seconds else None,
        "seconds_to_last_request": None if to_request is None else round(to_request, 3),
        "deliveries_per_s_to_last_request": round(deliveries / to_request, 1) if to_request else None,
        "lost": lost,
        "duplicates": log.duplicates,
        "unexpected": len(log.pairs - received),
        "requests": log.requests,
        "statuses": dict(sorted(log.statuses.items())),
        "signature_headers_missing": log.signature_headers_missing,
        "id_mismatch": log.id_mismatch,
        "receiver_connections": len(log.connections),
        "cpu_s": cpu,
        "cpu_ms_per_delivery": {k: round(v * 1000.0 / deliveries, 3) for k, v in cpu.items()},
        "machine": machine_load,
        "load_average_before": load_before,
        "load_average_after": load_after,
        **extra,
    }


def ours_drain(*, events: int, workspaces: int, processes: int = 2, client: str | None = None) -> dict[str, Any]:
    """W1 by this project: the throughput drain with nginx as the receiver."""
    captured: dict[str, Any] = {}
    result = drain(events=events, workspaces=workspaces, processes=processes, client=client, receiver_kind="nginx",
                   label="peer_ours", keep_receiver=lambda nginx: captured.update(log=nginx.figures()))
    log, committed = captured["log"], result["committed_at"]
    expected = {(f"/ep{g % workspaces}-{i}", f"evt-{g}") for g in range(events)
                for i in range(ENDPOINTS_PER_WORKSPACE)}
    cpu = result["cpu_s"]
    common = {"senders": cpu["dispatcher"], **{k: v for k, v in cpu.items() if k != "dispatcher"}}
    figures = _figures("ours", result["deliveries"], committed, committed + result["seconds"], log, expected,
                       common, result["machine"], result["load_average_before"], result["load_average_after"],
                       extra={"statuses_db": result["statuses"], "attempt_rows": result["attempt_rows"],
                              "client": result["client"], "log": result["log"]})
    figures["lost"] = max(figures["lost"], result["lost"])
    return figures


# --------------------------------------------------------------------------- the scenario


def _versions() -> dict[str, str]:
    versions = {"nginx": nginx_version()}
    for name in (*BENCH_PACKAGES, "uvloop"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def _median(runs: list[dict[str, Any]], system: str, key: str) -> float | None:
    values = [r[key] for r in runs if r["system"] == system and r.get(key)]
    return round(statistics.median(values), 1) if values else None


def _ratio(ours: float | None, peer: float | None) -> float | None:
    return round(ours / peer, 3) if ours and peer else None


def _sweep_point(tuning: PeerTuning, *, events: int, workspaces: int, processes: int) -> dict[str, Any]:
    """One grid point's drain, in a few figures; a failing point reports its error."""
    point: dict[str, Any] = {"batch_size": tuning.batch_size, "max_concurrent_tasks": tuning.max_concurrent_tasks}
    try:
        found = peer_drain(events=events, workspaces=workspaces, processes=processes, tuning=tuning,
                           label="peer_sweep")
    except Exception as exc:  # one bad tuning must not end the sweep
        return {**point, "error": f"{type(exc).__name__}: {exc}", "deliveries_per_s": None}
    cpu = found["cpu_ms_per_delivery"]
    return {**point, **{key: found[key] for key in ("deliveries", "seconds", "deliveries_per_s", "lost",
                                                    "duplicates", "load_average_before")},
            "cpu_ms_per_delivery": {key: cpu.get(key) for key in ("senders", "postgres", "receiver")},
            "others_cores": found["machine"]["others_cores"]}


def sweep(grid: tuple[tuple[int, int], ...], *, events: int, workspaces: int,
          processes: int) -> tuple[PeerTuning, dict[str, Any]]:
    """Drain once per grid point; the fastest clean point's tuning (the default when none is clean)
    and the sweep's figures."""
    base = PeerTuning.default()
    points = [_sweep_point(base.with_batch(batch, tasks), events=events, workspaces=workspaces,
                           processes=processes) for batch, tasks in grid]
    clean = [p for p in points if p.get("deliveries_per_s") and not p.get("lost") and not p.get("duplicates")]
    best = max(clean, key=lambda p: p["deliveries_per_s"], default=None)
    tuning = base if best is None else base.with_batch(best["batch_size"], best["max_concurrent_tasks"])
    return tuning, {"deliveries": events * ENDPOINTS_PER_WORKSPACE, "events": events, "points": points,
                    "best": None if best is None else {"batch_size": best["batch_size"],
                                                       "max_concurrent_tasks": best["max_concurrent_tasks"],
                                                       "deliveries_per_s": best["deliveries_per_s"]}}


def run(tiny: bool = False, client: str | None = None, processes: int = 2, rounds: int = 1) -> dict[str, Any]:
    reason = missing_tools()
    if reason is not None:
        raise ToolMissing(f"the peer scenario cannot run: {reason}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    events, workspaces = (20, 5) if tiny else (10_000, 100)
    tuning, swept = sweep(TINY_GRID if tiny else GRID, events=events,
                          workspaces=workspaces, processes=processes)
    runs = []
    for system in ORDER * rounds:
        if system == "peer":
            runs.append(peer_drain(events=events, workspaces=workspaces, processes=processes, tuning=tuning))
        else:
            runs.append(ours_drain(events=events, workspaces=workspaces, processes=processes, client=client))
    ours, peer = _median(runs, "ours", "deliveries_per_s"), _median(runs, "peer", "deliveries_per_s")
    ratio = _ratio(ours, peer)
    ratio_to_request = _ratio(_median(runs, "ours", "deliveries_per_s_to_last_request"),
                              _median(runs, "peer", "deliveries_per_s_to_last_request"))
    problems = {key: sum(r[key] for r in runs) for key in ("lost", "duplicates", "unexpected",
                                                             "signature_headers_missing", "id_mismatch")}
    result: dict[str, Any] = {
        "workload": {"name": "W1", "deliveries": events * ENDPOINTS_PER_WORKSPACE,
                     "endpoints": workspaces * ENDPOINTS_PER_WORKSPACE, "payload_bytes": PAYLOAD_BYTES,
                     "worker_processes": processes},
        "receiver": {"kind": "nginx", "worker_processes": WORKER_PROCESSES,
                     "note": "one nginx worker: the 2 cores are shared by Postgres, both systems' workers, "
                             "nginx and the harness",
                     "signatures": "not verified (nginx does not read bodies); every request's webhook-id, "
                                   "webhook-timestamp and v1 signature header are checked in its access log"},
        "versions": _versions(),
        # The ratio depends on it: at the stock 128 MB the peer's tables (a 1 KiB payload in every job)
        # outgrow it and its Postgres reads pages back from the OS cache, about 26 a delivery; at 1 GB it
        # does not (docs/benchmarks.md, "Why hosts rank the engines differently").
        "postgres_shared_buffers": server_setting("shared_buffers"),
        "peer_tuning": asdict(tuning),
        "sweep": swept,
        "order": [r["system"] for r in runs],
        "runs": runs,
        "ours_median_per_s": ours,
        "peer_median_per_s": peer,
        "ratio": ratio,
        "ratio_to_last_request": ratio_to_request,
        "target_ratio": TARGET_RATIO,
        **problems,
    }
    result["met"] = bool(ratio is not None and ratio >= TARGET_RATIO and not any(problems.values()))
    result["table"] = [
        (f"peer sweep, batch {p['batch_size']} / tasks {p['max_concurrent_tasks']}: deliveries/s",
         p.get("deliveries_per_s") or p.get("error", "-")[:40], f"report ({swept['deliveries']:,} each)")
        for p in swept["points"]]
    result["table"] += [
        ("peer's best: batch / tasks", f"{tuning.batch_size} / {tuning.max_concurrent_tasks}", "report"),
        ("ours deliveries/s (median)", ours, "report"),
        ("PgQueuer + aiohttp deliveries/s (median, best tuning)", peer, "report"),
        ("ratio ours / peer", ratio, f">= {TARGET_RATIO}"),
        ("ratio to the last request nginx answered", ratio_to_request, "report"),
        ("lost / duplicates", f"{problems['lost']} / {problems['duplicates']}", "0 / 0"),
        ("requests without signature headers", problems["signature_headers_missing"], "0"),
        ("Postgres shared_buffers (the peer's page reads depend on it)", result["postgres_shared_buffers"],
         "report"),
    ]
    return result
