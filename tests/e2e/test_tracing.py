"""One event traced end to end (issue 26): the producer's span, the attempts, the receiver, a replay.

The producer runs here, inside a span of an SDK tracer of its own; the worker
runs its real loop in a gevent-patched child (``tests/support/tracing.py``)
with an InMemorySpanExporter; the replay goes through the API app in process,
traced by its middleware.  The receiver answers 500 twice, then 200, and keeps
the headers it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest

from dispatcher import Event, WebhookSender, load_config
from dispatcher.api.app import create_app
from dispatcher.tokens import create_token
from dispatcher_devtools.kit import query, seed_workspace
from tests.support import LoopbackServer, Request, responder, response, run_green

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from dispatcher.tracing import Tracer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TRACED = {"tracing": {"enabled": True, "exporter": "none"}, "retry": {"base": "100ms", "jitter": 0},
          "workers": {"poll_interval": "50ms"}}


class Flaky:
    """Answers 500 to the first ``failures`` requests, then 200; keeps every request."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.seen: list[Request] = []

    def __call__(self, request: Request) -> bytes:
        self.seen.append(request)
        return response(500 if len(self.seen) <= self.failures else 200)


@pytest.fixture
def flaky() -> Iterator[tuple[Flaky, LoopbackServer]]:
    receiver = Flaky(failures=2)
    with LoopbackServer(responder(receiver)) as server:
        yield receiver, server


def attempt_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s["name"] == "dispatcher.attempt"),
                  key=lambda s: s["attributes"]["dispatcher.attempt"])


