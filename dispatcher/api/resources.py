"""The API's resources: one class per route template.

A responder authenticates first (so a malformed id from an anonymous client
gets 401, not 404), parses its input with ``params`` (4xx on anything odd),
and calls the store (``store.deliveries``, ``store.endpoints``, ...) for the work.  Store exceptions are turned into
problems by the handlers in ``problems``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import falcon

from dispatcher import store
from dispatcher.api import auth, params
from dispatcher.api.pool import ConnectionPool, ReadRoute
from dispatcher.api.problems import Problem, bad_request, not_found, unprocessable
from dispatcher.config import ApiConfig
from dispatcher.outbound.netguard import OutboundPolicy, registration_refusal
from dispatcher.redact import mask_url
from dispatcher.rules.breaker import BreakerPolicy, EndpointBreaker
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.signing import new_secret
from dispatcher.store import Connection
from dispatcher.store import audit as audit_store
from dispatcher.store import deliveries as delivery_store
from dispatcher.store import endpoints as endpoint_store
from dispatcher.store import tokens as token_store

# /healthz answers from a ping at most this old: a flood of probes costs one
# database round trip per second, not one each.
HEALTH_TTL = 1.0

T = TypeVar("T")


@dataclass(frozen=True)
class ApiContext:
    config: ApiConfig
    pool: ConnectionPool
    reads: ReadRoute | None
    replay_budget: ReplayBudget
    breaker: BreakerPolicy
    outbound: OutboundPolicy
    secret_grace: float
    openapi: bytes
    console: bytes
    console_csp: str
    unknown_tokens: auth.UnknownTokens
    health: HealthCheck


@contextmanager
def session(ctx: ApiContext, req: falcon.Request, scope: str) -> Iterator[tuple[Connection, auth.Principal]]:
    """A pooled connection plus the authenticated principal holding ``scope``."""
    token = _plausible_token(ctx, req)
    with ctx.pool.connection() as conn:
        yield conn, _authenticate(ctx, conn, token, scope)


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
    """The authenticated principal, on a connection held only for the token lookup."""
    token = _plausible_token(ctx, req)
    with ctx.pool.connection() as conn:
        return _authenticate(ctx, conn, token, scope)


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


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def delivery_json(row: dict[str, Any]) -> dict[str, Any]:
    """The public shape of a delivery; claim internals (locks, tokens) are never read."""
    out = {key: row[key] for key in delivery_store.DELIVERY_COLUMNS}
    for key in ("created_at", "next_attempt_at", "delivered_at", "finished_at"):
        out[key] = _ts(out[key])
    if "attempts" in row:
        out["attempts"] = [
            {**a, "started_at": _ts(a["started_at"])} for a in row["attempts"]
        ]
    return out


def _page(rows: list[dict[str, Any]], limit: int,
          shape: Callable[[dict[str, Any]], dict[str, Any]] = delivery_json) -> dict[str, Any]:
    # One extra row was fetched only to learn whether another page exists.
    more = len(rows) > limit
    rows = rows[:limit]
    return {"data": [shape(r) for r in rows],
            "next_cursor": params.encode_cursor(rows[-1]["id"]) if more else None}


class Deliveries:
    """GET /v2/webhooks/deliveries: the workspace's deliveries, newest first."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> list[dict[str, Any]]:
            params.only(req, "event_id", "endpoint_id", "status", "since", "until", "limit", "cursor")
            filters = delivery_store.DeliveryFilter(
                event_id=params.query_event_id(req), endpoint_id=params.query_int(req, "endpoint_id"),
                status=params.status(req), since=params.query_timestamp(req, "since"),
                until=params.query_timestamp(req, "until"))
            return delivery_store.list_deliveries(conn, who.workspace_id, filters, params.cursor(req),
                                            params.limit(req) + 1)

        resp.media = _page(read(self.ctx, req, auth.READ, query), params.limit(req))


