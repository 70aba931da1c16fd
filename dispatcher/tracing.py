"""OpenTelemetry tracing (issue 26; docs/operations.md, "Tracing"): the one module that touches it.

OpenTelemetry is the optional ``otel`` extra.  With ``tracing.enabled: false``
(the default) nothing here imports it: ``Tracer.off()`` hands out ``NO_SPAN``,
whose methods do nothing, and ``current_context`` only looks at
``sys.modules`` -- a process that never imported OpenTelemetry has no span.

What is traced, and how the spans join up:

* the producer's ``send()`` stores the W3C context (``traceparent``,
  ``tracestate``) of the span current in the caller, if any, with the event
  (``events.trace_context``, migration 0022) -- in the statement it runs anyway;
* each attempt is a span of the delivery's own trace: the first attempt's span
  is its root (its traceparent is kept on the row by the result write) and the
  later ones its children, so hours of retries are one trace.  Every attempt
  *links* to the producer's span (and a replay's to the original delivery's
  trace): a link, not a parent, as the delivery outlives the request;
* claim and record batches are spans of their own, linked to the rows they
  carry (links are right for batches: no fake parent-child);
* the POST carries the attempt span's ``traceparent``/``tracestate`` unless
  the endpoint's ``trace_headers`` is off;
* API requests are server spans (``TracingMiddleware``), children of the
  caller's ``traceparent`` when it sends one.

Tracing never blocks or breaks delivery: spans are exported by a
``BatchSpanProcessor`` (a bounded queue, dropped when full, exported off the
hot path), exporter failures are the SDK's to log and drop, and every call
here swallows its own errors.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dispatcher.config import TracingConfig

log = logging.getLogger("dispatcher.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# At most this many links on a batch span (the SDK keeps 128 by default): a
# claim of 500 rows links to the first ones, and says how many it carried.
MAX_BATCH_LINKS = 64


def traceparent_of(span_context: Any) -> str:
    """The W3C ``traceparent`` of an OpenTelemetry SpanContext."""
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


def _carrier(span_context: Any) -> dict[str, str] | None:
    if not span_context.is_valid:
        return None
    carrier = {TRACEPARENT: traceparent_of(span_context)}
    state = span_context.trace_state.to_header() if span_context.trace_state else ""
    if state:
        carrier[TRACESTATE] = state
    return carrier


def carrier_of(text: str | None) -> dict[str, str] | None:
    """A W3C carrier stored as JSON text (``trace_context``, as the claim returns it), or None:
    absent, malformed or not an object, never raised.  Called only where a span needs it."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def current_context() -> dict[str, str] | None:
    """The W3C context of the span current here (thread or greenlet), or None.

    Imports nothing: a process that has not imported OpenTelemetry cannot
    have a current span, so the producer's cost without it is one dict lookup.
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        return _carrier(trace.get_current_span().get_span_context())
    except Exception:  # tracing never breaks send()
        log.debug("could not read the current trace context", exc_info=True)
        return None


# A W3C traceparent whose sampled flag (bit 0 of the flags byte) is set; migration 0022's
# dispatcher_sampled_trace_id is its SQL twin (tests/integration/test_trace_ids.py).
_SAMPLED = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f][13579bdf]")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _valid_parent(carrier: Mapping[str, str] | None) -> re.Match[str] | None:
    """The parts of a carrier's ``traceparent`` (version, trace id, span id, flags) when it is a
    valid W3C one; None when absent or invalid (bad format, version ff, an all-zero id): no parent."""
    value = carrier.get(TRACEPARENT) if carrier else None
    found = _TRACEPARENT.fullmatch(value) if isinstance(value, str) else None
    if found is None or found[1] == "ff" or found[2] == _ZERO_TRACE or found[3] == _ZERO_SPAN:
        return None
    return found


def _state_of(carrier: Mapping[str, str] | None) -> str | None:
    """The carrier's ``tracestate`` text, passed on unchanged -- unless it could not go out as a
    header value (W3C: printable ASCII), then dropped."""
    state = carrier.get(TRACESTATE) if carrier else None
    return state if isinstance(state, str) and state and state.isascii() and state.isprintable() else None


def is_sampled(traceparent: str | None) -> bool:
    return traceparent is not None and _SAMPLED.fullmatch(traceparent) is not None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a sampled ``traceparent``: an unsampled one leads to no stored trace."""
    return traceparent[3:35] if traceparent is not None and is_sampled(traceparent) else None


