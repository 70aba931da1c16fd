"""Bearer tokens: checking them on every API request.

Their format, scopes and creation live in ``dispatcher.tokens`` (the CLI
makes them there; the names are importable from here too).  Lookups go by
hash, so comparing tokens takes no timing-sensitive code.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher import store
from dispatcher.store import tokens as token_store
from dispatcher.tokens import (
    PREFIX_CHARS,
    READ,
    SCOPES,
    TOKEN_PREFIX,
    WRITE,
    InvalidTokenRequest,
    create_token,
    hash_token,
)

__all__ = [
    "PREFIX_CHARS", "READ", "SCOPES", "TOKEN_PREFIX", "WRITE", "Forbidden", "InvalidTokenRequest", "Principal",
    "Unauthenticated", "UnknownTokens", "authenticate", "bearer_token", "create_token", "hash_token",
]

# Anything longer than a real token is refused before it is hashed.
_MAX_TOKEN_CHARS = 200
# Every token we issue has this shape (token_urlsafe's alphabet); anything else
# is refused without a database lookup.
_TOKEN_SHAPE = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]+")
# A hash found unknown is answered from memory for this long.  Short, because a
# token created meanwhile must start working soon; a new token's hash is
# unguessable, so it is never in here unless someone held the token already.
UNKNOWN_TOKEN_TTL = 10.0
UNKNOWN_TOKEN_ENTRIES = 10000
# A token's last_used_at is written at most this often (seconds): one write
# per token per minute, not one per request (the lookup reads it anyway).
LAST_USED_EVERY = 60.0


class Unauthenticated(Exception):
    """No usable bearer token (HTTP 401)."""


class Forbidden(Exception):
    """A valid token without the needed scope (HTTP 403)."""


@dataclass(frozen=True, slots=True)
class Principal:
    workspace_id: str
    scopes: frozenset[str]
    token_id: int


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer`` header, checked for shape only."""
    if not authorization:
        raise Unauthenticated("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    if len(token) > _MAX_TOKEN_CHARS or not _TOKEN_SHAPE.fullmatch(token):
        raise Unauthenticated("the bearer token is not valid")
    return token


class UnknownTokens:
    """A bounded, short-lived memory of token hashes the database did not know.

    A client retrying one bogus token then costs no database round trip.  (A
    client sending a new random token each time still costs one indexed lookup
    per request, bounded by the pool; rate limiting is the proxy's job.)
    """

    def __init__(self, ttl: float = UNKNOWN_TOKEN_TTL, max_entries: int = UNKNOWN_TOKEN_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._clock = clock
        self._until: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()  # held without I/O

    def known_unknown(self, token_sha256: str) -> bool:
        with self._lock:
            until = self._until.get(token_sha256)
            if until is None:
                return False
            if until <= self._clock():
                del self._until[token_sha256]
                return False
            return True

    def remember(self, token_sha256: str) -> None:
        with self._lock:
            self._until.pop(token_sha256, None)
            while len(self._until) >= self._max:
                self._until.popitem(last=False)  # the oldest entry goes first
            self._until[token_sha256] = self._clock() + self._ttl


def authenticate(conn: store.Connection, token: str, scope: str, unknown: UnknownTokens) -> Principal:
    """The principal of ``token`` holding ``scope``; the caller checked ``unknown`` before taking ``conn``."""
    token_sha256 = hash_token(token)
    found = token_store.lookup_token(conn, token_sha256, LAST_USED_EVERY)
    if found is None:
        unknown.remember(token_sha256)
        raise Unauthenticated("the bearer token is not valid")
    principal = Principal(workspace_id=found.workspace_id, scopes=found.scopes, token_id=found.id)
    if scope not in principal.scopes:
        raise Forbidden(f"this token lacks the {scope} scope")
    return principal
