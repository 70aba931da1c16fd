"""One delivery attempt: from a claimed row to a classified, recordable result.

``DeliveryMaker.attempt`` decides whether the row can be sent at all
(terminal cases), signs and POSTs it through the transport, and hands the
result to ``policy.classify`` -- the one place an outcome is decided.  It never
raises: a row whose processing blows up (a poison row) uses up its attempt
and ends ``dead``, and the worker goes on with the rest of its batch.
"""

from __future__ import annotations

import logging
import random
import time
import traceback
from typing import Any, NamedTuple

from dispatcher.config import Config
from dispatcher.message import delivery_headers, event_body, event_id_problem, signing_keys
from dispatcher.outbound.netguard import OutboundPolicy
from dispatcher.outbound.transport import Transport, make_transport
from dispatcher.redact import excerpt, scrub
from dispatcher.rules.attempt import TransportResult
from dispatcher.rules.breaker import BreakerSignal
from dispatcher.rules.limits import slot_hold
from dispatcher.rules.retry import (
    ENDPOINT_DEACTIVATED,
    ENDPOINT_DELETED,
    SHADOW_MARK,
    Outcome,
    RetryPolicies,
    Verdict,
    classify,
    clip_error,
    terminal,
)
from dispatcher.signing import InvalidSecret
from dispatcher.store.engine import AttemptRecord, ClaimedRow
from dispatcher.tracing import NO_SPAN, SpanHandle, Tracer, carrier_of

log = logging.getLogger("dispatcher.delivery")

_STATUS_OF = {Verdict.DELIVERED: "delivered", Verdict.RETRY: "pending", Verdict.DEAD: "dead",
              Verdict.FAILED: "failed", Verdict.SHADOW: "shadow"}


def _secrets(row: ClaimedRow) -> tuple[str | None, str | None]:
    """The row's workspace secrets: masked exactly in whatever we store or log of the receiver's answer."""
    return row.secret, row.previous_secret


class Attempt(NamedTuple):
    """A finished attempt: the row update to write, plus what metrics and the breaker need."""

    record: AttemptRecord
    event_id: str
    breaker: BreakerSignal
    commit_to_2xx: float | None   # seconds from the row's creation to its 2xx

    @property
    def latency(self) -> float | None:
        """The attempt's latency sample in seconds; None for a shadow row, which was never sent."""
        return None if self.record.status == "shadow" else self.record.duration_ms / 1000.0


def build_transport(config: Config) -> Transport:
    # ``maxsize`` is the idle keep-alive connections kept per (host, address).
    # Many endpoints can share one host, so capping it at the per-endpoint
    # concurrency (4) made every request past the 4th in flight to such a host
    # dial a new connection and close it after one use (docs/benchmarks.md: a
    # fifth of a worker's CPU went to connect and close).  A pool only ever
    # holds connections that were in use at the same time, so it stays bounded
    # by that host's real concurrency, itself at most ``max_in_flight``.
    from dispatcher.outbound.resolver import DnsResolver  # gevent-bound: only the patched workers build transports

    http = config.http
    dns = DnsResolver(http.dns_servers, timeout=http.dns_timeout, max_ttl=http.dns_max_ttl,
                      per_workspace=http.dns_per_workspace)
    return make_transport(http.client, timeout=http.timeout,  # type: ignore[arg-type]
                          max_response_bytes=http.max_response_bytes,
                          policy=OutboundPolicy.from_config(http), dns=dns, ca_certs=http.ca_file,
                          maxsize=max(config.workers.per_endpoint_concurrency, config.workers.max_in_flight))


