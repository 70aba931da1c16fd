"""The producer API: ``WebhookSender.send`` writes the outbox in the caller's
transaction.

Flag on (``workspaces.flags.webhook_outbox``): one statement inserts the event
and one ``pending`` delivery per active subscribed endpoint; the caller's
commit makes them visible to the dispatcher, a rollback leaves nothing.

Flag off: exactly today's behaviour -- one synchronous signed POST per
subscribed endpoint, sent *after* the caller commits (so a rolled-back
transaction never produces a ghost webhook), result logged and discarded.
Callers trigger it in one of two ways::

    with sender.transaction(conn) as tx:     # commits, then sends
        do_domain_write(conn)
        tx.send(event)

or, managing the transaction themselves::

    stored = sender.send(conn, event)
    conn.commit()
    sender.after_commit(stored)               # no-op when the flag is on
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import urllib3

from dispatcher import store
from dispatcher.config import Config
from dispatcher.message import delivery_headers, event_body, format_timestamp, signing_keys

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
    legacy_body: bytes = field(default=b"", repr=False)
    legacy_urls: tuple[str, ...] = ()
    legacy_secrets: tuple[str, ...] = field(default=(), repr=False)


class WebhookSender:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._pool: urllib3.PoolManager | None = None

    def send(self, conn: store.Connection, event: Event) -> StoredEvent:
        """Write the event into the outbox inside the caller's open transaction."""
        if not isinstance(event.type, str) or not isinstance(event.workspace_id, str) \
                or not event.type or not event.workspace_id:
            raise ProducerError("an event needs a workspace_id and a type (non-empty strings)")
        try:
            payload = json.dumps(event.payload, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ProducerError(f"event payload is not JSON-serialisable: {exc}") from None
        if "\\u0000" in payload or "\\ud" in payload:  # rare: only then look closer
            _check_storable(payload)
        event_id = event.id or str(uuid.uuid4())
        occurred_at = event.occurred_at or datetime.now(UTC)
        result = store.send_event(conn, {
            "workspace_id": event.workspace_id, "type": event.type, "event_id": event_id,
            "occurred_at": occurred_at, "payload": payload,
            "payload_hash": hashlib.sha256(payload.encode("utf-8")).hexdigest(),
            "shadow_writes": self._config.producer.shadow_writes,
        })
        if result is None:
            raise ProducerError(f"unknown workspace {event.workspace_id!r}")
        stored = StoredEvent(event_id, event.workspace_id, event.type, result.mode, result.sequence,
                             result.deliveries)
        if result.mode == "live" or not result.legacy_urls:
            return stored
        body = event_body(event_id, event.type, event.workspace_id, result.sequence,
                          format_timestamp(occurred_at), result.legacy_payload or payload)
        return StoredEvent(event_id, event.workspace_id, event.type, result.mode, result.sequence,
                           result.deliveries, body, result.legacy_urls, result.secrets)

    @contextmanager
    def transaction(self, conn: store.Connection) -> Iterator[_Transaction]:
        """Commit on success then run the legacy sends; roll back on error."""
        tx = _Transaction(self, conn)
        try:
            yield tx
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        for stored in tx.sent:
            self.after_commit(stored)

    def after_commit(self, stored: StoredEvent) -> None:
        """Today's synchronous path: one POST per endpoint, logged and discarded."""
        for url in stored.legacy_urls:
            self._legacy_post(stored, url)

    def _legacy_post(self, stored: StoredEvent, url: str) -> None:
        # Runs after the caller's commit: whatever happens is logged, never
        # raised (a bad stored secret or URL must not look like a failed commit).
        started = time.monotonic()
        status: int | str
        try:
            headers = delivery_headers(stored.id, 1, int(time.time()), stored.legacy_body,
                                       signing_keys(stored.legacy_secrets))
            response = self._legacy_pool().request(
                "POST", url, body=stored.legacy_body, headers=headers,
                timeout=urllib3.Timeout(total=self._config.producer.legacy_timeout),
                retries=False, redirect=False, preload_content=False)
            status = response.status
            response.drain_conn()
            response.release_conn()
        except (urllib3.exceptions.HTTPError, ValueError, OSError) as exc:  # InvalidSecret is a ValueError
            status = type(exc).__name__
        log.info("legacy webhook event_id=%s url_host=%s status=%s duration_ms=%d", stored.id,
                 _url_host(url), status, (time.monotonic() - started) * 1000)

    def _legacy_pool(self) -> urllib3.PoolManager:
        if self._pool is None:
            self._pool = urllib3.PoolManager(num_pools=100, maxsize=4)
        return self._pool


def _url_host(url: str) -> str | None:
    """The host alone, for logs: webhook URLs often carry a token in their path."""
    try:
        return urllib3.util.parse_url(url).host
    except ValueError:
        return "<unparseable URL>"


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
