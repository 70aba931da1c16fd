"""The store's side of breaker notices (``sql/notices.sql``): find them once,
write their operational webhooks into the outbox, claim and finish their mails;
and the confirmation of owner contacts (migration 0019): find the contacts in
use, claim and finish their confirmation mails, count each address's mails.

Runs on a :class:`ManagedConnection` of its own (``dispatcher notify``), never
on the delivery path's connections; the API's confirm route uses
:func:`confirmation` and :func:`confirm` on its pooled connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.redact import storable
from dispatcher.store import QUERIES, named_rows
from dispatcher.store.engine import ManagedConnection
from dispatcher.store.queries import Connection, Row, query_rows, transaction


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
    endpoint_owner_confirmed: bool   # by the mailed link (0019); only a confirmed contact hears
    workspace_owner_confirmed: bool
    consecutive_failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ClaimedConfirmation:
    """An owner contact whose confirmation mail this process now sends (contacts_claim)."""

    workspace_id: str
    address: str
    attempts: int                # including this one


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

    def defer(self, notice: ClaimedNotice, wait: float) -> None:
        """Due again in ``wait`` seconds, the claim's attempt given back: its recipient had its mails."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_defer"], {"endpoint_id": notice.endpoint_id, "episode": notice.episode,
                                                   "kind": notice.kind, "wait": wait})

    def recent_mails(self, address: str) -> list[float]:
        """How long ago (seconds) each mail of the last hour to ``address`` was sent."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_recent_mails"], {"address": address})
            return [float(row[0]) for row in cur.fetchall()]

    def discover_contacts(self) -> None:
        """Give every owner contact in use a confirmation row; drop the rows of those no longer used."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["contacts_discover"])

    def claim_confirmations(self, limit: int, lease: float) -> list[ClaimedConfirmation]:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["contacts_claim"], {"limit": limit, "lease": lease})
            return [ClaimedConfirmation(**row) for row in named_rows(cur)]

    def finish_confirmation(self, claimed: ClaimedConfirmation, *, token_hash: str | None = None,
                            error: str | None = None, retry_in: float | None = None) -> None:
        """Sent (``token_hash``: the link's), or failed with ``error`` and tried again in ``retry_in``
        seconds (None: given up)."""
        with self._conn.statement() as cur:
            cur.execute(QUERIES["contacts_finish"], {
                "workspace_id": claimed.workspace_id, "address": claimed.address, "sent": token_hash is not None,
                "token_hash": token_hash, "error": storable(error), "retry_in": retry_in})

    def defer_confirmation(self, claimed: ClaimedConfirmation, wait: float) -> None:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["contacts_defer"], {"workspace_id": claimed.workspace_id,
                                                    "address": claimed.address, "wait": wait})

    def prune(self, older_than: float) -> int:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["notices_prune"], {"older_than": older_than})
            return int(cur.rowcount)

    def close(self) -> None:
        self._conn.close()


def confirmation(conn: Connection, token_hash: str) -> Row | None:
    """Whose confirmation link has this token hash (workspace_id, address, confirmed_at); None: nobody's."""
    with transaction(conn):
        rows = query_rows(conn, "contacts_by_token", {"token_hash": token_hash})
    return rows[0] if rows else None


def confirm(conn: Connection, token_hash: str) -> Row | None:
    """Confirm the contact whose link has this token hash (again: no change); None: no such link."""
    with transaction(conn):
        rows = query_rows(conn, "contacts_confirm", {"token_hash": token_hash})
    return rows[0] if rows else None