class SpanHandle:
    """What a caller holds of a span.  This base is ``NO_SPAN``, the span of a tracer that is off
    (or of one that failed to start): every call does nothing."""

    traceparent: str | None = None
    trace_id: str | None = None   # the trace an operator can look up: a kept (sampled) span's
    recording = False             # kept: worth building attributes for

    def set(self, attributes: Mapping[str, Any]) -> None:
        return None

    def link(self, carriers: Iterable[Mapping[str, str] | None]) -> None:
        return None

    def failed(self, description: str) -> None:
        return None

    def headers(self) -> dict[str, str]:
        return {}

    def end(self) -> None:
        return None


NO_SPAN = SpanHandle()


class _UnkeptSpan(SpanHandle):
    """A span that is not kept (99 attempts in 100 at a 1 % ratio): two strings, no OpenTelemetry
    object at all.  It only carries its W3C context to the POST's headers: the parent's trace id
    (or a fresh one), a fresh span id, flags ``00``, the parent's ``tracestate`` as it came."""

    traceparent: str

    def __init__(self, traceparent: str, tracestate: str | None) -> None:
        self.traceparent = traceparent
        self._state = tracestate

    def headers(self) -> dict[str, str]:
        if self._state:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self._state}
        return {TRACEPARENT: self.traceparent}


class _Span(SpanHandle):
    """A kept span, recorded by the SDK: attributes and links are best effort (errors logged at
    debug, never raised).  A span not kept is an _UnkeptSpan instead."""

    def __init__(self, span: Any, owner: Tracer) -> None:
        self._span = span
        self._owner = owner
        self._recording = self.recording = span.is_recording()  # else whatever is set is dropped anyway
        self._headers = _carrier(span.get_span_context()) or {}
        self.traceparent = self._headers.get(TRACEPARENT)
        # The trace id an operator can look up: only a recorded (sampled) span's.
        self.trace_id = self.traceparent[3:35] if self._recording and self.traceparent else None

    def set(self, attributes: Mapping[str, Any]) -> None:
        if not self._recording:
            return
        try:
            self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        except Exception:
            log.debug("span attributes not set", exc_info=True)

    def link(self, carriers: Iterable[Mapping[str, str] | None]) -> None:
        if not self._recording:
            return
        try:
            for context in self._owner.span_contexts(carriers):
                self._span.add_link(context)
        except Exception:
            log.debug("span links not added", exc_info=True)

    def failed(self, description: str) -> None:
        if not self._recording:
            return
        try:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, description))
        except Exception:
            log.debug("span status not set", exc_info=True)

    def headers(self) -> dict[str, str]:
        return dict(self._headers)

    def end(self) -> None:
        try:
            self._span.end()
        except Exception:
            log.debug("span not ended", exc_info=True)


