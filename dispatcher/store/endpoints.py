"""Endpoint state and changes for the API and the CLI's operator verbs (``api_*`` in ``sql/api.sql``).

Each public function owns its transaction (``store.transaction``).  A
``workspace_id`` of None (the CLI) reaches any endpoint; otherwise an
endpoint of another workspace is indistinguishable from a missing one.
Every change writes its audit entry in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.rules.retry import ENDPOINT_DEACTIVATED, ENDPOINT_DELETED, RETRYABLE_ERRORS
from dispatcher.store.audit import Audit, audit
from dispatcher.store.errors import Conflict, NotFound, QueryRejected, limit_or
from dispatcher.store.queries import Connection, Row, query_rows, run_query, transaction

# The transport failures the breaker counts (policy.RETRYABLE_ERRORS): with the
# attempts that got a status code, the attempts that went on the wire, which the
# success rates count.  Blocked URLs, shadow rows and rows that could never be
# sent say nothing about the endpoint's health.
SENT_ERRORS = sorted(RETRYABLE_ERRORS)


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """The rows of ``api_endpoint_stats`` and the window they cover (database clock)."""

    since: datetime
    until: datetime
    bucket_seconds: float
    rows: list[Row]


def endpoints(conn: Connection, workspace_id: str | None, grace: float, before_id: int | None = None,
              limit: int = 1, endpoint_id: int | None = None) -> list[Row]:
    """A page of endpoints with breaker, backlog and 24 h success figures (workspace None: any)."""
    with transaction(conn):
        return query_rows(conn, "api_endpoints", {"workspace_id": workspace_id, "id": endpoint_id,
                                                  "before_id": before_id, "limit": limit, "grace": grace,
                                                  "sent_errors": SENT_ERRORS})


def endpoint_state(conn: Connection, workspace_id: str | None, endpoint_id: int, grace: float) -> Row:
    rows = endpoints(conn, workspace_id, grace, endpoint_id=endpoint_id)
    if not rows:
        raise NotFound(f"endpoint {endpoint_id} does not exist")
    return rows[0]


@dataclass(frozen=True, slots=True)
class EndpointChange:
    """A PATCH: the fields given (None: unchanged; description and owner_contact may be set to None, hence
    their flags)."""

    url: str | None = None
    event_types: Sequence[str] | None = None
    active: bool | None = None
    description: str | None = None
    set_description: bool = False
    owner_contact: str | None = None
    set_owner_contact: bool = False
    trace_headers: bool | None = None

    def fields(self) -> list[str]:
        given = {"url": self.url is not None, "event_types": self.event_types is not None,
                 "active": self.active is not None, "description": self.set_description,
                 "owner_contact": self.set_owner_contact, "trace_headers": self.trace_headers is not None}
        return [name for name, present in given.items() if present]


def _locked_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int) -> Row:
    rows = query_rows(conn, "api_lock_endpoint", {"id": endpoint_id, "workspace_id": workspace_id})
    if not rows:
        raise NotFound(f"endpoint {endpoint_id} does not exist")
    return rows[0]


def update_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int, change: EndpointChange,
                    token_id: int | None) -> None:
    """Apply ``change``; deactivating ends the pending rows not in flight (``policy.ENDPOINT_DEACTIVATED``)."""
    with _limit_reached(), transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        active = old["active"] if change.active is None else change.active
        run_query(conn, "api_update_endpoint", {
            "id": endpoint_id, "url": old["url"] if change.url is None else change.url,
            "event_types": list(old["event_types"] if change.event_types is None else change.event_types),
            "active": active, "description": change.description if change.set_description else old["description"],
            "owner_contact": change.owner_contact if change.set_owner_contact else old["owner_contact"],
            "trace_headers": old["trace_headers"] if change.trace_headers is None else change.trace_headers})
        ended: list[int] = []
        if old["active"] and not active:
            ended = _end_pending(conn, endpoint_id, ENDPOINT_DEACTIVATED)
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.update", endpoint_id, ended,
                          {"fields": change.fields(), "active": active}))


class HeldRowsUnconfirmed(Conflict):
    """Deleting a paused endpoint would end rows it holds, and the caller did not confirm it."""

    def __init__(self, endpoint_id: int, held: int) -> None:
        super().__init__(f"endpoint {endpoint_id} holds {held} undelivered events (it is paused); deleting it "
                         f"ends them: confirm with ?confirm=held (API) or --yes (CLI), or resume it first")
        self.held = held


def delete_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int, token_id: int | None,
                    confirm_held: bool = False) -> None:
    """Delete the endpoint and its breaker; its pending rows not in flight end ``policy.ENDPOINT_DELETED``,
    and so do the rows it holds while paused -- only with ``confirm_held`` when there are any
    (:class:`HeldRowsUnconfirmed`, nothing changed); each ended row gets a history entry.  The audit
    entry names the held rows ended."""
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        _delete(conn, old["workspace_id"], endpoint_id, token_id, confirm_held)


def delete_workspace_endpoints(conn: Connection, workspace_id: str) -> list[int]:
    """Delete every endpoint of the workspace, each as :func:`delete_endpoint` does (an operator's: no
    token).  Deleting them all is the confirmation: held rows end too, never left for no one to see."""
    with transaction(conn):
        ids = [int(row[0]) for row in run_query(conn, "api_lock_workspace_endpoints", {"workspace_id": workspace_id})]
        for endpoint_id in ids:
            _delete(conn, workspace_id, endpoint_id, None, confirm_held=True)
    return ids


def _delete(conn: Connection, workspace_id: str, endpoint_id: int, token_id: int | None,
            confirm_held: bool) -> None:
    held = int(query_rows(conn, "api_held_count", {"id": endpoint_id})[0]["held"])
    if held and not confirm_held:
        raise HeldRowsUnconfirmed(endpoint_id, held)
    ended = _end_pending(conn, endpoint_id, ENDPOINT_DELETED)
    ended_held = [int(r[0]) for r in run_query(conn, "api_end_held", {"id": endpoint_id, "reason": ENDPOINT_DELETED})]
    run_query(conn, "api_delete_endpoint", {"id": endpoint_id})
    audit(conn, Audit(workspace_id, token_id, "endpoint.delete", endpoint_id, ended + ended_held,
                      {"held_ended": len(ended_held)} if ended_held else {}))


# Who paused an endpoint (webhook_endpoints.pause_cause, migration 0020).
PAUSE_CAUSES = ("customer", "operator", "lifecycle")


@dataclass(frozen=True, slots=True)
class PauseChange:
    """What a pause or a resume did: the pause's time and cause, and the rows it held or released."""

    paused_at: datetime | None
    cause: str | None
    rows: int
    changed: bool                # False: already paused (pause) or not paused (resume)