class Delivery:
    """GET /v2/webhooks/deliveries/{delivery_id}: one delivery with every attempt."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, delivery_id: str) -> None:
        def query(conn: Connection, who: auth.Principal) -> dict[str, Any]:
            ident = params.path_id(delivery_id, "delivery")
            params.only(req)
            return delivery_store.get_delivery(conn, who.workspace_id, ident)

        resp.media = delivery_json(read(self.ctx, req, auth.READ, query))


class Replay:
    """POST /v2/webhooks/deliveries/{delivery_id}/replay."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response, delivery_id: str) -> None:
        with path_action(self.ctx, req, delivery_id, "delivery") as (conn, who, ident):
            row = delivery_store.replay(conn, who.workspace_id, ident, self.ctx.replay_budget, who.token_id)
        resp.status = falcon.HTTP_202
        resp.location = f"/v2/webhooks/deliveries/{row['id']}"
        resp.media = delivery_json(row)


class EventDeliveries:
    """GET /v2/events/{event_id}/deliveries: every delivery of one event, replays included."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, event_id: str) -> None:
        def query(conn: Connection, who: auth.Principal) -> list[dict[str, Any]]:
            event = params.event_id(event_id)
            params.only(req, "limit", "cursor")
            limit, before = params.limit(req), params.cursor(req)
            filters = delivery_store.DeliveryFilter(event_id=event)
            rows = delivery_store.list_deliveries(conn, who.workspace_id, filters, before, limit + 1,
                                                  with_attempts=True)
            # An event with no endpoint subscribed has no rows but does exist.
            if not rows and before is None and not delivery_store.event_exists(conn, who.workspace_id, event):
                raise not_found(f"event {event[:80]!r} does not exist")
            return rows

        rows = read(self.ctx, req, auth.READ, query)
        resp.media = {"event_id": event_id, **_page(rows, params.limit(req))}


def breaker_state(row: dict[str, Any], policy: BreakerPolicy) -> str:
    breaker = EndpointBreaker(row["state"], row["consecutive_failures"], row["open_until_epoch"])
    return policy.shown_state(breaker, row["db_now"])


def endpoint_json(row: dict[str, Any], policy: BreakerPolicy, whole_url: bool) -> dict[str, Any]:
    """The public shape of an endpoint.  ``whole_url``: the token may write, so it sees the URL unmasked."""
    age = row["oldest_pending_age_seconds"]
    attempts, delivered = int(row["attempts_24h"]), int(row["delivered_24h"])
    return {
        "id": row["id"], "url": row["url"] if whole_url else mask_url(row["url"]), "url_masked": not whole_url,
        "active": row["active"], "description": row["description"], "owner_contact": row["owner_contact"],
        "event_types": list(row["event_types"] or []), "created_at": _ts(row["created_at"]),
        "max_per_second": row["max_per_second"],
        "signing": {"secret": "endpoint" if row["own_secret"] else "workspace",
                    "rotated_at": _ts(row["secret_rotated_at"]),
                    "previous_valid_until": _ts(row["previous_valid_until"])},
        "breaker": {"state": breaker_state(row, policy), "consecutive_failures": row["consecutive_failures"],
                    "open_until": _ts(row["open_until"]), "opened_at": _ts(row["opened_at"])},
        "pending": {"count": row["pending_count"], "oldest_created_at": _ts(row["oldest_pending_at"]),
                    "oldest_age_seconds": None if age is None else max(0.0, round(float(age), 3))},
        "success_rate_24h": {"attempts": attempts, "delivered": delivered,
                             "rate": round(delivered / attempts, 4) if attempts else None},
        "last_success_at": _ts(row["last_success_at"]),
        "last_failure_at": _ts(row["last_failure_at"]),
        "last_error": row["last_error"],
    }


def _shown_endpoint(ctx: ApiContext, conn: Connection, who: auth.Principal, ident: int) -> dict[str, Any]:
    row = endpoint_store.endpoint_state(conn, who.workspace_id, ident, ctx.secret_grace)
    return endpoint_json(row, ctx.breaker, auth.WRITE in who.scopes)


class Endpoints:
    """GET /v2/webhooks/endpoints (list) and POST (create)."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> dict[str, Any]:
            params.only(req, "limit", "cursor")
            limit, before = params.limit(req), params.cursor(req)
            rows = endpoint_store.endpoints(conn, who.workspace_id, self.ctx.secret_grace, before, limit + 1)
            whole = auth.WRITE in who.scopes
            return _page(rows, limit, lambda row: endpoint_json(row, self.ctx.breaker, whole))

        resp.media = read(self.ctx, req, auth.READ, query)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(self.ctx, req, auth.WRITE)
        params.only(req)
        # Body and URL are checked before a connection is taken (the URL check may resolve DNS).
        body = params.endpoint_fields(params.json_body(req, self.ctx.config.max_body_bytes), creating=True)
        _check_url(self.ctx, body.get("url"))
        secret = new_secret()
        new = store.NewEndpoint(url=body["url"], event_types=body.get("event_types", ()), secret=secret,
                                description=body.get("description"), active=body.get("active", True),
                                owner_contact=body.get("owner_contact"))
        with self.ctx.pool.connection() as conn:
            ident = store.register_endpoint(conn, who.workspace_id, new, who.token_id)
            shown = _shown_endpoint(self.ctx, conn, who, ident)
        resp.status = falcon.HTTP_201
        resp.location = f"/v2/webhooks/endpoints/{ident}"
        resp.media = {**shown, "secret": secret}


