"""``internet``: 10,000 endpoints (1,000 workspaces x 10) that answer like the internet does.

Every endpoint belongs to one class, drawn once (seeded) and fixed for the run:

* healthy (94.5 %): 200 after a log-normal delay, median 120 ms, p99 2 s;
* error (3 %): the same delays, then 500;
* hang (1 %): never answers; the attempt ends at ``http.timeout`` (10 s);
* refuse (1 %): a closed port on 127.0.0.1, its own per endpoint (connection refused);
* drip (0.5 %): 200, sent one byte a second, so the attempt's whole-answer
  deadline (``http.timeout``) ends it.

Producers offer 1,160 deliveries/s (116 events/s, each fanned out to its
workspace's 10 endpoints) through ``WebhookSender.send`` for five minutes
(``--duration`` or ``$BENCH_INTERNET_SECONDS``), with every production
default (timeout, retries, breaker, ``max_in_flight``).

The no-fault baseline is a phase of its own, run first in the same
invocation: the same 10,000 endpoints all answering as healthy ones do, the
same offered load, for a fifth of the faulty phase (at least 20 s), on a fresh
database and dispatcher.  A control group measured during the faulty run
would not do: it would share the faults' cost.  Figures:

* commit -> first attempt p50/p99 (targets 100 ms / 1 s) over the healthy
  endpoints' deliveries (a faulty endpoint's rows wait for its open breaker
  by design), and over all endpoints for the record;
* healthy endpoints' commit -> 2xx p99, against the baseline's (<= 1.25x);
* breakers opened, by endpoint class;
* worker RSS and open file descriptors, sampled every second: the max, and
  the mean of the last third of the run against the middle third (bounded:
  at most 10 % more; descriptors are also bounded when they stay under the
  idle worker's count plus one per ``max_in_flight`` slot, see
  :func:`resource_trend`);
* the rows each worker holds (queued + sending, its own count, reported once a
  second) against ``max_in_flight`` (``--max-in-flight`` changes it), and the
  age of the healthy endpoints' due backlog: a worker at its cap while due rows
  age is a worker the cap limits.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from benchmarks.harness import (
    DispatcherRun,
    EngineSetup,
    MachineCpu,
    cpu_split,
    engine_setup,
    load_average,
    summary_ms,
)
from benchmarks.load import age_summary, read_commits, sample_backlog, start_producer, wait_delivered
from dispatcher.config import WorkersConfig
from dispatcher_devtools.kit import Database, WaitTimeout, process_tree, seed_endpoints, wait_until
from dispatcher_devtools.receiver import ReceiverProcess, closed_port_url

RATE = 1160.0                # deliveries/s offered, as in ``sustained``
PER_WORKSPACE = 10
WORKSPACES = 1000
DEFAULT_SECONDS = 300.0
SECONDS_ENV = "BENCH_INTERNET_SECONDS"
BASELINE_SHARE, BASELINE_MIN_SECONDS = 0.2, 20.0
MEDIAN_MS, P99_MS = 120, 2000
TINY_LATENCY_MS = (20, 200)   # --tiny: the same shapes, scaled down, so the smoke test ends in seconds
FAULTS: tuple[tuple[str, float], ...] = (("hang", 0.01), ("error", 0.03), ("refuse", 0.01), ("drip", 0.005))
PAYLOAD_BYTES = 1024
TARGETS = {"first_attempt_p50_ms": 100.0, "first_attempt_p99_ms": 1000.0, "healthy_p99_ratio": 1.25,
           "growth": 1.10}
FD_SLACK = 32                 # descriptors a worker opens besides its connections to receivers (logs, DNS, ...)
AT_CAP_SHARE = 0.05


def endpoint_classes(count: int, faults: bool, seed: int = 14) -> list[str]:
    """The class of each of ``count`` endpoints: FAULTS' shares (rounded) when ``faults``, the rest healthy."""
    classes = [name for name, share in FAULTS for _ in range(round(count * share))] if faults else []
    classes += ["healthy"] * (count - len(classes))
    random.Random(seed).shuffle(classes)
    return classes


