"""A traced worker in a gevent-patched process (``run_green("tests.support.tracing:run_traced_worker", ...)``).

It runs the real worker loop (claim, lanes, sender, flusher) with an
InMemorySpanExporter until no row is pending, stops it, and hands back every
span it made as JSON, for ``tests/e2e/test_tracing.py``.
"""

from __future__ import annotations

import time
from typing import Any


def span_json(span: Any) -> dict[str, Any]:
    context = span.get_span_context()
    return {
        "name": span.name, "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "parent_trace_id": f"{span.parent.trace_id:032x}" if span.parent is not None else None,
        "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
                  for link in span.links],
        "attributes": dict(span.attributes or {}),
    }


def run_traced_worker(config: str, dsn: str, timeout: float = 30.0) -> dict[str, Any]:
    import gevent
    import psycopg2
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dispatcher.config import load_config
    from dispatcher.engine.worker import Worker
    from dispatcher.tracing import Tracer

    cfg = load_config(config, env={})
    exporter = InMemorySpanExporter()
    tracer = Tracer.from_config(cfg.tracing, "dispatcher-worker", exporter=exporter)
    worker = Worker(cfg, dsn, "green:traced", tracer=tracer)
    runner = gevent.spawn(worker.run)

    def pending() -> int:
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    deadline = time.monotonic() + timeout
    settled = False
    while time.monotonic() < deadline and not runner.dead:
        if pending() == 0:
            settled = True
            break
        gevent.sleep(0.05)
    worker.stop()
    runner.join(timeout=10)
    # Worker.run shut the tracer down, which exported what was queued.
    return {"settled": settled, "spans": [span_json(s) for s in exporter.get_finished_spans()]}
