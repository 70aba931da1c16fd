"""What every responder shares: the app's context, authentication, the read
route, the page shape and the endpoint URL check.

A responder authenticates first (so a malformed id from an anonymous client
gets 401, not 404), parses its input with ``params`` (4xx on anything odd),
and calls the store for the work.  Store exceptions become problems in the
handlers of ``api.problems``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import falcon

from dispatcher.api import auth, params
from dispatcher.api.in_flight import WorkspaceInFlight
from dispatcher.api.pool import ConnectionPool, HealthCheck, ReadRoute
from dispatcher.api.problems import Problem, unprocessable
from dispatcher.config import ApiConfig
from dispatcher.outbound.netguard import OutboundPolicy, registration_refusal
from dispatcher.rules.breaker import BreakerPolicy
from dispatcher.rules.bulk_replay import BulkReplayPolicy
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.store import Connection

T = TypeVar("T")


@dataclass(frozen=True)
class ApiContext:
    config: ApiConfig
    pool: ConnectionPool
    reads: ReadRoute | None
    replay_budget: ReplayBudget
    replay_policy: BulkReplayPolicy
    breaker: BreakerPolicy
    outbound: OutboundPolicy
    secret_grace: float
    openapi: bytes
    console: bytes
    console_csp: str
    unknown_tokens: auth.UnknownTokens
    health: HealthCheck
    in_flight: WorkspaceInFlight


class Resource:
    """A responder of one route template; every responder works from the app's one context."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx


@contextmanager
def session(ctx: ApiContext, req: falcon.Request, scope: str) -> Iterator[tuple[Connection, auth.Principal]]:
    """A pooled connection plus the authenticated principal holding ``scope``."""
    token = _plausible_token(ctx, req)
    with ctx.pool.connection() as conn:
        who = _authenticate(ctx, conn, token, scope)
        # A refusal is raised inside the ``with``: the connection goes straight back to the pool.
        ctx.in_flight.admit(req, who.workspace_id)
        yield conn, who


@contextmanager
def path_action(ctx: ApiContext, req: falcon.Request, raw_id: str,
                kind: str) -> Iterator[tuple[Connection, auth.Principal, int]]:
    """A write route whose only input is the id in its path (replay, delete, breaker close, rotate):
    any body is read and dropped (bounded), then the token, the id and the absence of a query are checked."""
    params.discard_body(req, ctx.config.max_body_bytes)
    with session(ctx, req, auth.WRITE) as (conn, who):
        ident = params.path_id(raw_id, kind)
        params.only(req)
        yield conn, who, ident


def principal(ctx: ApiContext, req: falcon.Request, scope: str) -> auth.Principal:
    """The authenticated principal, on a connection held only for the token lookup.

    Not yet counted in flight: a route that reads a body next takes its connection with
    :func:`connection`, so a slow upload holds no slot of its workspace's cap."""
    token = _plausible_token(ctx, req)
    with ctx.pool.connection() as conn:
        return _authenticate(ctx, conn, token, scope)


@contextmanager
def connection(ctx: ApiContext, req: falcon.Request, who: auth.Principal) -> Iterator[Connection]:
    """A pooled connection for ``who``'s work, once the request is admitted under its workspace's cap of
    requests in flight (429 at once if not, before any connection is taken)."""
    ctx.in_flight.admit(req, who.workspace_id)  # given back by the app's ReleaseInFlight middleware
    with ctx.pool.connection() as conn:
        yield conn


def read(ctx: ApiContext, req: falcon.Request, scope: str, query: Callable[[Connection, auth.Principal], T]) -> T:
    """Authenticate, then run the read-only ``query(conn, principal)``.

    With a standby (``api.read_dsn``) the token is checked on the primary --
    a token revoked there stops working at once, whatever the standby's lag
    -- and ``query`` runs on the standby (on the primary while it is down;
    it may then run twice, which a read allows).  Without one, both share
    one primary connection, as every route does.
    """
    if ctx.reads is None:
        with session(ctx, req, scope) as (conn, who):
            return query(conn, who)
    who = principal(ctx, req, scope)
    ctx.in_flight.admit(req, who.workspace_id)
    return ctx.reads.run(lambda conn: query(conn, who))


def _plausible_token(ctx: ApiContext, req: falcon.Request) -> str:
    """The request's token, unless its shape or a recent lookup already says it is bogus (no database)."""
    try:
        token = auth.bearer_token(req.get_header("Authorization"))
    except auth.Unauthenticated as exc:
        raise _unauthorized(str(exc)) from None
    if ctx.unknown_tokens.known_unknown(auth.hash_token(token)):
        raise _unauthorized("the bearer token is not valid")
    return token


def _authenticate(ctx: ApiContext, conn: Connection, token: str, scope: str) -> auth.Principal:
    try:
        return auth.authenticate(conn, token, scope, ctx.unknown_tokens)
    except auth.Unauthenticated as exc:
        raise _unauthorized(str(exc)) from None
    except auth.Forbidden as exc:
        raise Problem(403, "forbidden", "Forbidden", str(exc)) from None


def _unauthorized(detail: str) -> Problem:
    return Problem(401, "unauthorized", "Unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})


def page(rows: list[dict[str, Any]], limit: int, shape: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    # One extra row was fetched only to learn whether another page exists.
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": [shape(r) for r in rows],
            "next_cursor": params.encode_cursor(rows[-1]["id"]) if more else None}


def check_url(ctx: ApiContext, url: str | None) -> None:
    if url is None:
        return
    refusal = registration_refusal(url, ctx.outbound)
    if refusal is not None:
        raise unprocessable(f"endpoint URL refused: {refusal}")