def endpoint_url(receiver: ReceiverProcess, kind: str, key: str,
                 latency_ms: tuple[float, float] = (MEDIAN_MS, P99_MS)) -> str:
    """The URL of an endpoint of class ``kind``; ``latency_ms``: the answers' (median, p99)."""
    median, p99 = latency_ms
    if kind == "healthy":
        return receiver.url("latency", key, median_ms=median, p99=p99)
    if kind == "error":
        return receiver.url("error", key, median_ms=median, p99=p99, status=500)
    if kind in ("hang", "drip"):
        return receiver.url(kind, key)
    if kind == "refuse":
        return closed_port_url(key)
    raise ValueError(f"unknown endpoint class {kind!r}")


def duration(seconds: float | None) -> float:
    """The faulty phase's length: the argument, else $BENCH_INTERNET_SECONDS, else five minutes."""
    if seconds is not None:
        return seconds
    text = os.environ.get(SECONDS_ENV)
    if not text:
        return DEFAULT_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"${SECONDS_ENV} must be a number of seconds, not {text!r}") from None
    if value <= 0:
        raise ValueError(f"${SECONDS_ENV} must be positive, not {text!r}")
    return value


# --------------------------------------------------------------------------- sampling


def _sample_workers(db: Database, dispatcher: DispatcherRun, samples: list[dict[str, float]],
                    stop: threading.Event) -> None:
    """Once a second: the largest worker RSS and descriptor count, and the most rows one worker holds.
    The first sample is taken at once, before the producers start: the idle workers."""
    started = time.monotonic()
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                rss, fds = [], []
                for pid in dispatcher.worker_pids():
                    try:
                        proc = psutil.Process(pid)
                        rss.append(proc.memory_info().rss)
                        fds.append(proc.num_fds())
                    except psutil.Error:
                        continue
                # The workers' own count (queued + sending), written every status_interval.
                cur.execute("SELECT in_flight FROM dispatcher_processes")
                held = [int(row[0]) for row in cur.fetchall()]
                if rss:
                    samples.append({"t": round(time.monotonic() - started, 1), "rss_mb": round(max(rss) / 2**20, 1),
                                    "fds": max(fds), "held": max(held, default=0)})
                stop.wait(1.0)
    finally:
        conn.close()


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def resource_trend(samples: Sequence[dict[str, float]], name: str, ceiling: float | None = None) -> dict[str, Any]:
    """Max of ``name`` over the samples, and the last third's mean against the middle third's.

    Bounded: the last third at most ``growth`` above the middle third or, given a
    ``ceiling`` the value can never pass by construction (descriptors: the idle
    worker's plus one socket per row it may hold), the max within it.  Descriptors
    follow the connection pools' high-water mark, which a late peak of concurrency
    raises for good: a step, not a leak, and never past the ceiling.
    """
    values = [s[name] for s in samples]
    third = len(values) // 3
    middle, last = _mean(values[third:2 * third]), _mean(values[2 * third:])
    grew = None if middle is None or last is None else round(last / middle, 3) if middle else None
    bounded = grew is not None and grew <= TARGETS["growth"]
    if ceiling is not None and values:
        bounded = bounded or max(values) <= ceiling
    return {"max": max(values, default=None), "first": values[0] if values else None,
            "middle_third_mean": middle, "last_third_mean": last, "last_to_middle": grew, "ceiling": ceiling,
            "bounded": bounded}


# --------------------------------------------------------------------------- one phase


@dataclass(frozen=True)
class Endpoints:
    """The seeded endpoints: ids in workspace order, and the class of each by id and by receiver key."""

    ids: list[int]
    kind_of_id: dict[int, str]
    kind_of_key: dict[str, str]

    @property
    def faulty_ids(self) -> list[int]:
        return [i for i, kind in self.kind_of_id.items() if kind != "healthy"]

    def classes(self) -> dict[str, int]:
        kinds = list(self.kind_of_id.values())
        return {kind: kinds.count(kind) for kind in sorted(set(kinds))}

    def healthy_deliveries(self, commits: dict[str, tuple[str, float]]) -> int:
        """How many of the committed events' deliveries go to healthy endpoints."""
        per_workspace = {f"ws{w}": sum(self.kind_of_id[i] == "healthy" for i in self.ids[start:start + PER_WORKSPACE])
                         for w, start in enumerate(range(0, len(self.ids), PER_WORKSPACE))}
        return sum(per_workspace[workspace] for workspace, _ in commits.values())


