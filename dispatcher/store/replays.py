"""Bulk replay by filter (queries ``replay_*`` in ``sql/replays.sql``, migration 0021).

The API and the CLI call :func:`preview` (a dry run: count, sample, cost)
and :func:`create_job` (count, pay, record the job and audit it, in one
transaction); the upkeep leader's replay loop runs the job through
:class:`ReplayJobStore`, one batch per transaction.  Which rows a filter
re-queues is defined once, by the SQL function
``dispatcher_replay_candidates``; the budget is the single replay's
(``rules.replay_budget``, spent by ``store.deliveries.charge_replay``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatcher.rules.bulk_replay import ReplayFilter
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.store.audit import Audit, audit
from dispatcher.store.deliveries import charge_replay
from dispatcher.store.engine import ManagedConnection
from dispatcher.store.errors import Conflict, NotFound, Unprocessable
from dispatcher.store.queries import QUERIES, Connection, Row, query_rows, run_query, transaction


@dataclass(frozen=True, slots=True)
class Preview:
    """A dry run: how many rows the filter would queue now, what that costs, and the first few.
    ``capped``: the count stopped at the budget's cap (``ReplayBudget.count_cap``); there are more."""

    total: int
    units: int
    sample: list[Row]
    capped: bool


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a job: rows queued now, and the job's state after it."""

    queued: int
    done: bool


def _params(workspace_id: str, rf: ReplayFilter) -> dict[str, Any]:
    return {"workspace_id": workspace_id, "since": rf.since, "until": rf.until, "types": list(rf.types),
            "endpoints": list(rf.endpoints), "statuses": list(rf.statuses)}


def _check_endpoints(conn: Connection, workspace_id: str, rf: ReplayFilter) -> None:
    if not rf.endpoints:
        return
    unknown = [int(r[0]) for r in run_query(conn, "replay_unknown_endpoints",
                                            {"workspace_id": workspace_id, "endpoints": list(rf.endpoints)})]
    if unknown:
        raise Unprocessable(f"endpoint {unknown[0]} does not exist in workspace {workspace_id}")


def preview(conn: Connection, workspace_id: str, rf: ReplayFilter, budget: ReplayBudget, sample: int) -> Preview:
    """Count and sample what ``rf`` matches now; nothing is queued or spent."""
    with transaction(conn):
        _check_endpoints(conn, workspace_id, rf)
        params = _params(workspace_id, rf)
        params["max_id"] = run_query(conn, "replay_max_id", params)[0][0]
        params["cap"] = budget.count_cap()
        total = int(run_query(conn, "replay_count", params)[0][0])
        rows = query_rows(conn, "replay_sample", {**params, "limit": sample}) if total else []
    return Preview(total=total, units=budget.units_for_rows(total), sample=rows, capped=total >= params["cap"])


def create_job(conn: Connection, workspace_id: str, rf: ReplayFilter, request_key: str, budget: ReplayBudget,
               token_id: int | None) -> tuple[Row, bool]:
    """The job of ``request_key``: made now (counted, paid, audited; True), or the one a
    retried request made before (False; nothing counted or paid again).

    The workspace's replay lock serialises this with every other replay of
    the workspace, so two copies of one request cannot both make a job, and a
    budget refusal (``ReplayLimited``) leaves nothing behind.
    """
    fingerprint = rf.fingerprint()
    with transaction(conn):
        run_query(conn, "api_replay_lock", {"workspace_id": workspace_id})
        found = query_rows(conn, "replay_job_find", {"workspace_id": workspace_id, "request_key": request_key})
        if found:
            if found[0]["fingerprint"] != fingerprint:
                raise Conflict("this idempotency key was used for a bulk replay with another filter; "
                               "use a new key for a new request")
            return found[0], False
        _check_endpoints(conn, workspace_id, rf)
        params = _params(workspace_id, rf)
        params["max_id"] = run_query(conn, "replay_max_id", params)[0][0]
        params["cap"] = budget.count_cap()
        total = int(run_query(conn, "replay_count", params)[0][0])
        units = budget.units_for_rows(total)
        if units:
            charge_replay(conn, workspace_id, units, budget)
        job = query_rows(conn, "replay_job_insert", {
            **params, "request_key": request_key, "fingerprint": fingerprint, "token_id": token_id,
            "total": total, "units": units})[0]
        audit(conn, Audit(workspace_id, token_id, "replay.bulk", rf.endpoints[0] if len(rf.endpoints) == 1 else None,
                          (), {"job_id": job["id"], "filter": rf.as_json(), "total": total, "replay_units": units}))
    return job, True


def get_job(conn: Connection, workspace_id: str, job_id: int) -> Row:
    with transaction(conn):
        rows = query_rows(conn, "replay_job_get", {"id": job_id, "workspace_id": workspace_id})
    if not rows:
        raise NotFound(f"replay job {job_id} does not exist")
    return rows[0]


class ReplayJobStore:
    """The replay loop's side: find the next running job, run one of its batches."""

    def __init__(self, conn: ManagedConnection) -> None:
        self._conn = conn

    def next_job(self) -> int | None:
        with self._conn.statement() as cur:
            cur.execute(QUERIES["replay_job_next"])
            rows = cur.fetchall()
        return int(rows[0][0]) if rows else None

    def run_batch(self, job_id: int, limit: int) -> Batch | None:
        """Queue up to ``limit`` of the job's next rows and move its cursor past them, in one
        transaction; None if the job is no longer running (another process finished it)."""
        with self._conn.transaction() as tx:
            tx.execute(QUERIES["replay_job_lock"], {"id": job_id})
            jobs = tx.fetchall()
            if not jobs:
                return None
            # The workspace's replay lock, as every replay takes it: a single replay
            # or recover of the same workspace cannot queue a pair this batch queues.
            tx.execute(QUERIES["api_replay_lock"], {"workspace_id": jobs[0]["workspace_id"]})
            tx.execute(QUERIES["replay_job_batch"], {"id": job_id, "limit": limit})
            queued = tx.fetchall()
            done = len(queued) < limit
            after = max((int(r["replay_of"]) for r in queued), default=int(jobs[0]["after_id"]))
            tx.execute(QUERIES["replay_job_advance"], {"id": job_id, "after_id": after, "queued": len(queued),
                                                        "done": done}, commit=True)
        return Batch(queued=len(queued), done=done)

