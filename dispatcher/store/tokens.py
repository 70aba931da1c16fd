"""API tokens (``api_tokens``): only a token's SHA-256 is stored; lookups go by hash.

Each function owns its transaction (``store.transaction``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.store.errors import Conflict, NotFound
from dispatcher.store.queries import Connection, Row, query_rows, run_query, transaction


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