def _seed(setup: EngineSetup, faults: bool, workspaces: int, tiny: bool) -> Endpoints:
    classes = endpoint_classes(workspaces * PER_WORKSPACE, faults)
    keys = [f"{kind}-{index}" for index, kind in enumerate(classes)]
    latency = TINY_LATENCY_MS if tiny else (MEDIAN_MS, P99_MS)
    flat = [endpoint_url(setup.receiver, kind, key, latency) for kind, key in zip(classes, keys, strict=True)]
    urls = [flat[start:start + PER_WORKSPACE] for start in range(0, len(flat), PER_WORKSPACE)]
    ids = [endpoint_id for row in seed_endpoints(setup.db.connect(), urls) for endpoint_id in row]
    return Endpoints(ids, dict(zip(ids, classes, strict=True)), dict(zip(keys, classes, strict=True)))


@dataclass
class Sampled:
    """What the run measured while the producers ran."""

    commits: dict[str, tuple[str, float]] = field(default_factory=dict)
    ages: list[float] = field(default_factory=list)
    workers: list[dict[str, float]] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    machine: dict[str, float] = field(default_factory=dict)
    load_before: list[float] = field(default_factory=list)
    load_after: list[float] = field(default_factory=list)


def _offer(setup: EngineSetup, dispatcher: DispatcherRun, endpoints: Endpoints, *, rate: float, seconds: float,
           workspaces: int) -> Sampled:
    """Produce ``rate`` deliveries/s for ``seconds`` while sampling the backlog and the workers."""
    db, sampled = setup.db, Sampled(load_before=load_average())
    producing: list[int] = []
    meter = setup.cpu_meter(dispatcher, producer_process=lambda: process_tree(producing[0]) if producing else [])
    machine_cpu = MachineCpu()
    stop = threading.Event()
    # Once a second, not four times: with faulty endpoints' rows pending, each sample reads thousands of rows.
    samplers = [threading.Thread(target=sample_backlog, args=(db, endpoints.faulty_ids, sampled.ages, stop, 1.0),
                                 daemon=True),
                threading.Thread(target=_sample_workers, args=(db, dispatcher, sampled.workers, stop), daemon=True)]
    for sampler in samplers:
        sampler.start()
    out_path = setup.tmp / "produced.csv"
    routes = [(f"ws{w}", 1.0 / workspaces) for w in range(workspaces)]
    producer = start_producer(db, dispatcher, routes, rate / PER_WORKSPACE, seconds, PAYLOAD_BYTES, out_path)
    producing.append(producer.pid or 0)
    producer.join(seconds + 60)
    stop.set()
    for sampler in samplers:
        sampler.join(5)
    sampled.cpu = meter.stop()
    sampled.machine = machine_cpu.stop(sampled.cpu["dispatcher"] + sampled.cpu["postgres_all_databases"]
                                       + sampled.cpu["receiver"])
    sampled.load_after = load_average()
    sampled.commits = read_commits(out_path)
    return sampled


