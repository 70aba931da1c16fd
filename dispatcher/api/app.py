"""The Falcon WSGI application of the delivery-history API (docs/api.md).

``create_app`` builds a plain WSGI app with no server and no gevent in it:
``dispatcher.runtime.api_main`` runs it on gevent's WSGIServer in production, and tests run
it in-process (falcon.testing, schemathesis, a wsgiref thread).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from importlib import resources
from typing import Any

import falcon
import falcon.media

from dispatcher.api import auth, problems
from dispatcher.api.in_flight import ReleaseInFlight, WorkspaceInFlight
from dispatcher.api.pool import ConnectionPool, HealthCheck, ReadRoute
from dispatcher.api.resources.audit import AuditLog
from dispatcher.api.resources.base import ApiContext, Resource
from dispatcher.api.resources.contacts import ContactConfirm
from dispatcher.api.resources.deliveries import Deliveries, Delivery, EventDeliveries, Recover, Replay
from dispatcher.api.resources.documents import Console, OpenApi
from dispatcher.api.resources.endpoints import BreakerClose, Endpoint, Endpoints, Pause, Resume, SecretRotate
from dispatcher.api.resources.health import Health
from dispatcher.api.resources.replays import ReplayJob, Replays
from dispatcher.api.resources.stats import EndpointStats
from dispatcher.api.resources.tokens import Tokens
from dispatcher.api.resources.workspace import WorkspaceSettings
from dispatcher.config import Config
from dispatcher.outbound.netguard import OutboundPolicy
from dispatcher.rules.bulk_replay import BulkReplayPolicy
from dispatcher.rules.replay_budget import ReplayBudget
from dispatcher.tracing import Tracer, TracingMiddleware

ROUTES: tuple[tuple[str, type[Resource]], ...] = (
    ("/healthz", Health),
    ("/openapi.json", OpenApi),
    ("/console", Console),
    ("/v2/webhooks/deliveries", Deliveries),
    ("/v2/webhooks/deliveries/{delivery_id}", Delivery),
    ("/v2/webhooks/deliveries/{delivery_id}/replay", Replay),
    ("/v2/events/{event_id}/deliveries", EventDeliveries),
    # A literal segment wins over a field in Falcon's router: "stats" is never an endpoint id.
    ("/v2/webhooks/endpoints/stats", EndpointStats),
    ("/v2/webhooks/endpoints/{endpoint_id}", Endpoint),
    ("/v2/webhooks/endpoints/{endpoint_id}/recover", Recover),
    ("/v2/webhooks/endpoints", Endpoints),
    ("/v2/webhooks/endpoints/{endpoint_id}/breaker/close", BreakerClose),
    ("/v2/webhooks/endpoints/{endpoint_id}/secret/rotate", SecretRotate),
    ("/v2/webhooks/endpoints/{endpoint_id}/pause", Pause),
    ("/v2/webhooks/endpoints/{endpoint_id}/resume", Resume),
    ("/v2/webhooks/tokens", Tokens),
    ("/v2/webhooks/workspace", WorkspaceSettings),
    ("/v2/webhooks/audit", AuditLog),
    ("/v2/contacts/confirm", ContactConfirm),
    ("/v2/webhooks/replays", Replays),
    ("/v2/webhooks/replays/{job_id}", ReplayJob),
)


class DispatcherApp(falcon.App):
    """A falcon.App that owns its connection pools (closed by the server on exit)."""

    pool: ConnectionPool        # the primary: token checks, writes, and reads unless a standby is set
    reads: ReadRoute | None     # the standby of ``api.read_dsn``, if any

    tracer: Tracer              # request spans (Tracer.off() when tracing is off)

    def close(self) -> None:
        self.tracer.shutdown()
        self.pool.close()
        if self.reads is not None:
            self.reads.close()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _asset(name: str) -> bytes:
    return resources.files("dispatcher.api").joinpath(name).read_bytes()


def _csp_for(html: bytes) -> str:
    """A Content-Security-Policy that allows exactly the page's inline script and style.

    Hashes instead of 'unsafe-inline': if a delivery's error text ever slipped
    into the DOM as markup, an injected script would still not run.
    """
    def hashes(tag: str) -> str:
        blocks = re.findall(rb"<" + tag.encode() + rb">(.*?)</" + tag.encode() + rb">", html, flags=re.DOTALL)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b).digest()).decode()}'" for b in blocks)

    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def create_app(config: Config, dsn: str,
               bound: Callable[[float], AbstractContextManager[Any]] | None = None,
               tracer: Tracer | None = None) -> DispatcherApp:
    """The WSGI app for ``config.api``, reading and writing the database at ``dsn``.

    ``bound``: how the server process limits a request's wait for the database
    (``api_main``: a gevent timeout; see ``api/pool.py``).  ``tracer``: the
    request spans' (default: ``tracing.*``'s; off, the app has no tracing middleware).
    """
    api = config.api

    def pool_for(target: str, application_name: str) -> ConnectionPool:
        return ConnectionPool(target, size=api.pool_size, connect_timeout=config.database.connect_timeout,
                              statement_timeout=api.statement_timeout, application_name=application_name,
                              bound=bound, deadline=config.database.statement_deadline)

    pool = pool_for(dsn, "dispatcher-api")
    reads = None
    if api.read_dsn:
        standby = pool_for(api.read_dsn, "dispatcher-api-read")
        reads = ReadRoute(pool, standby)
    console = _asset("console.html")
    ctx = ApiContext(config=api, pool=pool, reads=reads,
                     replay_budget=ReplayBudget(api.replays_per_hour, region_per_hour=api.region_replays_per_hour),
                     replay_policy=BulkReplayPolicy(),
                     breaker=config.breaker.policy(), outbound=OutboundPolicy.from_config(config.http),
                     secret_grace=config.secrets.rotation_grace, openapi=_asset("openapi.json"), console=console,
                     console_csp=_csp_for(console), unknown_tokens=auth.UnknownTokens(),
                     health=HealthCheck(pool), in_flight=WorkspaceInFlight(api.requests_in_flight_per_workspace))
    tracer = tracer if tracer is not None else Tracer.from_config(config.tracing, "dispatcher-api")
    middleware: list[Any] = [ReleaseInFlight(ctx.in_flight)]
    if tracer.enabled:
        middleware.insert(0, TracingMiddleware(tracer))
    app = DispatcherApp(media_type=falcon.MEDIA_JSON, middleware=middleware)
    app.pool = pool
    app.tracer = tracer
    app.reads = reads
    handler = falcon.media.JSONHandler(dumps=functools.partial(json.dumps, default=_json_default))
    app.resp_options.media_handlers.update({falcon.MEDIA_JSON: handler})
    app.req_options.strip_url_path_trailing_slash = False
    app.set_error_serializer(problems.serialize_problem)
    for exc_type, exc_handler in problems.HANDLERS:
        app.add_error_handler(exc_type, exc_handler)
    for template, resource in ROUTES:
        app.add_route(template, resource(ctx))
    return app
