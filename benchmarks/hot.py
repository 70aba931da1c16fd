"""``hot``: how fast one busy endpoint drains, against what its slots allow.

An endpoint gets ``workers.per_endpoint_concurrency`` (4, region-wide)
requests in flight at most, so its ceiling is what 4 keep-alive connections
can do against it.  Each case measures that ceiling in the same run: before
and after the drain, with the dispatcher up and idle, ``benchmarks.bare_loop
--probe`` (gevent + the engine's HTTP client, 4 greenlets on a pool of 4
keep-alive connections, a signed 1 KiB body) POSTs for a few seconds to a
sibling endpoint of the same receiver with the same profile; the better of the
two is the ceiling.  Every feature is on (``bench_config``: signing, history,
statsd, INFO logs, the breaker, region-wide limits), 2 worker processes.  The
clock starts at the COMMIT of the backlog and stops at the last watched row's
``finished_at``.

Cases:

* ``one_endpoint_10ms``: 1 workspace, 1 endpoint, the mock receiver answering
  after 10 ms, 3,000 pending; target ratio to the ceiling >= 0.9;
* ``one_endpoint_fast``: the same with a receiver answering at once (nginx's
  204 when installed, else the mock at 0 ms; ``receiver`` says which), 10,000
  pending; target >= 0.5;
* ``spread_100_vs_1000``: the throughput drain (W1's shape: each event to the 10
  endpoints of its workspace) over 10 x 10 endpoints, then over 100 x 10, 100,000
  pending each; target rate(100) / rate(1,000) >= 0.9;
* ``hot_among_999``: 999 endpoints with 50 pending each, alone and next to a hot
  endpoint with 50,000 (inserted first), in 5 adjacent pairs of drains (2 with
  ``--tiny``), every endpoint answering after 10 ms; the clock of each stops when
  the 999 have drained (the hot endpoint is not waited for).  Targets: the median
  of the pairs' time ratios (with the hot one / without) <= 1.1,
  and at most 4 requests in flight on any one endpoint (the mock receiver's
  ``max_concurrency``, global across its processes).
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.ceiling import bare_process, bare_result
from benchmarks.harness import (
    DispatcherRun,
    EngineSetup,
    drained_probe,
    engine_setup,
    insert_backlog,
    load_average,
    paired_order,
)
from benchmarks.nginx import NginxMissing, nginx_binary
from benchmarks.throughput import drain
from dispatcher_devtools.kit import SECRET, seed_workspaces, wait_until

SLOTS = 4                     # workers.per_endpoint_concurrency, set explicitly; the ceiling's clients
LATENCY_MS = 10
PAYLOAD_BYTES = 1024
TARGETS = {"one_endpoint_10ms": 0.9, "one_endpoint_fast": 0.5, "spread": 0.9, "hot_time_ratio": 1.1}
FLOOR_PER_S = 10.0            # a drain's timeout assumes at least this rate (the engine's is far above)


@dataclass(frozen=True)
class Sizes:
    one_10ms: int             # pending rows on the one endpoint
    one_fast: int
    spread_events: int        # events of the spread drains (x 10 endpoints each)
    hot: int                  # the hot endpoint's rows
    others_each: int          # each of the 999 others' rows
    probe_s: float            # seconds of each ceiling probe
    among_pairs: int          # hot_among_999's pairs of drains (without / with the hot endpoint)


FULL = Sizes(one_10ms=3_000, one_fast=10_000, spread_events=10_000, hot=50_000, others_each=50, probe_s=5.0,
             among_pairs=5)
TINY = Sizes(one_10ms=200, one_fast=500, spread_events=200, hot=2_000, others_each=5, probe_s=1.0,
             among_pairs=2)


@dataclass(frozen=True)
class Block:
    """Backlog rows: ``events`` events over ``workspaces`` workspaces from ``ws<offset>``, one row
    per (event, endpoint of its workspace)."""

    offset: int
    workspaces: int
    events: int


# --------------------------------------------------------------------------- measuring


def probe_ceiling(url: str, seconds: float, client: str | None) -> float:
    """2xx answers per second of ``SLOTS`` keep-alive clients POSTing a signed 1 KiB body to ``url``."""
    found = bare_result(bare_process("--probe", url, "--client", client or "geventhttpclient", "--seconds",
                                     str(seconds), "--concurrency", str(SLOTS), "--secret", SECRET), seconds + 60)
    return round(found["requests"] / found["seconds"], 1) if found["seconds"] else 0.0


def _group(setup: EngineSetup, ids: list[int], committed: float) -> dict[str, Any]:
    """Rows, delivered rows, seconds from the COMMIT to the last one's ``finished_at`` and the rate."""
    rows, delivered, last = setup.db.query(
        """SELECT count(*), count(*) FILTER (WHERE status = 'delivered'),
                  extract(epoch FROM max(finished_at) FILTER (WHERE status = 'delivered'))::float8
             FROM webhook_deliveries WHERE endpoint_id = ANY (%s)""", (ids,))[0]
    seconds = None if last is None else last - committed
    return {"rows": int(rows), "delivered": int(delivered),
            "seconds": None if seconds is None else round(seconds, 3),
            "deliveries_per_s": round(delivered / seconds, 1) if seconds else None}


