"""Problem details (RFC 9457): the one shape of every API error.

Every error -- ours, Falcon's own (unknown route, wrong method) and the
catch-all for bugs -- leaves as ``application/problem+json`` with ``type``,
``title``, ``status`` and ``detail``.  ``type`` is a stable URN per kind of
problem, listed in docs/api.md, so clients can branch on it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import falcon

from dispatcher import store
from dispatcher.api import pool
from dispatcher.store import Conflict, ReplayLimited
from dispatcher.store.errors import Unprocessable

log = logging.getLogger("dispatcher.api")

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:dispatcher:problem:"

# Kinds for errors Falcon raises itself, keyed by status code.
_DEFAULT_KINDS = {
    400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
    406: "not-acceptable", 409: "conflict", 413: "body-too-large", 415: "unsupported-media-type",
    422: "unprocessable", 429: "rate-limited", 500: "internal-error", 503: "unavailable",
}


_DEFAULT_DETAILS = {
    404: "no resource at this path",
    405: "this path does not support the method; see the Allow header",
}


class Problem(falcon.HTTPError):
    """An HTTP error with a problem kind; raise it from any responder."""

    def __init__(self, status: int, kind: str, title: str, detail: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status, title=title, description=detail, headers=dict(headers or {}))
        self.kind = kind


def serialize_problem(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """Falcon error serializer: render any HTTPError as problem+json."""
    status = int(exc.status_code)
    kind = getattr(exc, "kind", None) or _DEFAULT_KINDS.get(status, "error")
    # Falcon's own errors are titled like "404 Not Found"; keep just the phrase.
    title = re.sub(r"^\d{3} ", "", exc.title or falcon.code_to_http_status(status))
    body: dict[str, Any] = {
        "type": TYPE_PREFIX + kind,
        "title": title,
        "status": status,
        "detail": exc.description or _DEFAULT_DETAILS.get(status, title),
    }
    resp.data = json.dumps(body).encode("utf-8")
    resp.content_type = PROBLEM_JSON
    resp.append_header("Vary", "Accept")


def bad_request(detail: str) -> Problem:
    return Problem(400, "bad-request", "Bad request", detail)


def not_found(detail: str) -> Problem:
    return Problem(404, "not-found", "Not found", detail)


def unprocessable(detail: str) -> Problem:
    return Problem(422, "unprocessable", "Unprocessable request", detail)


# Error handlers: store exceptions that escape a responder become problems here,
# so resources do not translate them one by one.

def handle_not_found(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]) -> None:
    raise not_found(str(exc))


def handle_conflict(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]) -> None:
    raise Problem(409, "conflict", "Conflict", str(exc))


def handle_unprocessable(req: falcon.Request, resp: falcon.Response, exc: Exception,
                         params: dict[str, Any]) -> None:
    raise unprocessable(str(exc))


def handle_limit_reached(req: falcon.Request, resp: falcon.Response, exc: Exception,
                         params: dict[str, Any]) -> None:
    raise Problem(409, "endpoint-limit", "Endpoint limit reached",
                  f"{exc}; deactivate or delete one before adding or activating another")


def handle_replay_limited(req: falcon.Request, resp: falcon.Response, exc: Exception,
                          params: dict[str, Any]) -> None:
    assert isinstance(exc, ReplayLimited)
    if exc.retry_after is None:
        raise Problem(422, "replay-request-too-large", "Replay request too large",
                      f"{exc}; narrow the time range (since/until) and send several requests")
    raise Problem(429, "rate-limited", "Replay limit reached", f"{exc}; retry in {exc.retry_after} s",
                  headers={"Retry-After": str(exc.retry_after)})


def handle_unavailable(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]) -> None:
    # The log gets the cause (host, port, libpq text); the client only the kind.
    log.warning("%s %s: 503: %s", req.method, req.path, exc)
    if isinstance(exc, pool.PoolTimeout):
        detail = "all database connections are busy"
    elif isinstance(exc, store.QueryTimeout):
        detail = "the database query took too long"
    else:
        detail = "the database is unavailable"
    raise Problem(503, "unavailable", "Service unavailable", detail + "; retry later", headers={"Retry-After": "5"})


def handle_bug(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict[str, Any]) -> None:
    """The catch-all: a true bug. Log the traceback, tell the client nothing internal."""
    if isinstance(exc, (falcon.HTTPError, falcon.HTTPStatus)):
        raise exc  # Falcon's own handlers are more specific; this is belt and braces
    log.exception("unhandled error in %s %s", req.method, req.path)
    raise Problem(500, "internal-error", "Internal server error",
                  "an unexpected error occurred; it has been logged")


HANDLERS: tuple[tuple[type[Exception], Any], ...] = (
    (Exception, handle_bug),
    (store.NotFound, handle_not_found),
    (Conflict, handle_conflict),
    (Unprocessable, handle_unprocessable),
    (store.LimitReached, handle_limit_reached),
    (ReplayLimited, handle_replay_limited),
    (store.DatabaseUnavailable, handle_unavailable),
)
