"""Delivery history, replay and recover (queries ``api_*`` in ``sql/api.sql``).

Each public function owns its transaction (``store.transaction``) so a
request is one or two short transactions and never holds locks while the
client reads the response.  Every lookup is scoped by ``workspace_id``: a
row of another workspace is indistinguishable from a missing one.  Replay
and recover spend the replay budget (``rules.replay_budget``) in the same
transaction as the rows they queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dispatcher.redact import cut_bytes
from dispatcher.rules.replay_budget import ReplayBudget, Spent
from dispatcher.store.audit import Audit, audit
from dispatcher.store.errors import Conflict, NotFound, ReplayLimited
from dispatcher.store.queries import Connection, Row, query_rows, run_query, transaction

DELIVERY_COLUMNS = (
    "id", "event_id", "event_type", "endpoint_id", "status", "attempt", "mode", "payload_hash",
    "replay_of", "created_at", "next_attempt_at", "delivered_at", "finished_at",
    "last_status_code", "last_error", "trace_id", "producer_trace_id",
)


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


def _excerpt(text: str | None) -> str | None:
    if text is None:
        return None
    return cut_bytes(text)


def _attempts(conn: Connection, ids: Sequence[int], last: int | None = None) -> tuple[dict[int, list[Row]],
                                                                                     dict[int, int]]:
    """Each delivery's attempts in order (only its ``last`` ones, if given), and how many it has in all."""
    by_delivery: dict[int, list[Row]] = {i: [] for i in ids}
    totals: dict[int, int] = dict.fromkeys(ids, 0)
    if not ids:
        return by_delivery, totals
    for row in query_rows(conn, "api_delivery_attempts", {"ids": list(ids), "first": min(ids), "last": last}):
        row["response_excerpt"] = _excerpt(row["response_excerpt"])
        delivery_id = row.pop("delivery_id")
        totals[delivery_id] = int(row.pop("of_delivery"))
        by_delivery[delivery_id].append(row)
    return by_delivery, totals


def list_deliveries(conn: Connection, workspace_id: str, filters: DeliveryFilter, before_id: int | None,
                    limit: int, attempts_each: int | None = None) -> list[Row]:
    """Up to ``limit`` deliveries below ``before_id``, newest first.

    ``attempts_each``: also each delivery's last so many attempts (``attempts``) and the count of its
    earlier ones left out (``attempts_omitted``): the page's size stays bounded however often a
    delivery was tried (issue 23 item 2).
    """
    params = {"workspace_id": workspace_id, "before_id": before_id, "limit": limit,
              "event_id": filters.event_id, "endpoint_id": filters.endpoint_id, "status": filters.status,
              "since": filters.since, "until": filters.until}
    with transaction(conn):
        rows = query_rows(conn, "api_list_deliveries", params)
        if attempts_each is not None:
            attempts, totals = _attempts(conn, [r["id"] for r in rows], attempts_each)
            for row in rows:
                row["attempts"] = attempts[row["id"]]
                row["attempts_omitted"] = totals[row["id"]] - len(row["attempts"])
    return rows


def get_delivery(conn: Connection, workspace_id: str, delivery_id: int) -> Row:
    """One delivery with every attempt; NotFound also for other workspaces' ids."""
    with transaction(conn):
        rows = query_rows(conn, "api_get_delivery", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        row = rows[0]
        row["attempts"] = _attempts(conn, [delivery_id])[0][delivery_id]
    return row


def event_exists(conn: Connection, workspace_id: str, event_id: str) -> bool:
    with transaction(conn):
        return bool(run_query(conn, "api_event_exists", {"event_id": event_id, "workspace_id": workspace_id}))


def charge_replay(conn: Connection, workspace_id: str, units: int, budget: ReplayBudget) -> None:
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
           token_id: int | None, traceparent: str | None = None) -> Row:
    """Queue a new pending delivery of the same event to the same endpoint.

    ``traceparent``: the replay request's span, the new row's trace (migration 0022)."""
    with transaction(conn):
        rows = query_rows(conn, "api_replay_source", {"id": delivery_id, "workspace_id": workspace_id})
        if not rows:
            raise NotFound(f"delivery {delivery_id} does not exist")
        source = rows[0]
        _check_replayable(delivery_id, source)
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        charge_replay(conn, workspace_id, 1, budget)
        row = query_rows(conn, "api_insert_replay", {
            "workspace_id": workspace_id, "endpoint_id": source["endpoint_id"], "event_id": source["event_id"],
            "payload_hash": source["payload_hash"], "replay_of": delivery_id, "traceparent": traceparent})[0]
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
        charge_replay(conn, workspace_id, units, budget)
        queued = [int(r[0]) for r in run_query(conn, "api_recover_insert", {"ids": ids, "workspace_id": workspace_id})]
        audit(conn, Audit(workspace_id, token_id, "endpoint.recover", endpoint_id, queued, {
            "since": since.isoformat(), "until": None if until is None else until.isoformat(),
            "queued": len(queued), "replay_units": units}))
    return RecoverResult(queued=len(queued), units=units)