def engine_drain(setup: EngineSetup, *, endpoints: dict[str, list[str]], backlog: Sequence[Block],
                 groups: dict[str, list[str]], watched: str, processes: int, client: str | None,
                 probe: Callable[[], float] | None = None) -> dict[str, Any]:
    """Seed ``endpoints`` (URLs by workspace), start the dispatcher, probe the ceiling, COMMIT the
    ``backlog`` and wait until group ``watched`` (workspace names, like every group) has no pending
    row; figures per group, the probes and the receiver's per-endpoint maximum in flight."""
    conn = setup.db.connect()
    ids = seed_workspaces(conn, endpoints)
    conn.close()
    group_ids = {name: [i for ws in names for i in ids[ws]] for name, names in groups.items()}
    config = setup.config(workers={"processes": processes, "per_endpoint_concurrency": SLOTS},
                          http={"client": client} if client else {})
    with DispatcherRun(setup.tmp, config) as dispatcher:
        dispatcher.wait_ready(processes)
        ceilings = [probe()] if probe else []
        conn = setup.db.connect()
        with conn.cursor() as cur:
            first, rows = 0, 0
            for block in backlog:
                rows += insert_backlog(cur, block.workspaces, block.events, PAYLOAD_BYTES, first_event=first,
                                       workspace_offset=block.offset)
                first += block.events
            cur.execute("ANALYZE webhook_deliveries")
            cur.execute("ANALYZE events")
            cur.execute("SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ANY (%s)",
                        (group_ids[watched],))
            (watched_rows,) = cur.fetchone() or (0,)
        meter = setup.cpu_meter(dispatcher)
        load_before = load_average()
        conn.commit()
        committed = time.time()
        conn.close()
        try:
            with drained_probe(setup.db, "SELECT NOT EXISTS (SELECT 1 FROM webhook_deliveries WHERE "
                               "status = 'pending' AND endpoint_id = ANY (%s))", (group_ids[watched],)) as drained:
                wait_until(drained, timeout=max(120.0, watched_rows / FLOOR_PER_S), interval=0.2,
                           message=f"the {watched} endpoints to drain")
        finally:
            cpu = meter.stop()
        figures = {name: _group(setup, members, committed) for name, members in group_ids.items()}
        ceilings += [probe()] if probe else []
    stats = setup.receiver.stats()
    return {"rows": rows, "groups": figures, "ceiling_probes_per_s": ceilings,
            "max_concurrency_by_endpoint": _max_concurrency(stats),
            "cpu_s": {k: cpu[k] for k in ("dispatcher", "postgres", "receiver")},
            "load_average_before": load_before, "log": dispatcher.log_counts()}


def _max_concurrency(stats: dict[str, Any]) -> dict[str, int] | None:
    """The mock receiver's most requests in flight per endpoint (None from nginx, which does not count)."""
    endpoints = stats.get("endpoints", {})
    if not endpoints or "max_concurrency" not in next(iter(endpoints.values())):
        return None
    return {key: int(ep["max_concurrency"]) for key, ep in endpoints.items() if key != "ceiling"}


