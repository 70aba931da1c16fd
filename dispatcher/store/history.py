"""The HTTP API's reads and writes: delivery history, replay, endpoint state.

Every statement the API runs is here (queries in ``sql/history.sql``).  Each
public function owns its transaction (``with conn``) so a request is one or
two short transactions and never holds locks while the client reads the
response.  Every lookup is scoped by ``workspace_id``: a row of another
workspace is indistinguishable from a missing one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.store import Connection, LimitReached, NotFound, StoreError, run_query

DELIVERY_COLUMNS = (
    "id", "event_id", "event_type", "endpoint_id", "status", "attempt", "mode", "payload_hash",
    "replay_of", "created_at", "next_attempt_at", "delivered_at", "finished_at",
    "last_status_code", "last_error",
)
ATTEMPT_COLUMNS = (
    "delivery_id", "attempt", "started_at", "duration_ms", "result", "status_code", "error", "response_excerpt",
)
ENDPOINT_COLUMNS = (
    "id", "url", "active", "event_types", "created_at",
    "state", "consecutive_failures", "open_until", "opened_at", "probe_due",
    "last_success_at", "last_failure_at", "last_error",
    "pending_count", "oldest_pending_at", "oldest_pending_age_seconds",
)
# RFC-014 security section: responses carry at most 256 bytes of the body.
EXCERPT_BYTES = 256
# A recover is charged one replay unit per this many rows it queues.
ROWS_PER_REPLAY_UNIT = 100

Row = dict[str, Any]


class Conflict(StoreError):
    """The request is well formed but the rows' state refuses it (HTTP 409)."""