def _check_url(ctx: ApiContext, url: str | None) -> None:
    if url is None:
        return
    refusal = registration_refusal(url, ctx.outbound)
    if refusal is not None:
        raise unprocessable(f"endpoint URL refused: {refusal}")


class Endpoint:
    """GET, PATCH and DELETE /v2/webhooks/endpoints/{endpoint_id}."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        def query(conn: Connection, who: auth.Principal) -> dict[str, Any]:
            ident = params.path_id(endpoint_id, "endpoint")
            params.only(req)
            return _shown_endpoint(self.ctx, conn, who, ident)

        resp.media = read(self.ctx, req, auth.READ, query)

    def on_patch(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        who = principal(self.ctx, req, auth.WRITE)
        ident = params.path_id(endpoint_id, "endpoint")
        params.only(req)
        body = params.endpoint_fields(params.json_body(req, self.ctx.config.max_body_bytes), creating=False)
        _check_url(self.ctx, body.get("url"))
        change = endpoint_store.EndpointChange(url=body.get("url"), event_types=body.get("event_types"),
                                         active=body.get("active"), description=body.get("description"),
                                         set_description="description" in body,
                                         owner_contact=body.get("owner_contact"),
                                         set_owner_contact="owner_contact" in body)
        with self.ctx.pool.connection() as conn:
            endpoint_store.update_endpoint(conn, who.workspace_id, ident, change, who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            endpoint_store.delete_endpoint(conn, who.workspace_id, ident, who.token_id)
        resp.status = falcon.HTTP_204


class BreakerClose:
    """POST /v2/webhooks/endpoints/{endpoint_id}/breaker/close: an operator-style reset."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            endpoint_store.close_breaker(conn, who.workspace_id, ident, who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)


class SecretRotate:
    """POST /v2/webhooks/endpoints/{endpoint_id}/secret/rotate: a new secret, returned this once."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            secret = new_secret()
            until = endpoint_store.rotate_endpoint_secret(conn, who.workspace_id, ident, secret, self.ctx.secret_grace,
                                                    who.token_id)
        resp.media = {"endpoint_id": ident, "secret": secret, "previous_valid_until": until.isoformat()}


def token_json(row: dict[str, Any]) -> dict[str, Any]:
    """A token as its workspace sees it: never the token or its hash."""
    return {"id": row["id"], "prefix": row["prefix"], "scopes": list(row["scopes"]),
            "created_at": _ts(row["created_at"]), "expires_at": _ts(row["expires_at"]),
            "last_used_at": _ts(row["last_used_at"]), "revoked_at": _ts(row["revoked_at"])}


def workspace_json(owner: str | None, notify_url: str | None, whole_url: bool) -> dict[str, Any]:
    """Who hears of this workspace's breakers; the notify URL masked for read-only tokens, like endpoint URLs."""
    shown = notify_url if whole_url or notify_url is None else mask_url(notify_url)
    return {"owner_contact": owner, "notify_webhook_url": shown, "url_masked": not whole_url}


