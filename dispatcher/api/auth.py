"""Bearer tokens: creation (CLI) and checking (every API request).

A token is ``dsp_`` + 43 url-safe characters (256 random bits).  Only its
SHA-256 is stored; the token itself is printed once by ``token create`` and
never again.  Lookups go by hash, so comparing tokens takes no
timing-sensitive code.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher import store
from dispatcher.exitcodes import UsageError
from dispatcher.store import api_data

READ = "webhooks:read"
WRITE = "webhooks:write"
SCOPES = (READ, WRITE)
TOKEN_PREFIX = "dsp_"
# Anything longer than a real token is refused before it is hashed.
_MAX_TOKEN_CHARS = 200


class Unauthenticated(Exception):
    """No usable bearer token (HTTP 401)."""


class Forbidden(Exception):
    """A valid token without the needed scope (HTTP 403)."""


@dataclass(frozen=True, slots=True)
class Principal:
    workspace_id: str
    scopes: frozenset[str]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(conn: store.Connection, workspace: str, scopes: Sequence[str]) -> str:
    """Store a new token's hash for ``workspace`` and return the token (shown once)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise UsageError(f"unknown scope(s) {', '.join(unknown) or '(none given)'}; use {', '.join(SCOPES)}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    api_data.insert_token(conn, hash_token(token), workspace, sorted(set(scopes)))
    return token


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer`` header, checked for shape only."""
    if not authorization:
        raise Unauthenticated("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    if len(token) > _MAX_TOKEN_CHARS or not token.isascii():
        raise Unauthenticated("the bearer token is not valid")
    return token


def authenticate(conn: store.Connection, token: str, scope: str) -> Principal:
    found = api_data.lookup_token(conn, hash_token(token))
    if found is None:
        raise Unauthenticated("the bearer token is not valid")
    principal = Principal(workspace_id=found[0], scopes=found[1])
    if scope not in principal.scopes:
        raise Forbidden(f"this token lacks the {scope} scope")
    return principal
