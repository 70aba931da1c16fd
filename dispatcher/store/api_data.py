"""The HTTP API's data layer: delivery history, replay, recover, endpoint state, tokens.

Every statement the API runs is here (queries in ``sql/api.sql``).  Each
public function owns its transaction (``store.transaction``) so a request is one or
two short transactions and never holds locks while the client reads the
response.  Every lookup is scoped by ``workspace_id``: a row of another
workspace is indistinguishable from a missing one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dispatcher.redact import cut_bytes
from dispatcher.rules.replay_budget import ReplayBudget, Spent
from dispatcher.rules.retry import ENDPOINT_DEACTIVATED, ENDPOINT_DELETED, RETRYABLE_ERRORS
from dispatcher.store import (
    Audit,
    Conflict,
    Connection,
    NotFound,
    QueryRejected,
    ReplayLimited,
    audit,
    limit_or,
    query_rows,
    run_query,
    transaction,
)

DELIVERY_COLUMNS = (
    "id", "event_id", "event_type", "endpoint_id", "status", "attempt", "mode", "payload_hash",
    "replay_of", "created_at", "next_attempt_at", "delivered_at", "finished_at",
    "last_status_code", "last_error",
)
Row = dict[str, Any]
# The transport failures the breaker counts (policy.RETRYABLE_ERRORS): with the
# attempts that got a status code, the attempts that went on the wire, which the
# success rates count.  Blocked URLs, shadow rows and rows that could never be
# sent say nothing about the endpoint's health.
SENT_ERRORS = sorted(RETRYABLE_ERRORS)


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    event_id: str | None = None
    endpoint_id: int | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class RecoverResult:
    queued: int
    units: int


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """The rows of ``api_endpoint_stats`` and the window they cover (database clock)."""

    since: datetime
    until: datetime
    bucket_seconds: float
    rows: list[Row]


def session_setup(conn: Connection, statement_timeout_ms: int) -> None:
    with transaction(conn):
        run_query(conn, "api_session_setup", {"statement_timeout": str(statement_timeout_ms)})


def ping(conn: Connection) -> None:
    with transaction(conn):
        run_query(conn, "api_ping")


@dataclass(frozen=True, slots=True)
class FoundToken:
    id: int
    workspace_id: str
    scopes: frozenset[str]


def insert_token(conn: Connection, token_sha256: str, workspace_id: str, scopes: Sequence[str], prefix: str,
                 expires_in: float | None = None) -> int:
    """Store a token's hash; it expires ``expires_in`` seconds from now (None: never)."""
    with transaction(conn):
        rows = run_query(conn, "api_insert_token",
                         {"token_sha256": token_sha256, "workspace_id": workspace_id, "scopes": list(scopes),
                          "prefix": prefix, "expires_in": expires_in})
    if not rows:
        raise NotFound(f"workspace {workspace_id!r} does not exist")
    return int(rows[0][0])


def lookup_token(conn: Connection, token_sha256: str, touch_every: float) -> FoundToken | None:
    """The live (not revoked, not expired) token with this hash, marking it used at most every ``touch_every`` s."""
    with transaction(conn):
        rows = query_rows(conn, "api_lookup_token", {"token_sha256": token_sha256, "touch_every": touch_every})
    if not rows:
        return None
    return FoundToken(int(rows[0]["id"]), str(rows[0]["workspace_id"]), frozenset(rows[0]["scopes"]))


def list_tokens(conn: Connection, workspace_id: str | None, before_id: int | None, limit: int) -> list[Row]:
    """Up to ``limit`` tokens below ``before_id``, newest first (workspace None: every workspace)."""
    with transaction(conn):
        return query_rows(conn, "api_list_tokens",
                          {"workspace_id": workspace_id, "before_id": before_id, "limit": limit})


def revoke_token(conn: Connection, token_id: int) -> None:
    """Revoke a token; NotFound if no such token, Conflict if already revoked."""
    with transaction(conn):
        if run_query(conn, "api_revoke_token", {"id": token_id}):
            return
        if run_query(conn, "api_token_exists", {"id": token_id}):
            raise Conflict(f"token {token_id} is already revoked")
    raise NotFound(f"token {token_id} does not exist")