class WorkspaceSettings:
    """GET and PATCH /v2/webhooks/workspace: the owner contact and the operational webhook URL."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with session(self.ctx, req, auth.READ) as (conn, who):
            params.only(req)
            owner, notify_url = store.workspace_contacts(conn, who.workspace_id)
        resp.media = workspace_json(owner, notify_url, auth.WRITE in who.scopes)

    def on_patch(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(self.ctx, req, auth.WRITE)
        params.only(req)
        body = params.workspace_fields(params.json_body(req, self.ctx.config.max_body_bytes))
        _check_url(self.ctx, body.get("notify_webhook_url") or None)
        with self.ctx.pool.connection() as conn:
            owner, notify_url = store.set_workspace_contacts(
                conn, who.workspace_id, body.get("owner_contact"), body.get("notify_webhook_url"), who.token_id)
        resp.media = workspace_json(owner, notify_url, True)


class Tokens:
    """GET /v2/webhooks/tokens: the workspace's own tokens, newest first."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with session(self.ctx, req, auth.READ) as (conn, who):
            params.only(req, "limit", "cursor")
            limit, before = params.limit(req), params.cursor(req)
            rows = token_store.list_tokens(conn, who.workspace_id, before, limit + 1)
        resp.media = _page(rows, limit, token_json)


def audit_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "at": _ts(row["at"]), "token_id": row["token_id"], "action": row["action"],
            "endpoint_id": row["endpoint_id"], "delivery_ids": list(row["delivery_ids"]), "detail": row["detail"]}


class AuditLog:
    """GET /v2/webhooks/audit: the workspace's audit entries, newest first."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> list[dict[str, Any]]:
            params.only(req, "endpoint_id", "limit", "cursor")
            endpoint_id, before = params.query_int(req, "endpoint_id"), params.cursor(req)
            return audit_store.list_audit(conn, who.workspace_id, endpoint_id, before, params.limit(req) + 1)

        resp.media = _page(read(self.ctx, req, auth.READ, query), params.limit(req), audit_json)


def _rate(succeeded: int, attempts: int) -> float | None:
    return None if attempts == 0 else round(succeeded / attempts, 4)


def _stats_numbers(row: dict[str, Any] | None) -> dict[str, Any]:
    attempts, succeeded = (int(row["attempts"]), int(row["succeeded"])) if row else (0, 0)
    return {"attempts": attempts, "succeeded": succeeded, "success_rate": _rate(succeeded, attempts),
            "p95_ms": None if row is None or row["p95_ms"] is None else int(row["p95_ms"])}


def endpoint_stats_json(stats: endpoint_store.StatsWindow, buckets: int) -> dict[str, Any]:
    """Every endpoint with its totals and exactly ``buckets`` buckets, oldest first (empty ones as zeros)."""
    totals: dict[int, dict[str, Any]] = {}
    by_bucket: dict[int, dict[int, dict[str, Any]]] = {}
    for row in stats.rows:
        if row["bucket"] is None:
            totals[row["endpoint_id"]] = row
        else:
            # A float quotient can land an attempt just before `until` in bucket n.
            by_bucket.setdefault(row["endpoint_id"], {})[min(row["bucket"], buckets - 1)] = row
    step = timedelta(seconds=stats.bucket_seconds)
    data = [{"endpoint_id": endpoint_id, **_stats_numbers(total),
             "buckets": [{"start": (stats.since + step * n).isoformat(),
                          **_stats_numbers(by_bucket.get(endpoint_id, {}).get(n))} for n in range(buckets)]}
            for endpoint_id, total in totals.items()]
    return {"since": stats.since.isoformat(), "until": stats.until.isoformat(),
            "window_seconds": round((stats.until - stats.since).total_seconds()),
            "bucket_seconds": stats.bucket_seconds, "data": data}


class EndpointStats:
    """GET /v2/webhooks/endpoints/stats: every endpoint's success rate and p95 duration, in time buckets."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> endpoint_store.StatsWindow:
            params.only(req, "window", "buckets")
            return endpoint_store.endpoint_stats(conn, who.workspace_id, params.stats_window(req),
                                                 params.stats_buckets(req))

        resp.media = endpoint_stats_json(read(self.ctx, req, auth.READ, query), params.stats_buckets(req))


