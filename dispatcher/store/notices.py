"""The store's side of breaker notices (``sql/notices.sql``): find them once,
write their operational webhooks into the outbox, claim and finish their mails.

Runs on a :class:`ManagedConnection` of its own (``dispatcher notify``), never
on the delivery path's connections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.redact import storable
from dispatcher.store import QUERIES, named_rows
from dispatcher.store.engine import ManagedConnection


@dataclass(frozen=True, slots=True)
class NewNotice:
    """A notice this process just wrote (notices_discover)."""

    endpoint_id: int
    episode: int
    kind: str                    # 'opened' or 'recovered'
    workspace_id: str
    url: str                     # the endpoint's URL
    notify_url: str | None       # the workspace's operational webhook URL
    consecutive_failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ClaimedNotice:
    """A notice whose mail this process now sends (notices_claim)."""

    endpoint_id: int
    episode: int
    kind: str
    workspace_id: str
    attempts: int                # including this one
    url: str | None              # None: the endpoint was deleted since
    endpoint_owner: str | None
    workspace_owner: str | None
    consecutive_failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class OperationalWebhook:
    """An event for the workspace's operational endpoint, and its one delivery."""

    workspace_id: str
    url: str
    event_id: str
    event_type: str
    payload: str
    payload_hash: str


class NoticeStore:
    def __init__(self, conn: ManagedConnection) -> None:
        self._conn = conn

    def discover(self, webhook_for: Callable[[NewNotice], OperationalWebhook | None]) -> list[NewNotice]:
        """Write the notices nobody wrote yet and, in the same transaction, the
        operational webhook ``webhook_for`` asks for each (None: none): a notice
        and its webhook exist together or not at all."""
        with self._conn.transaction() as tx:
            tx.execute(QUERIES["notices_discover"])
            found = [NewNotice(**row) for row in tx.fetchall()]
            for notice in found:
                webhook = webhook_for(notice)
                if webhook is None:
                    continue
                tx.execute(QUERIES["notices_operational_endpoint"],
                           {"workspace_id": webhook.workspace_id, "url": webhook.url})
                (endpoint,) = tx.fetchall()
                tx.execute(QUERIES["notices_operational_event"], {
                    "event_id": webhook.event_id, "workspace_id": webhook.workspace_id,
                    "type": webhook.event_type, "payload": webhook.payload,
                    "payload_hash": webhook.payload_hash, "endpoint_id": endpoint["id"]})
        return found

    def claim(self, limit: int, lease: float) -> list[ClaimedNotice]:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_claim"], {"limit": limit, "lease": lease})
            return [ClaimedNotice(**row) for row in named_rows(cur)]

    def finish(self, notice: ClaimedNotice, recipient: str, *, sent: bool, error: str | None = None,
               retry_in: float | None = None) -> None:
        """Sent, or failed with ``error`` and tried again in ``retry_in`` seconds (None: given up)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_finish"], {
                "endpoint_id": notice.endpoint_id, "episode": notice.episode, "kind": notice.kind,
                "sent": sent, "recipient": recipient, "error": storable(error), "retry_in": retry_in})

    def prune(self, older_than: float) -> int:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_prune"], {"older_than": older_than})
            return int(cur.rowcount)

    def close(self) -> None:
        self._conn.close()