def _phase(label: str, *, faults: bool, seconds: float, rate: float, workspaces: int, client: str | None,
           processes: int, tiny: bool, max_in_flight: int | None) -> dict[str, Any]:
    with engine_setup(label, receiver_seed=7) as setup:
        db = setup.db
        endpoints = _seed(setup, faults, workspaces, tiny)
        http: dict[str, Any] = {"client": client} if client else {}
        retry: dict[str, Any] = {}
        if tiny:  # hangs and drips end sooner, and a healthy answer cut by that timeout is retried sooner
            http["timeout"], retry["base"] = "1s", "200ms"
        # status_interval 1 s: the workers report what they hold once a second (a HOT update each).
        workers: dict[str, Any] = {"processes": processes, "status_interval": "1s"}
        if max_in_flight is not None:
            workers["max_in_flight"] = max_in_flight
        config = setup.config(workers=workers, http=http, retry=retry)
        with DispatcherRun(setup.tmp, config) as dispatcher:
            dispatcher.wait_ready(processes)
            sampled = _offer(setup, dispatcher, endpoints, rate=rate, seconds=seconds, workspaces=workspaces)
            healthy_expected = endpoints.healthy_deliveries(sampled.commits)
            drained = wait_delivered(db, endpoints.faulty_ids, healthy_expected, 20.0 if tiny else 60.0)
            # The last rows of hanging or dripping endpoints finish their first attempt at the timeout.
            with contextlib.suppress(WaitTimeout):
                wait_until(lambda: not db.scalar("SELECT count(*) FROM webhook_deliveries d LEFT JOIN endpoint_state s "
                                                 "USING (endpoint_id) WHERE d.attempt = 0 "
                                                 "AND coalesce(s.state, 'closed') = 'closed'"),
                           timeout=2.0 if tiny else 15.0, interval=0.2)
            first_attempts = db.query(
                """SELECT d.event_id, d.endpoint_id, extract(epoch FROM a.started_at)::float8
                     FROM webhook_delivery_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
                    WHERE a.attempt = 1""")
            breakers = db.query("SELECT endpoint_id, state, opened_at IS NOT NULL FROM endpoint_state")
            statuses = dict(db.query("SELECT status, count(*) FROM webhook_deliveries GROUP BY 1"))
        first_2xx = [(d.webhook_id, d.endpoint, d.first_2xx_ts) for d in setup.receiver.iter_deliveries()
                     if d.first_2xx_ts]
        stats = setup.receiver.stats(fast=True)
        log_counts = dispatcher.log_counts()
    commits, kind_of_id = sampled.commits, endpoints.kind_of_id
    to_first = [(kind_of_id[endpoint], stamp - commits[event][1]) for event, endpoint, stamp in first_attempts
                if event in commits]
    to_2xx = [stamp - commits[event][1] for event, key, stamp in first_2xx
              if event in commits and endpoints.kind_of_key.get(key) == "healthy"]
    opened: dict[str, int] = {}
    for endpoint, _, ever_opened in breakers:
        if ever_opened:
            opened[kind_of_id[endpoint]] = opened.get(kind_of_id[endpoint], 0) + 1
    held = [s["held"] for s in sampled.workers]
    cap = config["workers"].get("max_in_flight", WorkersConfig().max_in_flight)
    return {
        "seconds": seconds, "offered_per_s": rate, "endpoints": len(endpoints.ids),
        "endpoint_classes": endpoints.classes(), "events": len(commits),
        "deliveries": sum(statuses.values()), "lost": len(commits) * PER_WORKSPACE - sum(statuses.values()),
        "healthy_deliveries": healthy_expected, "healthy_delivered": len(to_2xx), "drained": drained,
        "statuses": {str(k): int(v) for k, v in statuses.items()},
        "commit_to_first_attempt_healthy": summary_ms([d for kind, d in to_first if kind == "healthy"]),
        "commit_to_first_attempt_all": summary_ms([d for _, d in to_first]),
        "healthy_commit_to_2xx": summary_ms(to_2xx),
        "healthy_backlog_age": age_summary(sampled.ages),
        "breakers_opened": opened,
        "breakers_open_at_end": sum(1 for _, state, _ in breakers if state != "closed"),
        "worker_rss_mb": resource_trend(sampled.workers, "rss_mb"),
        "worker_open_fds": resource_trend(sampled.workers, "fds", sampled.workers[0]["fds"] + cap + FD_SLACK
                                          if sampled.workers else None),
        "worker_samples": sampled.workers,
        "held_rows": {"max_in_flight": cap, "max": max(held, default=0), "mean": _mean(held),
                      "samples_at_cap": sum(1 for h in held if h >= 0.95 * cap), "samples": len(held)},
        "receiver": {"requests": stats.get("requests"), "bad_signatures": stats.get("bad_signatures")},
        **cpu_split(sampled.cpu, len(first_attempts)),
        "machine": sampled.machine, "log": log_counts,
        "load_average_before": sampled.load_before, "load_average_after": sampled.load_after,
    }


# --------------------------------------------------------------------------- the scenario


