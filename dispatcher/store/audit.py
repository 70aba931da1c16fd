"""The audit log (``api_audit``): who changed what, written inside the change's own transaction.

Every write of the API and of the CLI's operator verbs records one entry;
``token_id`` None marks an operator's CLI command.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.store.queries import Connection, Row, query_rows, run_query, transaction


@dataclass(frozen=True, slots=True)
class Audit:
    """One audit log entry: who (an API token's id; None: an operator's CLI command) did what."""

    workspace_id: str
    token_id: int | None
    action: str
    endpoint_id: int | None = None
    delivery_ids: Sequence[int] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)


def audit(conn: Connection, entry: Audit) -> None:
    """Write ``entry``; call inside the transaction of the change it records."""
    run_query(conn, "api_audit_insert", {
        "workspace_id": entry.workspace_id, "token_id": entry.token_id, "action": entry.action,
        "endpoint_id": entry.endpoint_id, "delivery_ids": list(entry.delivery_ids),
        "detail": json.dumps(dict(entry.detail))})


def list_audit(conn: Connection, workspace_id: str, endpoint_id: int | None, before_id: int | None,
               limit: int) -> list[Row]:
    """Up to ``limit`` of the workspace's entries below ``before_id``, newest first (``endpoint_id``: its only)."""
    with transaction(conn):
        return query_rows(conn, "api_list_audit", {"workspace_id": workspace_id, "endpoint_id": endpoint_id,
                                                   "before_id": before_id, "limit": limit})