# --------------------------------------------------------------------------- the cases


def _fast_receiver() -> str:
    """nginx when installed, else the mock (which then answers at 0 ms)."""
    try:
        nginx_binary()
    except NginxMissing:
        return "mock"
    return "nginx"


def one_endpoint(*, rows: int, fast: bool, probe_s: float, processes: int, client: str | None) -> dict[str, Any]:
    """One workspace, one endpoint, ``rows`` pending: its rate against its 4-client ceiling."""
    kind = _fast_receiver() if fast else "mock"
    label = "hot_one_fast" if fast else "hot_one_10ms"
    with engine_setup(label, receiver_kind=kind) as setup:
        receiver = setup.receiver
        if fast:
            url, ceiling_url = receiver.url("ok", "hot"), receiver.url("ok", "ceiling")
        else:
            url, ceiling_url = _slow_url(receiver, "hot"), _slow_url(receiver, "ceiling")
        found = engine_drain(setup, endpoints={"ws0": [url]}, backlog=[Block(0, 1, rows)], groups={"hot": ["ws0"]},
                             watched="hot", processes=processes, client=client,
                             probe=lambda: probe_ceiling(ceiling_url, probe_s, client))
    hot = found["groups"]["hot"]
    ceiling = max(found["ceiling_probes_per_s"])
    rate = hot["deliveries_per_s"]
    ratio = round(rate / ceiling, 3) if rate and ceiling else None
    target = TARGETS["one_endpoint_fast" if fast else "one_endpoint_10ms"]
    concurrency = found["max_concurrency_by_endpoint"]
    return {"receiver": {"nginx": "nginx answering 204", "mock": "mock receiver answering at once, verifying"}[kind]
            if fast else f"mock receiver answering after {LATENCY_MS} ms, verifying",
            "pending": rows, "deliveries_per_s": rate, "seconds": hot["seconds"], "ceiling_per_s": ceiling,
            "ratio_to_ceiling": ratio, "target_ratio": target, "lost": rows - hot["delivered"],
            "max_concurrency": None if concurrency is None else concurrency.get("hot"),
            "met": bool(ratio is not None and ratio >= target and hot["delivered"] == rows), **found}


def spread(*, events: int, processes: int, client: str | None, receiver: str) -> dict[str, Any]:
    """The throughput drain over 100 endpoints (10 x 10) and over 1,000 (100 x 10), same backlog size,
    in the order 100, 1,000, 1,000, 100 (the machine's drift lands on both alike); each rate is the
    mean of its two runs."""
    runs: dict[str, list[dict[str, Any]]] = {"endpoints_100": [], "endpoints_1000": []}
    for endpoints in ABBA:
        workspaces = 10 if endpoints == "endpoints_100" else 100
        found = drain(events=events, workspaces=workspaces, processes=processes, client=client,
                      receiver_kind=receiver, label=f"hot_spread{workspaces * 10}", timeout=900.0)
        run = {key: found[key] for key in ("deliveries", "endpoints", "seconds", "deliveries_per_s",
                                           "first_attempt_after_commit_s", "lost", "statuses",
                                           "cpu_ms_per_delivery", "load_average_before")}
        runs[endpoints].append({**run, "others_cores": found["machine"]["others_cores"]})
    few, many = (_mean_rate(runs[name]) for name in ("endpoints_100", "endpoints_1000"))
    ratio = round(few / many, 3) if few and many else None
    lost = sum(run["lost"] for pair in runs.values() for run in pair)
    return {"receiver": receiver, "order": list(ABBA), "endpoints_100_per_s": few, "endpoints_1000_per_s": many,
            **runs, "ratio_100_to_1000": ratio, "target_ratio": TARGETS["spread"],
            "lost": lost, "met": bool(ratio is not None and ratio >= TARGETS["spread"] and lost == 0)}


ABBA = ("endpoints_100", "endpoints_1000", "endpoints_1000", "endpoints_100")


def _mean_rate(runs: list[dict[str, Any]]) -> float | None:
    rates = [run["deliveries_per_s"] for run in runs]
    return round(sum(rates) / len(rates), 1) if rates and all(rates) else None