class ReplayLimited(LimitReached):
    """The workspace's hourly replay budget would be exceeded."""

    def __init__(self, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # None: the request can never fit


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


def session_setup(conn: Connection, statement_timeout_ms: int) -> None:
    with conn:
        run_query(conn, "api_session_setup", {"statement_timeout": str(statement_timeout_ms)})


def schema_ready(conn: Connection) -> bool:
    with conn:
        return bool(run_query(conn, "api_schema_ready")[0][0])


def ping(conn: Connection) -> None:
    with conn:
        run_query(conn, "api_ping")


def insert_token(conn: Connection, token_sha256: str, workspace_id: str, scopes: Sequence[str]) -> None:
    with conn:
        rows = run_query(conn, "api_insert_token",
                         {"token_sha256": token_sha256, "workspace_id": workspace_id, "scopes": list(scopes)})
    if not rows:
        raise NotFound(f"workspace {workspace_id!r} does not exist")


def lookup_token(conn: Connection, token_sha256: str) -> tuple[str, frozenset[str]] | None:
    with conn:
        rows = run_query(conn, "api_lookup_token", {"token_sha256": token_sha256})
    if not rows:
        return None
    return str(rows[0][0]), frozenset(rows[0][1])


def _excerpt(text: str | None) -> str | None:
    if text is None:
        return None
    # Cut on bytes, not characters, and drop a split multi-byte tail.
    return text.encode("utf-8")[:EXCERPT_BYTES].decode("utf-8", errors="ignore")


def _attempts(conn: Connection, ids: Sequence[int]) -> dict[int, list[Row]]:
    by_delivery: dict[int, list[Row]] = {i: [] for i in ids}
    if not ids:
        return by_delivery
    for values in run_query(conn, "api_delivery_attempts", {"ids": list(ids)}):
        row = dict(zip(ATTEMPT_COLUMNS, values, strict=True))
        row["response_excerpt"] = _excerpt(row["response_excerpt"])
        by_delivery[row.pop("delivery_id")].append(row)
    return by_delivery


def list_deliveries(conn: Connection, workspace_id: str, filters: DeliveryFilter, before_id: int | None,
                    limit: int, with_attempts: bool = False) -> list[Row]:
    """Up to ``limit`` deliveries below ``before_id``, newest first."""
    params = {"workspace_id": workspace_id, "before_id": before_id, "limit": limit,
              "event_id": filters.event_id, "endpoint_id": filters.endpoint_id, "status": filters.status,
              "since": filters.since, "until": filters.until}
    with conn:
        rows = [dict(zip(DELIVERY_COLUMNS, r, strict=True)) for r in run_query(conn, "api_list_deliveries", params)]
        if with_attempts:
            attempts = _attempts(conn, [r["id"] for r in rows])
            for row in rows:
                row["attempts"] = attempts[row["id"]]
    return rows


def get_delivery(conn: Connection, workspace_id: str, delivery_id: int) -> Row:
    """One delivery with every attempt; NotFound also for other workspaces' ids."""
    with conn:
        rows = run_query(conn, "api_get_delivery", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        row = dict(zip(DELIVERY_COLUMNS, rows[0], strict=True))
        row["attempts"] = _attempts(conn, [delivery_id])[delivery_id]
    return row


def event_exists(conn: Connection, workspace_id: str, event_id: str) -> bool:
    with conn:
        return bool(run_query(conn, "api_event_exists", {"event_id": event_id, "workspace_id": workspace_id}))


def _charge(conn: Connection, workspace_id: str, units: int, limit: int) -> None:
    """Spend ``units`` of the workspace's sliding-hour budget or raise ReplayLimited.

    Must run inside the caller's transaction, after ``api_replay_lock``: the
    spend then commits or rolls back together with the rows it paid for.
    """
    window = run_query(conn, "api_replay_window", {"workspace_id": workspace_id})
    used = sum(int(units_) for units_, _ in window)
    if used + units <= limit:
        run_query(conn, "api_replay_spend", {"workspace_id": workspace_id, "units": units})
        return
    if units > limit:
        raise ReplayLimited(f"this request needs {units} replay units but the hourly limit is {limit}", None)
    # Wait until enough of the oldest spending has left the window.
    excess, freed = used + units - limit, 0
    for spent, expires_in in window:
        freed += int(spent)
        if freed >= excess:
            retry_after = max(1, math.ceil(float(expires_in)))
            break
    else:  # unreachable: the whole window frees `used` >= excess units
        retry_after = 3600
    raise ReplayLimited(f"replay limit of {limit} per hour reached for this workspace", retry_after)


def replay(conn: Connection, workspace_id: str, delivery_id: int, limit: int) -> Row:
    """Queue a new pending delivery of the same event to the same endpoint."""
    with conn:
        rows = run_query(conn, "api_replay_source", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        endpoint_id, event_id, payload_hash, endpoint_exists, endpoint_active, event_exists_, shadow_off = rows[0]
        if shadow_off:
            raise Conflict(f"delivery {delivery_id} is a shadow (rollout phase 0) row and this workspace's "
                           "webhook outbox is off; it cannot be replayed as a live send")
        if not endpoint_exists:
            raise Conflict(f"endpoint {endpoint_id} has been deleted; the delivery cannot be replayed")
        if not endpoint_active:
            raise Conflict(f"endpoint {endpoint_id} is inactive; activate it before replaying")
        if not event_exists_:
            raise Conflict(f"event {event_id} is no longer retained; the delivery cannot be replayed")
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        _charge(conn, workspace_id, 1, limit)
        new = run_query(conn, "api_insert_replay", {
            "workspace_id": workspace_id, "endpoint_id": endpoint_id, "event_id": event_id,
            "payload_hash": payload_hash, "replay_of": delivery_id})
    row = dict(zip(DELIVERY_COLUMNS, new[0], strict=True))
    row["attempts"] = []
    return row


def endpoint_state(conn: Connection, workspace_id: str, endpoint_id: int) -> Row:
    with conn:
        rows = run_query(conn, "api_endpoint", {"id": endpoint_id, "workspace_id": workspace_id})
    if not rows:
        raise NotFound(f"endpoint {endpoint_id} does not exist")
    return dict(zip(ENDPOINT_COLUMNS, rows[0], strict=True))


def recover(conn: Connection, workspace_id: str, endpoint_id: int, since: datetime, until: datetime | None,
            limit: int) -> RecoverResult:
    """Re-queue, as new replay rows, each event that died or failed on this endpoint since ``since``.

    Charged ceil(rows / 100) replay units; a request that does not fit the
    remaining budget is refused whole, never half-applied.
    """
    params = {"endpoint_id": endpoint_id, "workspace_id": workspace_id, "since": since, "until": until}
    with conn:
        rows = run_query(conn, "api_endpoint_for_recover", {"id": endpoint_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"endpoint {endpoint_id} does not exist")
        if not rows[0][0]:
            raise Conflict(f"endpoint {endpoint_id} is inactive; activate it before recovering")
        # The lock also serialises concurrent recovers of one endpoint, so the
        # "already pending" test below cannot let both queue the same event.
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        # Insert first, then pay: a refused charge raises inside this
        # transaction, which rolls the inserted rows back with it.
        queued = len(run_query(conn, "api_recover_insert", params))
        if queued == 0:
            return RecoverResult(queued=0, units=0)
        units = math.ceil(queued / ROWS_PER_REPLAY_UNIT)
        _charge(conn, workspace_id, units, limit)
    return RecoverResult(queued=queued, units=units)
