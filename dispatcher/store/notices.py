"""The store's side of lifecycle notices (``sql/notices.sql``): read each
endpoint's lifecycle facts, write what the rule decided (the lifecycle row, the
notices, the automatic pause) with the notices' operational webhooks into the
outbox, claim and finish their mails; and the confirmation of owner contacts
(migration 0019): find the contacts in use, claim and finish their
confirmation mails, count each address's mails.

Runs on a :class:`ManagedConnection` of its own (``dispatcher notify``), never
on the delivery path's connections; the API's confirm route uses
:func:`confirmation` and :func:`confirm` on its pooled connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dispatcher.redact import storable
from dispatcher.rules.lifecycle import Decision, Facts
from dispatcher.store import QUERIES, named_rows
from dispatcher.store.engine import ManagedConnection, Transaction
from dispatcher.store.queries import Connection, Row, query_rows, transaction


@dataclass(frozen=True, slots=True)
class NewNotice:
    """A notice this process just wrote (a lifecycle round)."""

    endpoint_id: int
    episode: int
    kind: str                    # rules.lifecycle.NOTICE_KINDS
    workspace_id: str
    url: str                     # the endpoint's URL
    notify_url: str | None       # the workspace's operational webhook URL
    consecutive_failures: int
    last_error: str | None
    detail: dict[str, Any] = field(default_factory=dict)  # the dates and cause the notice states


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
    detail: dict[str, Any] = field(default_factory=dict)


# (facts, database clock) -> the rule's decision and each notice's detail.
Decide = Callable[[Facts, float], tuple[Decision, dict[str, dict[str, Any]]]]


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

    def lifecycle(self, decide: Decide,
                  webhook_for: Callable[[NewNotice], OperationalWebhook | None]) -> tuple[list[NewNotice], list[int]]:
        """One lifecycle round in one transaction: for every endpoint with a step to take, ``decide``
        it, write its lifecycle row, the notices nobody wrote yet with the operational webhook
        ``webhook_for`` asks for each (None: none), and the automatic pause.  A notice and its webhook
        exist together or not at all.  Returns the notices written and the endpoints paused; nothing
        when another process holds the round."""
        written: list[NewNotice] = []
        paused: list[int] = []
        with self._conn.transaction() as tx:
            tx.execute(QUERIES["notices_round_lock"])
            if not tx.fetchall()[0]["held"]:
                return [], []
            tx.execute(QUERIES["lifecycle_facts"])
            for row in tx.fetchall():
                decision, details = decide(_facts(row), row["db_now"])
                _write_lifecycle(tx, row["endpoint_id"], decision)
                if decision.pause:
                    _pause(tx, row)
                    paused.append(row["endpoint_id"])
                for kind in decision.notices:
                    detail = details.get(kind, {})
                    if kind == "paused":  # who paused it: the rule now, or the customer or an operator
                        detail = {**detail, "cause": "lifecycle" if decision.pause else row["pause_cause"]}
                    notice = _new_notice(row, decision.episode, kind, detail)
                    if self._write_notice(tx, notice, webhook_for):
                        written.append(notice)
        return written, paused

    @staticmethod
    def _write_notice(tx: Transaction, notice: NewNotice,
                      webhook_for: Callable[[NewNotice], OperationalWebhook | None]) -> bool:
        tx.execute(QUERIES["lifecycle_notice"], {
            "endpoint_id": notice.endpoint_id, "episode": notice.episode, "kind": notice.kind,
            "workspace_id": notice.workspace_id, "detail": json.dumps(notice.detail)})
        if not tx.fetchall():
            return False
        webhook = webhook_for(notice)
        if webhook is not None:
            tx.execute(QUERIES["notices_operational_endpoint"],
                       {"workspace_id": webhook.workspace_id, "url": webhook.url})
            (endpoint,) = tx.fetchall()
            tx.execute(QUERIES["notices_operational_event"], {
                "event_id": webhook.event_id, "workspace_id": webhook.workspace_id,
                "type": webhook.event_type, "payload": webhook.payload,
                "payload_hash": webhook.payload_hash, "endpoint_id": endpoint["id"]})
        return True

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


def _facts(row: dict[str, Any]) -> Facts:
    return Facts(breaker_closed=row["breaker_closed"], episode=int(row["episode"]), running=row["running"],
                 failing_since=row["failing_since"], closed_at=row["closed_at"], paused_at=row["paused_at"],
                 sent=frozenset(row["sent"] or ()), pausable=row["pausable"])


def _pause(tx: Transaction, row: dict[str, Any]) -> None:
    """The automatic pause (api_pause_endpoint, cause 'lifecycle'), audited like an operator's."""
    tx.execute(QUERIES["api_pause_endpoint"], {"id": row["endpoint_id"], "cause": "lifecycle"})
    held = tx.fetchall()[0]["held"]
    tx.execute(QUERIES["api_audit_insert"], {
        "workspace_id": row["workspace_id"], "token_id": None, "action": "endpoint.pause",
        "endpoint_id": row["endpoint_id"], "delivery_ids": [],
        "detail": json.dumps({"cause": "lifecycle", "held": held})})


def _write_lifecycle(tx: Transaction, endpoint_id: int, decision: Decision) -> None:
    tx.execute(QUERIES["lifecycle_write"], {
        "endpoint_id": endpoint_id, "episode": decision.episode, "failing_since": decision.failing_since,
        "closed_at": decision.closed_at, "running": decision.running, "stage": decision.stage,
        "next_step": decision.next_step, "next_step_at": decision.next_step_at})


def _new_notice(row: dict[str, Any], episode: int, kind: str, detail: dict[str, Any]) -> NewNotice:
    return NewNotice(endpoint_id=row["endpoint_id"], episode=episode, kind=kind, workspace_id=row["workspace_id"],
                     url=row["url"], notify_url=row["notify_url"], consecutive_failures=row["consecutive_failures"],
                     last_error=row["last_error"], detail=detail)