def test_one_event_is_one_trace_linked_to_its_producer_and_a_replay_is_a_new_one(
        db, write_config, flaky: tuple[Flaky, LoopbackServer]) -> None:
    receiver, server = flaky
    (endpoint,) = seed_workspace(db.dsn, "ws", [server.url("/hook")])
    config = write_config(db, **TRACED)
    cfg = load_config(config, env={})

    # The producer: its application's own tracer and span, current while send() runs.
    producer_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(producer_spans))
    conn = db.connect()
    try:
        with provider.get_tracer("app").start_as_current_span("POST /jobs") as request_span:
            with WebhookSender(cfg).transaction(conn) as tx:
                event_id = tx.send(Event("ws", "job.created", {"n": 1})).id
    finally:
        conn.close()
    producer = request_span.get_span_context()
    producer_trace, producer_span = f"{producer.trace_id:032x}", f"{producer.span_id:016x}"
    ((stored,),) = query(db.dsn, "SELECT trace_context FROM events WHERE id = %s", (event_id,))
    assert stored["traceparent"].split("-")[1:3] == [producer_trace, producer_span]

    out = run_green("tests.support.tracing:run_traced_worker", {"config": str(config), "dsn": db.dsn}, timeout=90)
    assert out["settled"], out
    attempts = attempt_spans(out["spans"])
    assert [(a["attributes"]["dispatcher.attempt"], a["attributes"]["dispatcher.result"],
             a["attributes"].get("http.response.status_code")) for a in attempts] == [
        (1, "http_5xx", 500), (2, "http_5xx", 500), (3, "delivered", 200)]
    # One trace: the first attempt is its root, the later ones its children ...
    (trace_id,) = {a["trace_id"] for a in attempts}
    assert trace_id != producer_trace
    root = attempts[0]
    assert root["parent_id"] is None
    assert [a["parent_id"] for a in attempts[1:]] == [root["span_id"], root["span_id"]]
    # ... and every attempt links to the producer's span (a link, not a parent).
    for a in attempts:
        assert {"trace_id": producer_trace, "span_id": producer_span} in a["links"]
        assert a["attributes"]["dispatcher.event_id"] == event_id
        assert a["attributes"]["dispatcher.endpoint_id"] == endpoint
        assert a["attributes"]["dispatcher.breaker_state"] == "closed"
        assert a["attributes"]["dispatcher.duration_ms"] >= 0
    # The receiver saw each attempt's traceparent, all of that trace.
    sent = [r.headers["traceparent"] for r in receiver.seen]
    assert [t[:-3] for t in sent] == [f"00-{trace_id}-{a['span_id']}" for a in attempts]
    assert all(int(t[-2:], 16) & 1 for t in sent), "sampled"
    # Claims and result writes are spans of their own, linked to the rows they carried.
    claims = [s for s in out["spans"] if s["name"] == "dispatcher.claim"]
    records = [s for s in out["spans"] if s["name"] == "dispatcher.record"]
    assert claims and records and all(s["parent_id"] is None for s in claims + records)
    assert {a["span_id"] for a in attempts} <= {link["span_id"] for s in records for link in s["links"]}
    # The history leads to the trace.
    assert query(db.dsn, "SELECT trace_id FROM webhook_delivery_attempts ORDER BY attempt") == [(trace_id,)] * 3

    # A replay through the traced API: a new trace, linked to the original.
    api_spans = InMemorySpanExporter()
    app = create_app(cfg, db.dsn, tracer=Tracer.from_config(cfg.tracing, "dispatcher-api", exporter=api_spans))
    try:
        admin = db.connect()
        admin.autocommit = True
        try:
            token = create_token(admin, "ws", ["webhooks:read", "webhooks:write"])
        finally:
            admin.close()
        client = falcon.testing.TestClient(app)
        auth = {"Authorization": f"Bearer {token}"}
        (delivery,) = query(db.dsn, "SELECT id FROM webhook_deliveries")
        shown = client.simulate_get(f"/v2/webhooks/deliveries/{delivery[0]}", headers=auth).json
        assert (shown["trace_id"], shown["producer_trace_id"]) == (trace_id, producer_trace)
        assert {a["trace_id"] for a in shown["attempts"]} == {trace_id}
        replayed = client.simulate_post(f"/v2/webhooks/deliveries/{delivery[0]}/replay", headers=auth)
        assert replayed.status_code == 202, replayed.text
        app.tracer.flush()
    finally:
        app.close()
    (replay_request,) = [s for s in api_spans.get_finished_spans() if "replay" in s.name]
    assert replay_request.name == "POST /v2/webhooks/deliveries/{delivery_id}/replay"
    replay_trace = f"{replay_request.get_span_context().trace_id:032x}"

    again = run_green("tests.support.tracing:run_traced_worker", {"config": str(config), "dsn": db.dsn}, timeout=90)
    assert again["settled"], again
    (replay_attempt,) = attempt_spans(again["spans"])
    assert replay_attempt["trace_id"] == replay_trace != trace_id
    assert replay_attempt["parent_id"] == f"{replay_request.get_span_context().span_id:016x}"
    assert {"trace_id": trace_id, "span_id": root["span_id"]} in replay_attempt["links"]
    assert {"trace_id": producer_trace, "span_id": producer_span} in replay_attempt["links"]
    assert receiver.seen[-1].headers["traceparent"].split("-")[1] == replay_trace
    assert json.loads(receiver.seen[-1].body)["id"] == event_id


def test_an_endpoint_can_refuse_the_trace_headers(db, write_config, flaky: tuple[Flaky, LoopbackServer]) -> None:
    receiver, server = flaky
    receiver.failures = 0
    seed_workspace(db.dsn, "ws", [server.url("/hook")])
    query(db.dsn, "UPDATE webhook_endpoints SET trace_headers = false")
    config = write_config(db, **TRACED)
    cfg = load_config(config, env={})
    conn = db.connect()
    try:
        with WebhookSender(cfg).transaction(conn) as tx:
            tx.send(Event("ws", "job.created", {"n": 1}))
    finally:
        conn.close()
    out = run_green("tests.support.tracing:run_traced_worker", {"config": str(config), "dsn": db.dsn}, timeout=90)
    assert out["settled"] and len(attempt_spans(out["spans"])) == 1
    assert [r for r in receiver.seen if "traceparent" in r.headers or "tracestate" in r.headers] == []
