"""The producer API: ``WebhookSender.send``, one call per event, in the caller's transaction.

Which path an event takes is decided inside the one statement ``send`` runs
(the rollout rule, ``dispatcher/rules/rollout.py``: the workspace's explicit
``webhook_outbox`` flag, then the exclude/include lists, then the percentage).

Outbox on: the statement inserts the event and one ``pending`` delivery per
active subscribed endpoint in the caller's transaction -- one round trip, no
commit; the caller's commit makes them visible to the dispatcher, a rollback
leaves nothing.

Outbox off (docs/decisions.md, Flag off): ``send`` itself makes one signed POST
per subscribed endpoint, inline, before it returns, with a total deadline of
``producer.legacy_timeout`` (5 s) per POST, through the engine's transport and
outbound policy (``dispatcher/outbound/legacy.py``).  The result is logged and
discarded; a delivery failure never raises.  The statement numbers the event
from the same SEQUENCE as the outbox path, so the body carries a sequence
(docs/decisions.md, Sequence in every body).  With ``producer.shadow_writes``
(rollout phase 0) it also writes ``mode='shadow'`` rows, which the dispatcher
marks ``shadow`` without sending.  What it cannot write (a reused id, a
read-only transaction) it skips; ``send`` logs and counts that, and POSTs all
the same.

A POST made inside a transaction that later rolls back is not recalled: the
receiver has the event although the caller's change (and any shadow row) is
gone.  That is deliberate (docs/producer.md).

``transaction()`` is a convenience (commit on success, roll back on
error) and sends nothing itself, so nothing is sent twice; ``after_commit()``
does nothing: ``send`` has already POSTed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from dispatcher import store
from dispatcher.config import Config, ProducerConfig
from dispatcher.message import delivery_headers, event_body, event_id_problem, format_timestamp, signing_keys
from dispatcher.metrics import Metrics
from dispatcher.store.producer import SendResult, send_event
from dispatcher.tracing import current_context

if TYPE_CHECKING:  # the transport module imports gevent: producers must not load it just by importing us
    from dispatcher.outbound.transport import Transport

log = logging.getLogger("dispatcher.producer")

class ProducerError(ValueError):
    """The event cannot be sent as given; nothing was written."""


@dataclass(frozen=True)
class Event:
    workspace_id: str
    type: str
    payload: Mapping[str, Any]
    id: str | None = None
    occurred_at: datetime | None = None


@dataclass(frozen=True)
class StoredEvent:
    id: str
    workspace_id: str
    type: str
    mode: str | None          # 'live', 'shadow' or None (nothing written)
    sequence: int | None
    deliveries: int           # outbox rows written
    legacy_posts: int = 0     # synchronous POSTs made inside send() (outbox off)
    skipped: str | None = None  # outbox off: 'duplicate_id' or 'read_only' (SendResult.skipped)


class WebhookSender:
    def __init__(self, config: Config, transport: Transport | None = None) -> None:
        self._config = config
        self._transport = transport
        self._metrics: Metrics | None = None

    def send(self, conn: store.Connection, event: Event) -> StoredEvent:
        """Outbox on: write into the caller's open transaction.  Off: POST inline (see the module docstring)."""
        started = time.perf_counter()
        params = _statement_params(event, self._config.producer)
        # The caller's span, if it has one, goes with the event in the same statement (migration 0022):
        # the worker links every attempt to it.  Off, or without OpenTelemetry loaded, this is nothing.
        trace = current_context() if self._config.tracing.enabled else None
        params["trace_context"] = json.dumps(trace) if trace is not None else None
        result = send_event(conn, params, self._config.secrets.rotation_grace)
        written = time.perf_counter()
        if result is None:
            raise ProducerError(f"unknown workspace {event.workspace_id!r}")
        if result.mode == "duplicate":
            raise ProducerError(f"workspace {event.workspace_id!r} already has an event with id {params['event_id']!r}")
        stored = StoredEvent(params["event_id"], event.workspace_id, event.type, result.mode, result.sequence,
                             result.deliveries, len(result.legacy_targets) if result.mode != "live" else 0,
                             result.skipped)
        if stored.skipped is not None:
            self._report_skipped(stored, params["shadow_writes"])
        if stored.legacy_posts:
            self._legacy_send(stored, result, params)
        self._time(stored.mode, written - started, time.perf_counter() - started)
        return stored

    @contextmanager
    def transaction(self, conn: store.Connection) -> Iterator[_Transaction]:
        """Commit on success, roll back on error; ``send`` has already made any legacy POST."""
        tx = _Transaction(self, conn)
        try:
            yield tx
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def after_commit(self, stored: StoredEvent) -> None:
        """Does nothing: ``send`` has already POSTed."""

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _report_skipped(self, stored: StoredEvent, shadow_writes: bool) -> None:
        """What the flag-off statement could not write: logged, and counted when a shadow row was due.
        The POST that follows is made all the same (docs/producer.md)."""
        if stored.skipped == "duplicate_id":
            what = "its shadow rows (the workspace already has an event with this id)"
        else:
            what = ("its sequence" + (" and shadow rows" if shadow_writes else "")
                    + " (a read-only transaction: the body's sequence is null)")
        log.warning("flag-off send skipped %s, the POST is made: workspace_id=%s event_id=%s reason=%s",
                    what, stored.workspace_id, stored.id, stored.skipped)
        if shadow_writes:
            self._metric(lambda metrics: metrics.producer_shadow_skipped(stored.skipped or ""))

    def _legacy_send(self, stored: StoredEvent, result: SendResult, params: Mapping[str, Any]) -> None:
        body = event_body(stored.id, stored.type, stored.workspace_id, result.sequence,
                          format_timestamp(params["occurred_at"]), result.legacy_payload or params["payload"])
        for target in result.legacy_targets:
            self._legacy_post(stored, target.endpoint_id, target.url, body, target.secrets)

    def _legacy_post(self, stored: StoredEvent, endpoint_id: int, url: str, body: bytes,
                     secrets: tuple[str, ...]) -> None:
        # Today's synchronous send: logged and discarded, never raised (the
        # caller's request must not fail because a customer's endpoint did).
        started = time.monotonic()
        status: int | str
        try:
            keys = signing_keys(secrets)
        except ValueError:  # InvalidSecret: a stored secret that cannot be decoded
            keys = ()
        if not keys or not all(keys):  # like the engine: never an unsigned (or empty-key) POST
            status = "invalid_secret"
        else:
            headers = delivery_headers(stored.id, 1, int(time.time()), body, keys)
            try:
                result = self._legacy_transport().post(url, headers, body)
                status = result.status if result.status is not None else (result.error or "failed")
            except Exception:  # Transport.post reports rather than raises; this is the backstop
                log.exception("legacy webhook raised (event_id=%s endpoint_id=%d)", stored.id, endpoint_id)
                status = "internal_error"
        log.info("legacy webhook workspace_id=%s endpoint_id=%d event_id=%s status=%s duration_ms=%d",
                 stored.workspace_id, endpoint_id, stored.id, status, (time.monotonic() - started) * 1000)

    def _legacy_transport(self) -> Transport:
        if self._transport is None:
            from dispatcher.outbound.legacy import legacy_transport  # only flag-off producers pay for it

            self._transport = legacy_transport(self._config)
        return self._transport

    def _time(self, mode: str | None, write: float, total: float) -> None:
        # The whole call by path, and the outbox statement alone (the RFC's phase 0 gate:
        # "outbox insert adds under 2 ms p99 to producers"); names in docs/metrics.md.
        self._metric(lambda metrics: metrics.producer_send(mode or "off", total, write if mode is not None else None))

    def _metric(self, send: Callable[[Metrics], None]) -> None:
        # Metrics never block or break send(): UDP, and any error is swallowed.
        try:
            if self._metrics is None:
                self._metrics = Metrics(self._config.statsd, self._config.region)
            send(self._metrics)
        except Exception:
            log.debug("producer metrics failed", exc_info=True)


