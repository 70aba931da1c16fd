"""Rollout controls and gate figures (queries in ``sql/rollout.sql``).

Each function owns its transaction (``store.transaction``: a refused
statement raises the store error it means); rows come back as dicts keyed by
column name.  Writes naming workspaces check them all first and change
nothing if one is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


def gate_figures(conn: Connection, name: str, params: Mapping[str, Any]) -> list[Row]:
    """One gate query (``gate_*`` in sql/rollout.sql), read-only."""
    if not name.startswith("gate_"):
        raise ValueError(f"{name!r} is not a gate query")
    with transaction(conn):
        return query_rows(conn, name, params)