class DeliveryMaker:
    def __init__(self, transport: Transport, policies: RetryPolicies, deadline: float = 0.0,
                 tracer: Tracer | None = None) -> None:
        self._transport = transport
        self._policies = policies
        self._deadline = deadline  # the transport's (http.timeout), for limits.slot_hold
        self._tracer = tracer or Tracer.off()
        self._rng = random.Random()
        self._in_flight: dict[int, ClaimedRow] = {}

    @classmethod
    def from_config(cls, config: Config, tracer: Tracer | None = None) -> DeliveryMaker:
        return cls(build_transport(config), config.retry.retry_policies(), config.http.timeout, tracer)

    def close(self) -> None:
        self._transport.close()

    def in_flight(self) -> list[ClaimedRow]:
        return list(self._in_flight.values())

    def attempt(self, row: ClaimedRow, claimed_at: float) -> Attempt:
        """Make one attempt for ``row``; never raises.

        Traced, it is a span of the delivery's trace (a child of the row's first traced attempt, or
        that root itself), linked to the producer's span and, for a replay, to the original's trace."""
        if not self._tracer.enabled:
            return self._attempt(row, claimed_at, NO_SPAN)
        delivery = carrier_of(row.delivery_trace) or {}
        parent = {"traceparent": delivery["traceparent"]} if delivery.get("traceparent") else None
        replayed = {"traceparent": delivery["replayed_from"]} if delivery.get("replayed_from") else None
        # Without a stored parent, the trace is keyed by the event and the row (tracing.keyed_trace):
        # an attempt not kept then needs nothing written back, and only a kept root is stored.
        key = None if parent else f"{row.event_id}/{row.id}".encode()
        span = self._tracer.begin("dispatcher.attempt", parent, kind="client", trace_key=key)
        if span is None:
            return self._attempt(row, claimed_at, NO_SPAN)
        try:
            if span.recording:  # 99 in 100 at a 1 % ratio are not: build nothing for them
                span.link((carrier_of(row.event_trace), replayed))
                span.set(_span_attributes(row))
            done = self._attempt(row, claimed_at, span, parent is None and span.recording)
            record = done.record
            if span.recording:
                span.set({"dispatcher.result": record.result, "dispatcher.status": record.status,
                          "http.response.status_code": record.status_code,
                          "dispatcher.duration_ms": record.duration_ms})
                if record.status != "delivered":
                    span.failed(record.result)
        finally:
            span.end()
        return done

    def _attempt(self, row: ClaimedRow, claimed_at: float, span: SpanHandle, trace_root: bool = False) -> Attempt:
        started = time.monotonic()
        self._in_flight[row.id] = row
        status_code: int | None = None
        body_excerpt: str | None = None
        try:
            result = self._send(row, span)
            if isinstance(result, TransportResult):
                status_code = result.status
                body_excerpt = excerpt(result.body, secrets=_secrets(row)) if result.status is not None else None
                outcome = self._classify(row, result, claimed_at)
            else:
                outcome = result
        except Exception as exc:  # a poison row must not take the worker down
            # The traceback is scrubbed too: an exception message may quote the row's data.
            log.error("attempt raised for delivery %d; it ends dead\n%s", row.id,
                      scrub(traceback.format_exc(), _secrets(row)))
            outcome = Outcome(Verdict.DEAD, "failed", None, BreakerSignal.IGNORE,
                              clip_error(scrub(f"internal error: {type(exc).__name__}: {exc}", _secrets(row))))
        finally:
            self._in_flight.pop(row.id, None)
        return self._attempt_of(row, outcome, status_code, body_excerpt, started, claimed_at, span, trace_root)

    def _send(self, row: ClaimedRow, span: SpanHandle) -> TransportResult | Outcome:
        """The transport's result, or the outcome of a row that is not sent."""
        if row.url is None:
            return terminal(ENDPOINT_DELETED)
        if not row.active:
            return terminal(ENDPOINT_DEACTIVATED)
        if row.event_type is None or row.payload is None:
            return terminal("event not found")
        # Only shadow rows are ever done without a POST, and never as delivered;
        # dry_run must never swallow a live row (docs/decisions.md, Dry run, Shadow rows).
        if row.mode == "shadow":
            return SHADOW_MARK
        # The id goes into two headers: one that cannot (a row from before the
        # producer refused such ids, or from an outside tool) fails the row here,
        # once, instead of failing every attempt for 24 h against the breaker.
        id_problem = event_id_problem(row.event_id)
        if id_problem is not None:
            return terminal(id_problem)
        try:
            keys = signing_keys([s for s in (row.secret, row.previous_secret) if s])
        except InvalidSecret as exc:
            return terminal(f"signing secret unusable: {exc}")
        if not keys or not all(keys):
            # An empty key would still make a "signature" anyone can forge; never send unsigned.
            return terminal("signing secret unusable: it is empty; nothing is sent unsigned")
        body = event_body(row.event_id, row.event_type, row.workspace_id or "", row.sequence,
                          row.occurred_at or "", row.payload)
        headers = delivery_headers(row.event_id, row.attempt, int(time.time()), body, keys)
        if row.trace_headers:  # per endpoint, on by default (webhook_endpoints.trace_headers)
            headers.update(span.headers())
        return self._transport.post(row.url, headers, body, row.workspace_id)

    def _classify(self, row: ClaimedRow, result: TransportResult, claimed_at: float) -> Outcome:
        elapsed = time.monotonic() - claimed_at
        policy = self._policies.for_event_type(row.event_type or "")
        return classify(result, row.attempt, row.age + elapsed, policy, row.db_now + elapsed, self._rng.random())

    def _attempt_of(self, row: ClaimedRow, outcome: Outcome, status_code: int | None, body_excerpt: str | None,
                    started: float, claimed_at: float, span: SpanHandle, trace_root: bool) -> Attempt:
        finished = time.monotonic()
        record = AttemptRecord(
            id=row.id, claim_token=row.claim_token, endpoint_id=row.endpoint_id,
            status=_STATUS_OF[outcome.verdict], attempt=row.attempt, delay=outcome.delay or 0.0,
            error=scrub(outcome.error, _secrets(row)) if outcome.error else None,
            status_code=status_code, result=outcome.result,
            started_mono=started, duration_ms=int((finished - started) * 1000), excerpt=body_excerpt,
            hold=slot_hold(outcome.result, self._deadline),
            traceparent=span.traceparent, trace_root=trace_root, trace_id=span.trace_id)
        to_2xx = row.age + (finished - claimed_at) if outcome.verdict is Verdict.DELIVERED else None
        return Attempt(record, row.event_id, outcome.breaker, to_2xx)


def _span_attributes(row: ClaimedRow) -> dict[str, Any]:
    # The claim admits only closed endpoints and half-open probes (BreakerPolicy.admits).
    return {"dispatcher.event_id": row.event_id, "dispatcher.delivery_id": row.id,
            "dispatcher.endpoint_id": row.endpoint_id, "dispatcher.workspace_id": row.workspace_id,
            "dispatcher.attempt": row.attempt, "dispatcher.breaker_state": "half_open" if row.is_probe else "closed",
            "dispatcher.mode": row.mode}