# How deeply a payload may nest containers (the payload object itself is level
# 1).  The body adds one level ("data"), and Ruby's JSON.parse refuses more than
# 100 by default; Python's json.loads stops near 1,000; Postgres' jsonb input
# fails past ~10,000 levels (stack depth, 2 MB max_stack_depth) and that error
# would abort the caller's transaction.  64 is far above any real event.
MAX_PAYLOAD_DEPTH = 64


def _statement_params(event: Event, settings: ProducerConfig) -> dict[str, Any]:
    """Validate the event and build ``send_event``'s parameters; raises ProducerError before any SQL."""
    if not isinstance(event.type, str) or not isinstance(event.workspace_id, str) \
            or not event.type or not event.workspace_id:
        raise ProducerError("an event needs a workspace_id and a type (non-empty strings)")
    if event.id is not None and (problem := event_id_problem(event.id)) is not None:
        raise ProducerError(problem)
    payload = _payload_json(event.payload, settings.max_payload_bytes)
    return {
        "workspace_id": event.workspace_id, "type": event.type,
        "event_id": event.id if event.id is not None else str(uuid.uuid4()),
        "occurred_at": event.occurred_at or datetime.now(UTC), "payload": payload,
        "payload_hash": hashlib.sha256(payload.encode("utf-8")).hexdigest(),
        "shadow_writes": settings.shadow_writes,
    }


