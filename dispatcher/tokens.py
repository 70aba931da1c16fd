"""API tokens: their format, their scopes, and how one is made.

A token is ``dsp_`` + 43 url-safe characters (256 random bits).  Only its
SHA-256 is stored; the token itself is printed once by ``token create`` and
never again.  The CLI makes tokens here; ``api.auth`` checks them on every
request.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from dispatcher.store import Connection
from dispatcher.store import tokens as token_store

READ = "webhooks:read"
WRITE = "webhooks:write"
SCOPES = (READ, WRITE)
TOKEN_PREFIX = "dsp_"
# `token list` and GET /v2/webhooks/tokens show this many leading characters:
# dsp_ plus 8 random ones, enough to tell tokens apart, far from enough to guess one.
PREFIX_CHARS = 12


class InvalidTokenRequest(ValueError):
    """A token was asked for with unknown scopes or a lifetime that is not positive."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(conn: Connection, workspace: str, scopes: Sequence[str],
                 expires_in: float | None = None) -> str:
    """Store a new token's hash for ``workspace`` and return the token (shown once).
    ``expires_in``: seconds until it stops working (None: never)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidTokenRequest(f"unknown scope(s) {', '.join(unknown) or '(none given)'}; use {', '.join(SCOPES)}")
    if expires_in is not None and not expires_in > 0:
        raise InvalidTokenRequest("a token's lifetime must be positive")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_store.insert_token(conn, hash_token(token), workspace, sorted(set(scopes)), token[:PREFIX_CHARS], expires_in)
    return token