def list_audit(conn: Connection, workspace_id: str, endpoint_id: int | None, before_id: int | None,
               limit: int) -> list[Row]:
    with transaction(conn):
        return query_rows(conn, "api_list_audit", {"workspace_id": workspace_id, "endpoint_id": endpoint_id,
                                                   "before_id": before_id, "limit": limit})


def _excerpt(text: str | None) -> str | None:
    if text is None:
        return None
    return cut_bytes(text)


def _attempts(conn: Connection, ids: Sequence[int]) -> dict[int, list[Row]]:
    by_delivery: dict[int, list[Row]] = {i: [] for i in ids}
    if not ids:
        return by_delivery
    for row in query_rows(conn, "api_delivery_attempts", {"ids": list(ids)}):
        row["response_excerpt"] = _excerpt(row["response_excerpt"])
        by_delivery[row.pop("delivery_id")].append(row)
    return by_delivery


def list_deliveries(conn: Connection, workspace_id: str, filters: DeliveryFilter, before_id: int | None,
                    limit: int, with_attempts: bool = False) -> list[Row]:
    """Up to ``limit`` deliveries below ``before_id``, newest first."""
    params = {"workspace_id": workspace_id, "before_id": before_id, "limit": limit,
              "event_id": filters.event_id, "endpoint_id": filters.endpoint_id, "status": filters.status,
              "since": filters.since, "until": filters.until}
    with transaction(conn):
        rows = query_rows(conn, "api_list_deliveries", params)
        if with_attempts:
            attempts = _attempts(conn, [r["id"] for r in rows])
            for row in rows:
                row["attempts"] = attempts[row["id"]]
    return rows


def get_delivery(conn: Connection, workspace_id: str, delivery_id: int) -> Row:
    """One delivery with every attempt; NotFound also for other workspaces' ids."""
    with transaction(conn):
        rows = query_rows(conn, "api_get_delivery", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        row = rows[0]
        row["attempts"] = _attempts(conn, [delivery_id])[delivery_id]
    return row


def event_exists(conn: Connection, workspace_id: str, event_id: str) -> bool:
    with transaction(conn):
        return bool(run_query(conn, "api_event_exists", {"event_id": event_id, "workspace_id": workspace_id}))


def _charge(conn: Connection, workspace_id: str, units: int, budget: ReplayBudget) -> None:
    """Spend ``units`` of the workspace's and the region's sliding-hour budgets, or raise the refusal.

    Must run inside the caller's transaction, after ``api_replay_lock`` and
    before anything is written: a refused request then writes nothing, and
    a spend commits or rolls back together with the rows it paid for.
    """
    window = [Spent(int(r["units"]), float(r["expires_in"]))
              for r in query_rows(conn, "api_replay_window", {"workspace_id": workspace_id})]
    refusal = budget.refusal(window, units)
    if refusal is None and budget.region_per_hour is not None:
        run_query(conn, "api_region_replay_lock")
        region = [Spent(int(r["units"]), float(r["expires_in"]))
                  for r in query_rows(conn, "api_region_replay_window")]
        refusal = budget.region_refusal(region, units)
    if refusal is not None:
        raise ReplayLimited(refusal.message, refusal.retry_after)
    run_query(conn, "api_replay_spend", {"workspace_id": workspace_id, "units": units})


def replay(conn: Connection, workspace_id: str, delivery_id: int, budget: ReplayBudget,
           token_id: int | None) -> Row:
    """Queue a new pending delivery of the same event to the same endpoint."""
    with transaction(conn):
        rows = query_rows(conn, "api_replay_source", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        source = rows[0]
        _check_replayable(delivery_id, source)
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        _charge(conn, workspace_id, 1, budget)
        row = query_rows(conn, "api_insert_replay", {
            "workspace_id": workspace_id, "endpoint_id": source["endpoint_id"], "event_id": source["event_id"],
            "payload_hash": source["payload_hash"], "replay_of": delivery_id})[0]
        audit(conn, Audit(workspace_id, token_id, "delivery.replay", source["endpoint_id"], [row["id"]],
                          {"replay_of": delivery_id}))
    row["attempts"] = []
    return row


def _check_replayable(delivery_id: int, source: Row) -> None:
    endpoint_id, event_id = source["endpoint_id"], source["event_id"]
    if source["shadow_while_off"]:
        raise Conflict(f"delivery {delivery_id} is a shadow (rollout phase 0) row and this workspace's "
                       "webhook outbox is off; it cannot be replayed as a live send")
    if not source["endpoint_exists"]:
        raise Conflict(f"endpoint {endpoint_id} has been deleted; the delivery cannot be replayed")
    if not source["endpoint_active"]:
        raise Conflict(f"endpoint {endpoint_id} is inactive; activate it before replaying")
    if not source["event_exists"]:
        raise Conflict(f"event {event_id} is no longer retained; the delivery cannot be replayed")


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

    def fields(self) -> list[str]:
        given = {"url": self.url is not None, "event_types": self.event_types is not None,
                 "active": self.active is not None, "description": self.set_description,
                 "owner_contact": self.set_owner_contact}
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
            "owner_contact": change.owner_contact if change.set_owner_contact else old["owner_contact"]})
        ended: list[int] = []
        if old["active"] and not active:
            ended = _end_pending(conn, endpoint_id, ENDPOINT_DEACTIVATED)
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.update", endpoint_id, ended,
                          {"fields": change.fields(), "active": active}))


