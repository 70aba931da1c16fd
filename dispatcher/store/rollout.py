"""Rollout controls and gate figures (queries in ``sql/rollout.sql``).

Each function owns its transaction; rows come back as dicts keyed by column
name.  Writes naming workspaces check them all first and change nothing if
one is unknown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.store import QUERIES, Connection, NotFound

Row = dict[str, Any]


def _rows(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)
        if cur.description is None:
            return []
        names = [column.name for column in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _require_known(conn: Connection, workspace_ids: Sequence[str]) -> None:
    unknown = [row["id"] for row in _rows(conn, "rollout_unknown_workspaces", {"ids": list(workspace_ids)})]
    if unknown:
        raise NotFound(f"unknown workspace(s): {', '.join(unknown)} (nothing was changed)")


def status(conn: Connection) -> Row:
    """The percentage, the explicit lists, the workspace counts and what is still draining."""
    with conn:
        settings = _rows(conn, "rollout_percent")[0]
        return {
            "percent": settings["percent"], "updated_at": settings["updated_at"],
            "listed": _rows(conn, "rollout_listed"),
            "counts": _rows(conn, "rollout_counts")[0],
            "pending": {row["mode"]: row["pending"] for row in _rows(conn, "rollout_pending")},
        }


def set_percent(conn: Connection, percent: int) -> None:
    with conn:
        _rows(conn, "rollout_set_percent", {"percent": percent})


def set_list(conn: Connection, workspace_ids: Sequence[str], listed: str | None) -> None:
    """Put workspaces on the include or exclude list, or (None) take them off both."""
    with conn:
        _require_known(conn, workspace_ids)
        if listed is None:
            _rows(conn, "rollout_unlist", {"ids": list(workspace_ids)})
        else:
            _rows(conn, "rollout_list", {"ids": list(workspace_ids), "list": listed})


def clear_outbox_flag(conn: Connection, workspace_id: str) -> None:
    """Remove the explicit flag: the lists and the percentage decide again."""
    with conn:
        if not _rows(conn, "rollout_clear_flag", {"id": workspace_id}):
            raise NotFound(f"workspace {workspace_id!r} does not exist")


def gate_figures(conn: Connection, name: str, params: Mapping[str, Any]) -> list[Row]:
    """One gate query (``gate_*`` in sql/rollout.sql), read-only."""
    if not name.startswith("gate_"):
        raise ValueError(f"{name!r} is not a gate query")
    with conn:
        return _rows(conn, name, params)
