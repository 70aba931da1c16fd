"""Rollout controls and the rollout gates' evidence (queries in ``sql/rollout.sql``).

Each function owns its transaction (``store.transaction``: a refused
statement raises the store error it means); rows come back as dicts keyed by
column name, the gates' evidence as the dataclasses ``dispatcher.rules.gates``
judges.  Writes naming workspaces check them all first and change nothing if
one is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from dispatcher.rules.gates import (
    AlertCounts,
    BacklogSamples,
    LostEvent,
    RetryFigures,
    RolloutState,
    ShadowRows,
    Window,
    WorkspaceRun,
)
from dispatcher.store import Connection, NotFound, query_rows, transaction

Row = dict[str, Any]


def _require_known(conn: Connection, workspace_ids: Sequence[str]) -> None:
    unknown = [row["id"] for row in query_rows(conn, "rollout_unknown_workspaces", {"ids": list(workspace_ids)})]
    if unknown:
        raise NotFound(f"unknown workspace(s): {', '.join(unknown)} (nothing was changed)")


def status(conn: Connection) -> Row:
    """The percentage, the explicit lists, the workspace counts and what is still draining."""
    with transaction(conn):
        settings = query_rows(conn, "rollout_percent")[0]
        return {
            "percent": settings["percent"], "updated_at": settings["updated_at"],
            "listed": query_rows(conn, "rollout_listed"),
            "counts": query_rows(conn, "rollout_counts")[0],
            "pending": {row["mode"]: row["pending"] for row in query_rows(conn, "rollout_pending")},
        }


def set_percent(conn: Connection, percent: int) -> None:
    with transaction(conn):
        query_rows(conn, "rollout_set_percent", {"percent": percent})


def set_list(conn: Connection, workspace_ids: Sequence[str], listed: str | None) -> None:
    """Put workspaces on the include or exclude list, or (None) take them off both."""
    with transaction(conn):
        _require_known(conn, workspace_ids)
        if listed is None:
            query_rows(conn, "rollout_unlist", {"ids": list(workspace_ids)})
        else:
            query_rows(conn, "rollout_list", {"ids": list(workspace_ids), "list": listed})


def clear_outbox_flag(conn: Connection, workspace_id: str) -> None:
    """Remove the explicit flag: the lists and the percentage decide again."""
    with transaction(conn):
        if not query_rows(conn, "rollout_clear_flag", {"id": workspace_id}):
            raise NotFound(f"workspace {workspace_id!r} does not exist")


# ---------------------------------------------------------------- the gates' evidence (dispatcher/rules/gates.py)


def backlog_samples(conn: Connection, window: Window, max_gap: timedelta) -> BacklogSamples:
    """The upkeep leader's backlog age samples taken in ``window``."""
    with transaction(conn):
        rows = query_rows(conn, "gate_backlog_samples", {"since": window.since, "until": window.until})
    return BacklogSamples(tuple(r["taken_at"] for r in rows), tuple(float(r["age"]) for r in rows), max_gap)


def alert_counts(conn: Connection, window: Window) -> AlertCounts:
    """Backlog alerts fired in ``window`` and in the stretch of the same length before it."""
    with transaction(conn):
        (row,) = query_rows(conn, "gate_alert_counts", {"since": window.since, "until": window.until,
                                                        "before": window.before().since})
    return AlertCounts(int(row["in_window"]), int(row["before"]))


def shadow_rows(conn: Connection, window: Window) -> ShadowRows:
    with transaction(conn):
        rows = query_rows(conn, "gate_shadow_hours", {"since": window.since, "until": window.until})
    waits = [float(r["longest_wait"]) for r in rows if r["longest_wait"] is not None]
    return ShadowRows(rows=sum(int(r["rows"]) for r in rows), unmarked=sum(int(r["unmarked"]) for r in rows),
                      longest_wait=max(waits, default=None), hours=frozenset(int(r["hour"]) for r in rows))


def rollout_state(conn: Connection) -> RolloutState:
    with transaction(conn):
        (row,) = query_rows(conn, "gate_rollout_state")
    return RolloutState(int(row["percent"]), row["updated_at"], int(row["workspaces_off"]))


def include_list(conn: Connection) -> list[str]:
    """The workspaces on the include list: phase 2's beta workspaces unless the operator names them."""
    with transaction(conn):
        return [row["workspace_id"] for row in query_rows(conn, "gate_include_list")]


def workspace_runs(conn: Connection, window: Window, workspace_ids: Sequence[str]) -> list[WorkspaceRun]:
    """Phase 1: each workspace's events of the window, by the path they took; NotFound names unknown ones."""
    with transaction(conn):
        rows = query_rows(conn, "gate_phase1_workspaces", {"workspaces": sorted(set(workspace_ids)),
                                                           "since": window.since, "until": window.until})
    unknown = [row["workspace_id"] for row in rows if not row["known"]]
    if unknown:
        raise NotFound(f"unknown workspace(s): {', '.join(unknown)}")
    return [WorkspaceRun(row["workspace_id"], bool(row["on_outbox"]), int(row["outbox_events"]),
                         int(row["synchronous_events"]), row["last_synchronous"]) for row in rows]


def lost_events(conn: Connection, window: Window, workspace_ids: Sequence[str],
                received: Sequence[str]) -> list[LostEvent]:
    """Phase 1: events queued on the outbox in ``window`` whose id is not in ``received``."""
    with transaction(conn):
        rows = query_rows(conn, "gate_phase1_missing", {"workspaces": list(workspace_ids), "received": list(received),
                                                        "since": window.since, "until": window.until})
    return [LostEvent(row["id"], row["workspace_id"], row["type"], row["created_at"], tuple(row["statuses"] or ()))
            for row in rows]


def retry_figures(conn: Connection, window: Window, workspace_ids: Sequence[str],
                  single_attempt_types: Sequence[str]) -> RetryFigures:
    """Phase 2's figures for the given workspaces; NotFound names unknown ones."""
    params = {"workspaces": list(workspace_ids), "since": window.since, "until": window.until,
              "single_attempt_types": list(single_attempt_types)}
    with transaction(conn):
        _require_known(conn, workspace_ids)
        (row,) = query_rows(conn, "gate_phase2", params)
        (dup,) = query_rows(conn, "gate_phase2_duplicates", params)
    return RetryFigures(tuple(workspace_ids), int(row["deliveries"]), int(row["never_retried"]),
                        int(dup["duplicates"]), int(dup["events"]), tuple(single_attempt_types))