class Tracer:
    """The dispatcher's spans, from its own TracerProvider (never the process-global one: a test
    process holds several, and a producer's application keeps its own).

    Sampling is decided here, before the SDK is asked for anything (its sampler is
    ParentBased(ALWAYS_ON)): a new trace is kept with probability ``sample_ratio``, a child
    follows its parent's sampled flag.  A span that is not kept is an _UnkeptSpan: its
    traceparent is one f-string (the parent's trace id or a fresh one, a fresh span id) and
    no OpenTelemetry object is made -- it still carries a valid context for the POST's
    traceparent -- so at a 1 % ratio 99 attempts in 100 cost about two microseconds, not
    the SDK's span start nor the parse of their parent into OpenTelemetry's objects."""

    def __init__(self, provider: Any = None, sample_ratio: float = 1.0) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("dispatcher") if provider is not None else None
        self._ratio = sample_ratio
        self._random = random.Random()
        self._api: Any = None
        if provider is not None:
            from opentelemetry import trace

            self._api = trace

    @classmethod
    def off(cls) -> Tracer:
        return cls(None)

    @classmethod
    def from_config(cls, settings: TracingConfig, service: str, exporter: Any = None) -> Tracer:
        """The process's tracer; ``exporter`` replaces the configured one (tests: InMemorySpanExporter)."""
        if not settings.enabled:
            return cls.off()
        try:
            import opentelemetry.sdk.trace  # noqa: F401  (the extra)
        except ImportError:
            log.warning("tracing.enabled is true but OpenTelemetry is not installed "
                        "(pip install 'dispatcher[otel]'): nothing is traced")
            return cls.off()
        return cls(_provider(service, settings.exporter, settings.endpoint, exporter), settings.sample_ratio)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def remote_context(self, carrier: Mapping[str, str] | None) -> Any:
        """The remote SpanContext a W3C carrier names, or None (absent or malformed: never raised)."""
        found = _valid_parent(carrier)
        if found is None:
            return None
        state = self._api.TraceState.from_header([carrier[TRACESTATE]]) \
            if carrier and carrier.get(TRACESTATE) else None
        return self._api.SpanContext(int(found[2], 16), int(found[3], 16), is_remote=True,
                                     trace_flags=self._api.TraceFlags(int(found[4], 16) & 1),
                                     trace_state=state)

    def span_contexts(self, carriers: Iterable[Mapping[str, str] | None]) -> list[Any]:
        """The valid remote SpanContexts among W3C carriers (bad ones are skipped, never raised)."""
        if self._api is None:
            return []
        return [c for c in map(self.remote_context, carriers) if c is not None]

    def begin(self, name: str, parent: Mapping[str, str] | None = None, kind: str = "internal",
              start_time: int | None = None, trace_key: bytes | None = None) -> SpanHandle | None:
        """A started span (the caller ends it), or None when it could not be made.

        Kept or not is decided from the parent's traceparent text (its sampled flag) or, without
        a valid parent, by ``sample_ratio``; a span not kept never reaches OpenTelemetry.
        ``trace_key`` (a delivery's first attempts): without a parent, the decision and a trace
        not kept are derived from the key (:func:`keyed_trace`), the same every time it is asked."""
        if self._tracer is None:
            return None
        try:
            found = _valid_parent(parent)
            ids = self._random
            if found is not None:
                keep = int(found[4], 16) & 1
            elif trace_key is not None:
                trace_id, keep = keyed_trace(trace_key, self._ratio)
            else:
                trace_id, keep = 0, ids.random() < self._ratio
            if not keep:
                span_id = ids.getrandbits(64) or _nonzero(ids, 64)
                if found is None:
                    return _UnkeptSpan(f"00-{trace_id or _nonzero(ids, 128):032x}-{span_id:016x}-00", None)
                return _UnkeptSpan(f"00-{found[2]}-{span_id:016x}-00", _state_of(parent))
            return self._kept(self._tracer, name, parent, kind, start_time)
        except Exception:
            log.debug("span %s not started", name, exc_info=True)
            return None

    def _kept(self, tracer: Any, name: str, parent: Mapping[str, str] | None, kind: str,
              start_time: int | None) -> _Span:
        """A span the SDK records: the remote parent's child, or a root."""
        from opentelemetry.context import Context

        trace = self._api
        remote = self.remote_context(parent)
        context = trace.set_span_in_context(trace.NonRecordingSpan(remote)) if remote is not None else Context()
        return _Span(tracer.start_span(name, context=context, kind=getattr(trace.SpanKind, kind.upper()),
                                       start_time=start_time), self)

    def otel_span(self, live: SpanHandle) -> Any:
        """The OpenTelemetry span of a started one, made on demand for a span not kept (an API
        request's, to be the current span while the resource runs: a replay takes its context)."""
        if isinstance(live, _Span):
            return live._span
        if live.traceparent is None:
            return None
        trace, state = self._api, live.headers().get(TRACESTATE)
        return trace.NonRecordingSpan(trace.SpanContext(
            int(live.traceparent[3:35], 16), int(live.traceparent[36:52], 16), is_remote=False,
            trace_flags=trace.TraceFlags(0), trace_state=trace.TraceState.from_header([state]) if state else None))

    @contextmanager
    def span(self, name: str, *, parent: Mapping[str, str] | None = None,
             links: Iterable[Mapping[str, str] | None] = (), kind: str = "internal",
             attributes: Mapping[str, Any] | None = None) -> Iterator[SpanHandle]:
        """A span around the block; ``parent`` and ``links`` are W3C carriers.  Never raises its own errors."""
        live = self.begin(name, parent, kind)
        if live is None:
            yield NO_SPAN
            return
        live.link(links)      # both do nothing on a span that is not kept
        live.set(attributes or {})
        try:
            yield live
        finally:
            live.end()

    def batch_span(self, name: str, started_ns: int, links: Iterable[Mapping[str, str] | None],
                   attributes: Mapping[str, Any]) -> None:
        """A finished span for a batch (a claim, a result write) that began at ``started_ns``
        (``time.time_ns()``): a root of its own, linked to at most MAX_BATCH_LINKS of its rows.
        Made afterwards, so that empty claims (an idle worker polls) make no span at all."""
        live = self.begin(name, start_time=started_ns)
        if live is None:
            return
        live.link(itertools.islice((c for c in links if c), MAX_BATCH_LINKS))
        live.set(attributes)
        live.end()

    def flush(self, timeout_millis: int = 30000) -> None:
        if self._provider is not None:
            self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout), then stop."""
        if self._provider is not None:
            try:
                self._provider.shutdown()
            except Exception:
                log.debug("tracer shutdown failed", exc_info=True)


def _provider(service: str, kind: str, endpoint: str, exporter: Any) -> Any:
    import os

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create; ours only fills a gap.
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service})
    # Tracer.begin decides (sample_ratio for a new trace, the parent's flag for a child): a span
    # reaches the SDK only once it is to be kept.
    provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_ON))
    if exporter is None and kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    elif exporter is None and kind == "console":
        exporter = ConsoleSpanExporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


_LOW_64 = (1 << 64) - 1


def keyed_trace(key: bytes, ratio: float) -> tuple[int, bool]:
    """A trace id derived from ``key`` (never 0) and whether a new trace of it is kept: its
    low 64 bits below ``ratio`` of their range, as OpenTelemetry's TraceIdRatioBased decides.

    The worker keys a delivery's root attempt by its event and row, so the row needs no
    stored context until a trace is kept: every attempt of a delivery not kept comes to the
    same decision and carries the same trace id to the receiver, and only the rare kept root
    is written back (its traceparent, for the later attempts to be its children)."""
    trace_id = int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "big") or 1
    return trace_id, (trace_id & _LOW_64) < ratio * (_LOW_64 + 1)


def _nonzero(ids: random.Random, bits: int) -> int:
    """A random id of ``bits`` bits, never 0 (W3C: an all-zero id is invalid)."""
    while True:
        value = ids.getrandbits(bits)
        if value:
            return value


class TracingMiddleware:
    """Falcon middleware: each API request is a server span, the child of the caller's
    ``traceparent`` if it sent one, and the current span while the resource runs (so a
    replay can take its context).  Duck-typed: this module does not import Falcon."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def process_request(self, req: Any, resp: Any) -> None:
        try:
            from opentelemetry import context, trace

            carrier = {key: value for key in (TRACEPARENT, TRACESTATE)
                       if (value := req.get_header(key)) is not None}
            live = self._tracer.begin(f"{req.method}", carrier, kind="server")
            if live is None:
                return
            live.set({"http.request.method": req.method, "url.path": req.path})
            span = self._tracer.otel_span(live)
            if span is None:
                return
            req.context.otel_span = span
            req.context.otel_token = context.attach(trace.set_span_in_context(span))
        except Exception:
            log.debug("API request span not started", exc_info=True)

    def process_resource(self, req: Any, resp: Any, resource: Any, params: Any) -> None:
        span = getattr(req.context, "otel_span", None)
        if span is not None and req.uri_template:
            try:
                span.update_name(f"{req.method} {req.uri_template}")
                span.set_attribute("http.route", req.uri_template)
            except Exception:
                log.debug("API span not renamed", exc_info=True)

    def process_response(self, req: Any, resp: Any, resource: Any, req_succeeded: bool) -> None:
        span = getattr(req.context, "otel_span", None)
        if span is None:
            return
        try:
            from opentelemetry import context
            from opentelemetry.trace import Status, StatusCode

            code = int(resp.status_code)
            span.set_attribute("http.response.status_code", code)
            if code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()
            context.detach(req.context.otel_token)
        except Exception:
            log.debug("API request span not ended", exc_info=True)