def pause_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int, cause: str,
                   token_id: int | None) -> PauseChange:
    """Pause the endpoint: its pending rows not in flight and every new event for it are held, not sent
    (docs/operations.md, "Pausing an endpoint").  Pausing a paused endpoint keeps its first time and cause."""
    if cause not in PAUSE_CAUSES:
        raise ValueError(f"unknown pause cause {cause!r}")
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        row = query_rows(conn, "api_pause_endpoint", {"id": endpoint_id, "cause": cause})[0]
        change = PauseChange(row["paused_at"], row["pause_cause"], int(row["held"]), bool(row["now_paused"]))
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.pause", endpoint_id, (),
                          {"cause": change.cause, "held": change.rows, "already_paused": not change.changed}))
    return change


def resume_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int, token_id: int | None) -> PauseChange:
    """Resume: the held rows are pending again in their order, their held time off their retry window,
    and the breaker is closed; the claim drains them within the endpoint's limits."""
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        rows = query_rows(conn, "api_resume_endpoint", {"id": endpoint_id})
        change = (PauseChange(rows[0]["paused_at"], rows[0]["pause_cause"], int(rows[0]["released"]), True)
                  if rows else PauseChange(None, None, 0, False))
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.resume", endpoint_id, (),
                          {"was_paused_by": change.cause, "released": change.rows}))
    return change


def _end_pending(conn: Connection, endpoint_id: int, reason: str) -> list[int]:
    return [int(r[0]) for r in run_query(conn, "api_end_pending", {"id": endpoint_id, "reason": reason})]


def close_breaker(conn: Connection, workspace_id: str | None, endpoint_id: int, token_id: int | None) -> int:
    """Reset the endpoint's breaker to closed and make its pending rows due; returns how many were made due."""
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        before = query_rows(conn, "api_breaker_before_close", {"id": endpoint_id})
        made_due = int(run_query(conn, "api_close_breaker", {"id": endpoint_id})[0][0])
        was = before[0] if before else {"state": "closed", "consecutive_failures": 0}
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.breaker_close", endpoint_id, (), {
            "stored_state": was["state"], "consecutive_failures": was["consecutive_failures"],
            "made_due": made_due}))
    return made_due


def rotate_endpoint_secret(conn: Connection, workspace_id: str | None, endpoint_id: int, secret: str,
                           grace: float, token_id: int | None) -> datetime:
    """Make ``secret`` the endpoint's; returns until when the previous one also signs."""
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        valid_until: datetime = run_query(conn, "api_rotate_endpoint_secret",
                                          {"id": endpoint_id, "secret": secret, "grace": grace})[0][0]
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.secret_rotate", endpoint_id, (),
                          {"previous_valid_until": valid_until.isoformat()}))
    return valid_until


@contextmanager
def _limit_reached() -> Iterator[None]:
    """The endpoint-limit trigger's refusal (10 active, 100 in all) as LimitReached."""
    try:
        yield
    except QueryRejected as exc:
        raise limit_or(exc) from None


def endpoint_stats(conn: Connection, workspace_id: str, window_seconds: int, buckets: int,
                   before_id: int | None = None, limit: int = 1) -> StatsWindow:
    """A page of endpoints (at most ``limit`` below ``before_id``, newest first) with their attempts of the
    last ``window_seconds``, in ``buckets`` equal buckets and in total."""
    with transaction(conn):
        until = query_rows(conn, "api_clock")[0]["now"]
        since = until - timedelta(seconds=window_seconds)
        bucket_seconds = window_seconds / buckets
        rows = query_rows(conn, "api_endpoint_stats", {
            "workspace_id": workspace_id, "since": since, "until": until, "bucket_seconds": bucket_seconds,
            "sent_errors": SENT_ERRORS, "before_id": before_id, "limit": limit})
    return StatsWindow(since, until, bucket_seconds, rows)