def _recover_window(body: Any, max_age: float) -> tuple[datetime, datetime | None]:
    if not isinstance(body, dict):
        raise bad_request('the body must be a JSON object like {"since": "2026-09-01T00:00:00Z"}')
    unknown = sorted(set(body) - {"since", "until"})
    if unknown:
        raise bad_request(f"unknown field(s): {', '.join(unknown)[:200]}")
    if "since" not in body:
        raise bad_request("since is required")
    since = params.timestamp(body["since"], "since")
    until = params.timestamp(body["until"], "until") if body.get("until") is not None else None
    if since < datetime.now(UTC) - timedelta(seconds=max_age):
        raise unprocessable(f"since may be at most {math.floor(max_age / 86400)} days back")
    if until is not None and until <= since:
        raise unprocessable("until must be later than since")
    return since, until


class Recover:
    """POST /v2/webhooks/endpoints/{endpoint_id}/recover: bulk replay after an outage."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        config = self.ctx.config
        who = principal(self.ctx, req, auth.WRITE)
        ident = params.path_id(endpoint_id, "endpoint")
        params.only(req)
        # The body is read and checked before a connection is taken: a slow
        # upload holds a greenlet, never one of the pool's few connections.
        since, until = _recover_window(params.json_body(req, config.max_body_bytes), config.recover_max_age)
        with self.ctx.pool.connection() as conn:
            result = delivery_store.recover(conn, who.workspace_id, ident, since, until, self.ctx.replay_budget,
                                      who.token_id)
        resp.status = falcon.HTTP_202
        resp.media = {"endpoint_id": ident, "queued": result.queued, "replay_units": result.units,
                      "since": since.isoformat(), "until": _ts(until)}


class Health:
    """GET /healthz: the process serves and its database answers."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.ctx.health.check()
        resp.media = {"status": "ok"}


class HealthCheck:
    """The database's answer to a ping, reused for ``ttl`` seconds (a failure too).

    One caller pings at a time; callers arriving meanwhile wait for its answer
    rather than pinging themselves.
    """

    def __init__(self, pool: ConnectionPool, ttl: float = HEALTH_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()  # a gevent lock in the server: waiting yields
        self._checked_at = -math.inf
        self._healthy = False

    def _fresh(self) -> bool:
        return self._clock() - self._checked_at < self._ttl

    def check(self) -> None:
        """Return if the database answered recently; raise DatabaseUnavailable if it did not."""
        if not self._fresh():
            with self._lock:
                if not self._fresh():
                    self._healthy = self._ping()
                    self._checked_at = self._clock()
        if not self._healthy:
            raise store.DatabaseUnavailable("the database is unavailable")

    def _ping(self) -> bool:
        try:
            with self._pool.connection() as conn:
                store.ping(conn)
        except store.DatabaseUnavailable:
            return False
        return True


class OpenApi:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.ctx.openapi


class Console:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "text/html; charset=utf-8"
        resp.set_header("Content-Security-Policy", self.ctx.console_csp)
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("Referrer-Policy", "no-referrer")
        resp.set_header("Cache-Control", "no-store")
        resp.data = self.ctx.console