def run(tiny: bool = False, client: str | None = None, processes: int = 2,
        seconds: float | None = None, max_in_flight: int | None = None) -> dict[str, Any]:
    faulty_seconds = 2.0 if tiny and seconds is None else duration(seconds)
    baseline_seconds = 1.0 if tiny else max(BASELINE_MIN_SECONDS, faulty_seconds * BASELINE_SHARE)
    workspaces = 20 if tiny else WORKSPACES
    rate = 100.0 if tiny else RATE
    common = {"rate": rate, "workspaces": workspaces, "client": client, "processes": processes, "tiny": tiny,
              "max_in_flight": max_in_flight}
    baseline = _phase("internet_baseline", faults=False, seconds=baseline_seconds, **common)
    faulty = _phase("internet", faults=True, seconds=faulty_seconds, **common)
    return summarize(baseline, faulty)


def summarize(baseline: dict[str, Any], faulty: dict[str, Any]) -> dict[str, Any]:
    first = faulty["commit_to_first_attempt_healthy"]
    p99, base_p99 = faulty["healthy_commit_to_2xx"]["p99_ms"], baseline["healthy_commit_to_2xx"]["p99_ms"]
    ratio = round(p99 / base_p99, 3) if p99 is not None and base_p99 else None
    rss, fds, held = faulty["worker_rss_mb"], faulty["worker_open_fds"], faulty["held_rows"]
    met = {
        "first_attempt_p50": (first["p50_ms"] or 1e9) <= TARGETS["first_attempt_p50_ms"],
        "first_attempt_p99": (first["p99_ms"] or 1e9) <= TARGETS["first_attempt_p99_ms"],
        "healthy_p99_ratio": ratio is not None and ratio <= TARGETS["healthy_p99_ratio"],
        "rss_bounded": bool(rss["bounded"]),
        "fds_bounded": bool(fds["bounded"]),
        "nothing_lost": faulty["lost"] == 0 and baseline["lost"] == 0,
    }
    opened = faulty["breakers_opened"]
    return {
        "commit_to_first_attempt": first,
        "healthy_commit_to_2xx_p99_ms": p99,
        "baseline_healthy_commit_to_2xx_p99_ms": base_p99,
        "healthy_p99_ratio_to_baseline": ratio,
        "breakers_opened": opened,
        "worker_rss_mb": rss,
        "worker_open_fds": fds,
        # Limited: at the cap in at least 5 % of the samples (a worker at its cap claims nothing more).
        "max_in_flight_limited": held["samples_at_cap"] >= AT_CAP_SHARE * max(1, held["samples"]),
        "lost": faulty["lost"] + baseline["lost"],
        "targets": TARGETS,
        "met_by_target": met,
        "met": all(met.values()),
        "faulty": faulty,
        "baseline": baseline,
        "table": [
            ("commit->1st attempt p50 ms (healthy)", first["p50_ms"], f"<= {TARGETS['first_attempt_p50_ms']:g}"),
            ("commit->1st attempt p99 ms (healthy)", first["p99_ms"], f"<= {TARGETS['first_attempt_p99_ms']:g}"),
            ("commit->1st attempt p99 ms (all)", faulty["commit_to_first_attempt_all"]["p99_ms"], "report"),
            ("healthy commit->2xx p99 ms", p99, "report"),
            ("  no-fault baseline p99 ms", base_p99, "report"),
            ("  ratio to baseline", ratio, f"<= {TARGETS['healthy_p99_ratio']}"),
            ("breakers opened (of faulty)", f"{sum(opened.values())} "
             f"({', '.join(f'{k} {v}' for k, v in sorted(opened.items()))})",
             f"{sum(n for k, n in faulty['endpoint_classes'].items() if k != 'healthy')} faulty endpoints"),
            ("worker RSS MB max (mid/last third)", f"{rss['max']} ({rss['middle_third_mean']}/"
             f"{rss['last_third_mean']})", "bounded"),
            ("worker open fds max (mid/last third)", f"{fds['max']} ({fds['middle_third_mean']}/"
             f"{fds['last_third_mean']})", f"bounded (max <= {fds['ceiling']})"),
            ("rows held per worker mean / max / cap", f"{held['mean']} / {held['max']} / {held['max_in_flight']}",
             f"limited if >= 95 % of cap in {AT_CAP_SHARE:.0%} of samples"),
            ("  samples at the cap", f"{held['samples_at_cap']} of {held['samples']}", "report"),
            ("lost", faulty["lost"] + baseline["lost"], "0"),
        ],
    }