def _slow_url(receiver: Any, key: str) -> str:
    """The mock receiver's endpoint ``key`` answering after ``LATENCY_MS`` (its url() takes a
    profile's parameters; nginx's does not, hence Any)."""
    return str(receiver.url("latency", key, ms=LATENCY_MS))


def _others(receiver: Any) -> dict[str, list[str]]:
    """999 endpoints answering after 10 ms: ws0..ws98 with 10 each, ws99 with 9."""
    return {f"ws{w}": [_slow_url(receiver, f"o{w}-{i}") for i in range(10 if w < 99 else 9)] for w in range(100)}


def hot_among(*, hot: int, each: int, processes: int, client: str | None, pairs: int) -> dict[str, Any]:
    """The 999's drain alone and next to a hot endpoint (its rows inserted first), each on a fresh
    set-up, in ``pairs`` adjacent pairs whose order alternates (without/with, with/without, ...).

    The ratio is the median of the pairs' own ratios: the two runs of a pair follow each other, so
    a phase of the host (a whole drain about 25 % slower, seen on shared 2-vCPU guests) weighs on
    both runs of one pair, and one such phase cannot decide the result as it did a mean of two
    runs a side.  The pooled ratio (mean time with over mean time without) is reported beside it."""
    phases: dict[str, list[dict[str, Any]]] = {"without_hot": [], "with_hot": []}
    order = paired_order(pairs, ("without_hot", "with_hot"))
    for phase in order:
        phases[phase].append(_among_drain(phase, hot=hot, each=each, processes=processes, client=client))
    alone, beside = (_mean_seconds(phases[name], "others") for name in ("without_hot", "with_hot"))
    pair_seconds = [(a["groups"]["others"]["seconds"], w["groups"]["others"]["seconds"])
                    for a, w in zip(phases["without_hot"], phases["with_hot"], strict=True)]
    pair_ratios = [round(w / a, 3) if a and w else None for a, w in pair_seconds]
    known = [r for r in pair_ratios if r is not None]
    ratio = round(statistics.median(known), 3) if known and len(known) == len(pair_ratios) else None
    runs = [run for pair in phases.values() for run in pair]
    peaks = [max((run["max_concurrency_by_endpoint"] or {}).values(), default=0) for run in runs]
    lost = sum(run["groups"]["others"]["rows"] - run["groups"]["others"]["delivered"] for run in runs)
    met = ratio is not None and ratio <= TARGETS["hot_time_ratio"] and max(peaks) <= SLOTS and lost == 0
    hot_rates = [run["groups"]["hot"]["deliveries_per_s"] or 0.0 for run in phases["with_hot"]]
    return {"receiver": f"mock receiver, every endpoint answering after {LATENCY_MS} ms, verifying",
            "hot_pending": hot, "others_pending_each": each,
            "order": order,
            "others_seconds_without_hot": alone, "others_seconds_with_hot": beside,
            "pair_time_ratios": pair_ratios,
            "time_ratio_pooled": round(beside / alone, 3) if alone and beside else None,
            "time_ratio_with_to_without": ratio, "target_time_ratio": TARGETS["hot_time_ratio"],
            "hot_deliveries_per_s_meanwhile": round(sum(hot_rates) / len(hot_rates), 1),
            "max_concurrency_any_endpoint": max(peaks), "max_concurrency_hot":
                max((run["max_concurrency_by_endpoint"] or {}).get("hot", 0) for run in phases["with_hot"]),
            "target_max_concurrency": SLOTS, "lost": lost, "met": bool(met),
            **{phase: [{k: v for k, v in run.items() if k != "max_concurrency_by_endpoint"} for run in pair]
               for phase, pair in phases.items()}}


def _among_drain(phase: str, *, hot: int, each: int, processes: int, client: str | None) -> dict[str, Any]:
    """One drain of the 999 on a fresh set-up; ``with_hot``: the hot endpoint's rows inserted first."""
    with engine_setup(f"hot_among_{phase}") as setup:
        endpoints = _others(setup.receiver)
        backlog, groups = [Block(0, 100, each * 100)], {"others": list(endpoints)}
        if phase == "with_hot":
            endpoints["ws100"] = [_slow_url(setup.receiver, "hot")]
            backlog.insert(0, Block(100, 1, hot))
            groups["hot"] = ["ws100"]
        return engine_drain(setup, endpoints=endpoints, backlog=backlog, groups=groups,
                            watched="others", processes=processes, client=client)


