"""``tracing``: the throughput drain (W1's shape) with tracing off and on at a 1 % sample, in one run.

Issue 26's measure: what OpenTelemetry costs the engine at ``tracing.sample_ratio: 0.01``
(target: under 5 % of throughput).  A first drain, untraced, warms the machine and is
discarded: on a fresh Postgres and page cache the first drain of a run is the fastest
whatever its setting, which alone made one earlier run read 9.9 %.  Then ``pairs`` pairs
of drains alternate which setting goes first (off/on, on/off, ...), so a machine that
speeds up or slows down during the run weighs on both sides alike.  The cost is the
pooled one (mean rate on over mean rate off); each pair's own cost and their median are
reported beside it, to show how far one pair can stray.  Every drain uses the
same 1,000 endpoints (100 workspaces x 10) with every feature on.  Traced, every
event carries a producer's sampled trace context (so each attempt links to it), the
workers export over OTLP/HTTP to a local sink that answers 200 to every export, and
every claim, attempt and result write makes its span (1 % of them recorded).

The size defaults to 2,000 events (20,000 deliveries) per drain, a tenth of
``throughput``'s; ``--events 20000`` is W1's own size.  On a shared machine the
figures are noisy: compare the ratio, not the rates, with other runs.
"""

from __future__ import annotations

import http.server
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.harness import paired_order
from benchmarks.throughput import drain

TARGET_COST = 0.05   # at most this share of the untraced throughput
SAMPLE_RATIO = 0.01
DEFAULT_PAIRS = 3   # measured pairs after the warm-up: 6 drains plus 1


class _Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that keeps nothing: 200 to every export, counting them."""

    exports = 0
    received = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        type(self).exports += 1
        type(self).received += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextmanager
def otlp_sink() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def run(tiny: bool = False, client: str | None = None, processes: int = 2, events: int | None = None,
        pairs: int | None = None) -> dict[str, Any]:
    events = 50 if tiny else events or 2_000
    pairs = 1 if tiny else pairs or DEFAULT_PAIRS
    workspaces = 10 if tiny else 100
    order = paired_order(pairs, ("off", "on"))  # the warm-up is not in it
    with otlp_sink() as endpoint:
        traced = {"tracing": {"enabled": True, "exporter": "otlp", "endpoint": endpoint,
                              "sample_ratio": SAMPLE_RATIO}}

        def one(label: str) -> dict[str, Any]:
            return drain(events=events, workspaces=workspaces, client=client, processes=processes,
                         label=f"tracing_{label}", sections=traced if label == "on" else None,
                         traced_events=label == "on")

        warmup = one("off")
        measured = [(label, one(label)) for label in order]
    return _summary(order, measured, warmup)


def _summary(order: list[str], measured: list[tuple[str, dict[str, Any]]],
             warmup: dict[str, Any]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for label, drained in measured:
        runs[label].append(drained)
    rate = {label: _mean([r["deliveries_per_s"] or 0.0 for r in done]) for label, done in runs.items()}
    cpu = {label: _mean([r["cpu_ms_per_delivery"]["dispatcher"] or 0.0 for r in done]) for label, done in runs.items()}
    # Where the rest of a traced delivery's cost lands: Postgres (the events' contexts, the claim's text) and
    # the receiver (one more header to parse).
    others = {f"{group}_cpu_ms_per_delivery_{label}": round(_mean([r["cpu_ms_per_delivery"].get(group) or 0.0
                                                                  for r in done]), 4)
              for group in ("postgres", "receiver") for label, done in runs.items()}
    cost = round(1 - rate["on"] / rate["off"], 4) if rate["off"] else None
    # Each pair holds one drain of each setting, so the i-th off and the i-th on are a pair.
    pair_costs = [round(1 - (on["deliveries_per_s"] or 0.0) / off["deliveries_per_s"], 4)
                  if off["deliveries_per_s"] else None
                  for off, on in zip(runs["off"], runs["on"], strict=True)]
    lost = sum(r["lost"] for _, r in measured) + warmup["lost"]
    cpu_cost = round(cpu["on"] / cpu["off"] - 1, 4) if cpu["off"] else None
    result: dict[str, Any] = {
        "deliveries": sum(r["deliveries"] for _, r in measured),
        "sample_ratio": SAMPLE_RATIO, "order": order, "pairs": len(order) // 2,
        "warmup_deliveries_per_s": warmup["deliveries_per_s"],
        "deliveries_per_s_off": round(rate["off"], 1), "deliveries_per_s_on": round(rate["on"], 1),
        "each_off": [r["deliveries_per_s"] for r in runs["off"]],
        "each_on": [r["deliveries_per_s"] for r in runs["on"]],
        "pair_costs": pair_costs,
        "median_pair_cost": round(statistics.median([c for c in pair_costs if c is not None] or [0.0]), 4),
        "dispatcher_cpu_ms_per_delivery_off": round(cpu["off"], 4),
        "dispatcher_cpu_ms_per_delivery_on": round(cpu["on"], 4),
        "cpu_cost_per_delivery": cpu_cost, **others,
        "throughput_cost": cost, "target_cost": TARGET_COST,
        "otlp_exports": _Sink.exports, "otlp_bytes": _Sink.received,
        "others_cores": [r["machine"]["others_cores"] for _, r in measured],
        "lost": lost,
    }
    result["met"] = cost is not None and cost < TARGET_COST and lost == 0
    n = len(runs["off"])
    result["table"] = [
        (f"deliveries/s tracing off (mean of {n})", result["deliveries_per_s_off"], "report"),
        (f"deliveries/s tracing on, {SAMPLE_RATIO:.0%} sampled (mean of {n})", result["deliveries_per_s_on"],
         "report"),
        ("throughput cost (pooled)", cost, f"< {TARGET_COST}"),
        ("throughput cost per pair (median)", f"{pair_costs} ({result['median_pair_cost']})", "report"),
        ("CPU ms/delivery dispatcher off / on", f"{result['dispatcher_cpu_ms_per_delivery_off']} / "
                                                f"{result['dispatcher_cpu_ms_per_delivery_on']}", "report"),
        ("CPU ms/delivery Postgres off / on", f"{others['postgres_cpu_ms_per_delivery_off']} / "
                                              f"{others['postgres_cpu_ms_per_delivery_on']}", "report"),
        ("OTLP exports received", result["otlp_exports"], "report"),
        ("lost", lost, "0"),
    ]
    return result


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
