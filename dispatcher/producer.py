"""The producer API: ``WebhookSender.send``, called where the synchronous send is called today.

Which path an event takes is decided inside the one statement ``send`` runs
(the rollout rule, ``dispatcher/rollout_rule.py``: the workspace's explicit
``webhook_outbox`` flag, then the exclude/include lists, then the percentage).

Outbox on: the statement inserts the event and one ``pending`` delivery per
active subscribed endpoint in the caller's transaction -- one round trip, no
commit; the caller's commit makes them visible to the dispatcher, a rollback
leaves nothing.

Outbox off: exactly today's behaviour.  ``send`` itself makes one signed POST
per subscribed endpoint, inline, before it returns, with a total deadline of
``producer.legacy_timeout`` (5 s) per POST, through the engine's transport and
outbound policy (``dispatcher/legacy.py``).  The result is logged and
discarded; a delivery failure never raises.  With ``producer.shadow_writes``
(rollout phase 0) the statement also writes ``mode='shadow'`` rows, which the
dispatcher marks delivered without sending.

A POST made inside a transaction that later rolls back is not recalled: the
receiver has the event although the caller's change (and any shadow row) is
gone.  That is today's behaviour, kept on purpose (docs/producer.md).

``transaction()`` remains a convenience (commit on success, roll back on
error) and sends nothing itself, so nothing is sent twice; ``after_commit()``
is kept as a no-op for callers written against the earlier contract.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dispatcher import store
from dispatcher.config import Config
from dispatcher.message import delivery_headers, event_body, format_timestamp, signing_keys
from dispatcher.metrics import Metrics
from dispatcher.store.producer import SendResult, send_event

if TYPE_CHECKING:  # the transport module imports gevent: producers must not load it just by importing us
    from dispatcher.transport import Transport

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


class WebhookSender:
    def __init__(self, config: Config, transport: Transport | None = None) -> None:
        self._config = config
        self._transport = transport
        self._metrics: Metrics | None = None

    def send(self, conn: store.Connection, event: Event) -> StoredEvent:
        """Outbox on: write into the caller's open transaction.  Off: POST inline (see the module docstring)."""
        started = time.perf_counter()
        params = _statement_params(event, self._config.producer.shadow_writes)
        params["grace"] = self._config.secrets.rotation_grace
        result = send_event(conn, params)
        written = time.perf_counter()
        if result is None:
            raise ProducerError(f"unknown workspace {event.workspace_id!r}")
        stored = StoredEvent(params["event_id"], event.workspace_id, event.type, result.mode, result.sequence,
                             result.deliveries, len(result.legacy_targets) if result.mode != "live" else 0)
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
        """A no-op, kept for callers of the earlier contract: ``send`` has already POSTed."""

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _legacy_send(self, stored: StoredEvent, result: SendResult, params: Mapping[str, Any]) -> None:
        body = event_body(stored.id, stored.type, stored.workspace_id, result.sequence,
                          format_timestamp(params["occurred_at"]), result.legacy_payload or params["payload"])
        for endpoint_id, url, secrets in result.legacy_targets:
            self._legacy_post(stored, endpoint_id, url, body, secrets)

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
            from dispatcher.legacy import legacy_transport  # only flag-off producers pay for it

            self._transport = legacy_transport(self._config)
        return self._transport

    def _time(self, mode: str | None, write: float, total: float) -> None:
        # Metrics never block or break send(): UDP, and any error is swallowed.  The whole
        # call by path, and the outbox statement alone (the RFC's phase 0 gate: "outbox
        # insert adds under 2 ms p99 to producers"); names in docs/metrics.md.
        try:
            if self._metrics is None:
                self._metrics = Metrics(self._config.statsd, self._config.region)
            self._metrics.producer_send(mode or "off", total, write if mode is not None else None)
        except Exception:
            log.debug("producer metrics failed", exc_info=True)


def _statement_params(event: Event, shadow_writes: bool) -> dict[str, Any]:
    """Validate the event and build ``send_event``'s parameters; raises ProducerError before any SQL."""
    if not isinstance(event.type, str) or not isinstance(event.workspace_id, str) \
            or not event.type or not event.workspace_id:
        raise ProducerError("an event needs a workspace_id and a type (non-empty strings)")
    try:
        payload = json.dumps(event.payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProducerError(f"event payload is not JSON-serialisable: {exc}") from None
    if "\\u0000" in payload or "\\ud" in payload:  # rare: only then look closer
        _check_storable(payload)
    return {
        "workspace_id": event.workspace_id, "type": event.type, "event_id": event.id or str(uuid.uuid4()),
        "occurred_at": event.occurred_at or datetime.now(UTC), "payload": payload,
        "payload_hash": hashlib.sha256(payload.encode("utf-8")).hexdigest(),
        "shadow_writes": shadow_writes,
    }


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
