"""``tracing``: the throughput drain (W1's shape) with tracing off and on at a 1 % sample, in one run.

Issue 26's measure: what OpenTelemetry costs the engine at ``tracing.sample_ratio: 0.01``
(target: under 5 % of throughput).  The drain runs four times, off, on, on, off (ABBA, so
a machine that speeds up or slows down during the run weighs on both sides alike), over
the same 1,000 endpoints (100 workspaces x 10) with every feature on.  Traced, every
event carries a producer's sampled trace context (so each attempt links to it), the
workers export over OTLP/HTTP to a local sink that answers 200 to every export, and
every claim, attempt and result write makes its span (1 % of them recorded).

The size defaults to 2,000 events (20,000 deliveries) per drain, a tenth of
``throughput``'s; ``--events 20000`` is W1's own size.  On a shared machine the
figures are noisy: compare the ratio, not the rates, with other runs.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.throughput import drain

TARGET_COST = 0.05   # at most this share of the untraced throughput
SAMPLE_RATIO = 0.01


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


def run(tiny: bool = False, client: str | None = None, processes: int = 2, events: int | None = None) -> dict[str, Any]:
    events = 50 if tiny else events or 2_000
    workspaces = 10 if tiny else 100
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with otlp_sink() as endpoint:
        traced = {"tracing": {"enabled": True, "exporter": "otlp", "endpoint": endpoint,
                              "sample_ratio": SAMPLE_RATIO}}
        for label in ("off", "on", "on", "off"):
            runs[label].append(drain(events=events, workspaces=workspaces, client=client, processes=processes,
                                     label=f"tracing_{label}", sections=traced if label == "on" else None,
                                     traced_events=label == "on"))
    rate = {label: sum(r["deliveries_per_s"] or 0.0 for r in done) / len(done) for label, done in runs.items()}
    cpu = {label: sum(r["cpu_ms_per_delivery"]["dispatcher"] or 0.0 for r in done) / len(done)
           for label, done in runs.items()}
    cost = round(1 - rate["on"] / rate["off"], 4) if rate["off"] else None
    lost = sum(r["lost"] for done in runs.values() for r in done)
    result: dict[str, Any] = {
        "deliveries": sum(r["deliveries"] for done in runs.values() for r in done),
        "sample_ratio": SAMPLE_RATIO,
        "deliveries_per_s_off": round(rate["off"], 1), "deliveries_per_s_on": round(rate["on"], 1),
        "each_off": [r["deliveries_per_s"] for r in runs["off"]],
        "each_on": [r["deliveries_per_s"] for r in runs["on"]],
        "dispatcher_cpu_ms_per_delivery_off": round(cpu["off"], 4),
        "dispatcher_cpu_ms_per_delivery_on": round(cpu["on"], 4),
        "throughput_cost": cost, "target_cost": TARGET_COST,
        "otlp_exports": _Sink.exports, "otlp_bytes": _Sink.received,
        "others_cores": [r["machine"]["others_cores"] for done in runs.values() for r in done],
        "lost": lost,
    }
    result["met"] = cost is not None and cost < TARGET_COST and lost == 0
    result["table"] = [
        ("deliveries/s tracing off (mean of 2)", result["deliveries_per_s_off"], "report"),
        (f"deliveries/s tracing on, {SAMPLE_RATIO:.0%} sampled (mean of 2)", result["deliveries_per_s_on"], "report"),
        ("throughput cost", cost, f"< {TARGET_COST}"),
        ("CPU ms/delivery dispatcher off / on", f"{result['dispatcher_cpu_ms_per_delivery_off']} / "
                                                f"{result['dispatcher_cpu_ms_per_delivery_on']}", "report"),
        ("OTLP exports received", result["otlp_exports"], "report"),
        ("lost", lost, "0"),
    ]
    return result