def delete_endpoint(conn: Connection, workspace_id: str | None, endpoint_id: int, token_id: int | None) -> None:
    """Delete the endpoint; its pending rows not in flight end ``policy.ENDPOINT_DELETED``."""
    with transaction(conn):
        old = _locked_endpoint(conn, workspace_id, endpoint_id)
        ended = _end_pending(conn, endpoint_id, ENDPOINT_DELETED)
        run_query(conn, "api_delete_endpoint", {"id": endpoint_id})
        audit(conn, Audit(old["workspace_id"], token_id, "endpoint.delete", endpoint_id, ended, {}))


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


def recover(conn: Connection, workspace_id: str, endpoint_id: int, since: datetime, until: datetime | None,
            budget: ReplayBudget, token_id: int | None) -> RecoverResult:
    """Re-queue, as new replay rows, each event that died or failed on this endpoint since ``since``.

    Charged ceil(rows / 100) replay units; a request that does not fit the
    remaining budget is refused whole, never half-applied.
    """
    params = {"endpoint_id": endpoint_id, "workspace_id": workspace_id, "since": since, "until": until}
    with transaction(conn):
        rows = query_rows(conn, "api_endpoint_for_recover", {"id": endpoint_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"endpoint {endpoint_id} does not exist")
        if not rows[0]["active"]:
            raise Conflict(f"endpoint {endpoint_id} is inactive; activate it before recovering")
        # The lock also serialises concurrent recovers of one endpoint, so the
        # "already pending" test below cannot let both queue the same event.
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        # Count, pay, then insert exactly what was paid for: a refused charge
        # raises before any row is written (no insert-then-rollback churn in
        # the hot outbox table).
        ids = [int(r["id"]) for r in query_rows(conn, "api_recover_candidates", params)]
        if not ids:
            return RecoverResult(queued=0, units=0)
        units = budget.units_for_rows(len(ids))
        _charge(conn, workspace_id, units, budget)
        queued = [int(r[0]) for r in run_query(conn, "api_recover_insert", {"ids": ids, "workspace_id": workspace_id})]
        audit(conn, Audit(workspace_id, token_id, "endpoint.recover", endpoint_id, queued, {
            "since": since.isoformat(), "until": None if until is None else until.isoformat(),
            "queued": len(queued), "replay_units": units}))
    return RecoverResult(queued=len(queued), units=units)


@contextmanager
def _limit_reached() -> Iterator[None]:
    """The 10-active-endpoints trigger's refusal as LimitReached."""
    try:
        yield
    except QueryRejected as exc:
        raise limit_or(exc) from None


def endpoint_stats(conn: Connection, workspace_id: str, window_seconds: int, buckets: int) -> StatsWindow:
    """Each endpoint's attempts of the last ``window_seconds``, in ``buckets`` equal buckets and in total."""
    with transaction(conn):
        until = query_rows(conn, "api_clock")[0]["now"]
        since = until - timedelta(seconds=window_seconds)
        bucket_seconds = window_seconds / buckets
        rows = query_rows(conn, "api_endpoint_stats", {
            "workspace_id": workspace_id, "since": since, "until": until, "bucket_seconds": bucket_seconds,
            "sent_errors": SENT_ERRORS})
    return StatsWindow(since, until, bucket_seconds, rows)