def _payload_json(payload: Any, max_bytes: int) -> str:
    """The payload as compact JSON text, once it is known to be storable, small and shallow enough."""
    try:
        text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProducerError(f"event payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        # The C encoder recurses once per level; this walk does not, so it
        # names the depth (100,000 levels end here, not in a RecursionError).
        _check_depth(walked_depth(payload, MAX_PAYLOAD_DEPTH + 1))
        raise ProducerError("event payload nests too deeply to encode here (Python's recursion limit)") from None
    _check_size(payload, text, max_bytes)
    # A payload cannot nest deeper than it has brackets: most are never measured.
    if text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH:
        _check_depth(json_depth(text))
    if "\\u0000" in text or "\\ud" in text:  # rare: only then look closer
        _check_storable(text)
    return text


def _check_size(payload: Any, text: str, max_bytes: int) -> None:
    """Refuse a payload whose compact JSON is over ``max_bytes`` in UTF-8 (as stored and sent).

    ``text`` escapes every non-ASCII character (``\\u00e9``: six bytes for
    two), so it is never shorter than the UTF-8 form: only a payload over the
    limit in that form and holding escapes is measured again.
    """
    size = len(text)
    if size > max_bytes and "\\u" in text:
        size = len(json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
                   .encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ProducerError(f"event payload is {size} bytes of JSON, over producer.max_payload_bytes ({max_bytes})")


def _check_depth(depth: int) -> None:
    if depth > MAX_PAYLOAD_DEPTH:
        raise ProducerError(f"event payload is nested deeper than {MAX_PAYLOAD_DEPTH} levels")


# Everything of ASCII JSON text but brackets and quotes (json.dumps escapes all else).
_SKELETON = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in '[]{}"'))
_LEVEL_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deeply ``json.dumps`` text (ASCII) nests containers, in C-speed passes, no recursion.

    Escaped backslashes and quotes go first, so every quote left opens or
    closes a string; split on quotes, the even parts lie outside strings, and
    their brackets, counted in order, give the depth.  Measured on a 94 KB
    payload of 4,000 containers: about 0.3x the time of its ``json.dumps``,
    where a Python walk of the objects took 1.4x to 3x.
    """
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(text.translate(_SKELETON).split('"')[::2])
    return max(accumulate(map(_LEVEL_STEP.__getitem__, outside)), default=0)


def walked_depth(payload: Any, stop_at: int) -> int:
    """How deeply ``payload`` nests containers (stopping at ``stop_at``), with a stack, not recursion.

    For a payload ``json.dumps`` cannot encode for recursion; ``json_depth``
    measures the rest, and tests hold the two to the same cases.
    """
    containers = dict | list | tuple  # what json.dumps nests (subclasses included)
    deepest = 0
    pending: list[tuple[Any, int]] = [(payload, 1)] if isinstance(payload, containers) else []
    while pending and deepest < stop_at:
        value, depth = pending.pop()
        deepest = max(deepest, depth)
        items = value.values() if isinstance(value, dict) else value
        pending.extend((item, depth + 1) for item in items if isinstance(item, containers))
    return deepest


def _check_storable(payload: str) -> None:
    """Refuse JSON that Postgres' jsonb rejects, before it aborts the caller's transaction.

    ``json.dumps`` happily writes ``\\u0000`` (a NUL character) and lone UTF-16
    surrogates such as ``\\ud800``; jsonb refuses both, and a failed statement
    would leave the caller's whole transaction aborted.
    """

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if "\x00" in value:
                raise ProducerError("event payload contains a NUL character (\\u0000), which Postgres cannot store")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ProducerError("event payload contains a lone UTF-16 surrogate (not valid Unicode)") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(payload))


class _Transaction:
    def __init__(self, sender: WebhookSender, conn: store.Connection) -> None:
        self._sender = sender
        self._conn = conn
        self.sent: list[StoredEvent] = []

    def send(self, event: Event) -> StoredEvent:
        stored = self._sender.send(self._conn, event)
        self.sent.append(stored)
        return stored