def _mean_seconds(runs: list[dict[str, Any]], group: str) -> float | None:
    seconds = [run["groups"][group]["seconds"] for run in runs]
    return round(sum(seconds) / len(seconds), 3) if seconds and all(seconds) else None


# --------------------------------------------------------------------------- the scenario


def _attempt(case: Callable[..., dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """One case's figures; a failing case reports its error and leaves the others to run."""
    try:
        return case(**kwargs)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=6), "met": False}


def _table(cases: dict[str, dict[str, Any]]) -> list[tuple[str, Any, str]]:
    one, fast, wide, among = (cases[name] for name in CASES)
    rows: list[tuple[str, Any, str]] = [
        (f"1 endpoint, {LATENCY_MS} ms: deliveries/s", one.get("deliveries_per_s"), "report"),
        (f"  {SLOTS} keep-alive clients' ceiling/s", one.get("ceiling_per_s"), "report"),
        ("  ratio to the ceiling", one.get("ratio_to_ceiling"), f">= {TARGETS['one_endpoint_10ms']}"),
        (f"1 endpoint, fast ({fast.get('receiver', '?')}): deliveries/s", fast.get("deliveries_per_s"), "report"),
        (f"  {SLOTS} keep-alive clients' ceiling/s", fast.get("ceiling_per_s"), "report"),
        ("  ratio to the ceiling", fast.get("ratio_to_ceiling"), f">= {TARGETS['one_endpoint_fast']}"),
        ("100 endpoints (10 x 10): deliveries/s", wide.get("endpoints_100_per_s"), "report"),
        ("1,000 endpoints (100 x 10): deliveries/s", wide.get("endpoints_1000_per_s"), "report"),
        ("  ratio 100 / 1,000", wide.get("ratio_100_to_1000"), f">= {TARGETS['spread']}"),
        ("999 endpoints drain s, alone", among.get("others_seconds_without_hot"), "report"),
        ("999 endpoints drain s, next to a hot one", among.get("others_seconds_with_hot"), "report"),
        ("  ratio with / without", among.get("time_ratio_with_to_without"), f"<= {TARGETS['hot_time_ratio']}"),
        ("  hot endpoint deliveries/s meanwhile", among.get("hot_deliveries_per_s_meanwhile"), "report"),
        ("most in flight on one endpoint", among.get("max_concurrency_any_endpoint"), f"<= {SLOTS}"),
    ]
    rows += [(f"{name}: error", case["error"][:70], "") for name, case in cases.items() if "error" in case]
    rows.append(("lost", sum(case.get("lost", 0) for case in cases.values()), "0"))
    return rows


CASES = ("one_endpoint_10ms", "one_endpoint_fast", "spread_100_vs_1000", "hot_among_999")


def run(tiny: bool = False, client: str | None = None, processes: int = 2, receiver: str = "mock") -> dict[str, Any]:
    sizes = TINY if tiny else FULL
    common = {"processes": processes, "client": client}
    cases = {
        "one_endpoint_10ms": _attempt(one_endpoint, rows=sizes.one_10ms, fast=False, probe_s=sizes.probe_s,
                                      **common),
        "one_endpoint_fast": _attempt(one_endpoint, rows=sizes.one_fast, fast=True, probe_s=sizes.probe_s,
                                      **common),
        "spread_100_vs_1000": _attempt(spread, events=sizes.spread_events, receiver=receiver, **common),
        "hot_among_999": _attempt(hot_among, hot=sizes.hot, each=sizes.others_each,
                                  pairs=sizes.among_pairs, **common),
    }
    result: dict[str, Any] = {
        **cases,
        "slots_per_endpoint": SLOTS,
        "worker_processes": processes,
        "errors": [name for name, case in cases.items() if "error" in case],
        "lost": sum(case.get("lost", 0) for case in cases.values()),
        "met": all(case.get("met") is True for case in cases.values()),
        "table": _table(cases),
    }
    return result
