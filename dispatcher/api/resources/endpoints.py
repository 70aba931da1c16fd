"""Endpoints: ``/v2/webhooks/endpoints`` (list, create), one endpoint (get,
patch, delete), its breaker close and its secret rotation.
"""

from __future__ import annotations

from typing import Any

import falcon

from dispatcher import store
from dispatcher.api import auth, params
from dispatcher.api.problems import bad_request
from dispatcher.api.resources.base import (
    ApiContext,
    Resource,
    check_url,
    connection,
    page,
    path_action,
    principal,
    read,
    session,
)
from dispatcher.signing import new_secret
from dispatcher.store import Connection
from dispatcher.store import endpoints as endpoint_store
from dispatcher.views import endpoint_json


def _shown_endpoint(ctx: ApiContext, conn: Connection, who: auth.Principal, ident: int) -> dict[str, Any]:
    row = endpoint_store.endpoint_state(conn, who.workspace_id, ident, ctx.secret_grace)
    return endpoint_json(row, ctx.breaker, auth.WRITE in who.scopes)


class Endpoints(Resource):
    """GET /v2/webhooks/endpoints (list) and POST (create)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> dict[str, Any]:
            params.only(req, "limit", "cursor")
            limit, before = params.limit(req), params.cursor(req)
            rows = endpoint_store.endpoints(conn, who.workspace_id, self.ctx.secret_grace, before, limit + 1)
            whole = auth.WRITE in who.scopes
            return page(rows, limit, lambda row: endpoint_json(row, self.ctx.breaker, whole))

        resp.media = read(self.ctx, req, auth.READ, query)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(self.ctx, req, auth.WRITE)
        params.only(req)
        # Body and URL are checked before a connection is taken.
        body = params.endpoint_fields(params.json_body(req, self.ctx.config.max_body_bytes), creating=True)
        check_url(self.ctx, body.get("url"))
        secret = new_secret()
        new = store.NewEndpoint(url=body["url"], event_types=body.get("event_types", ()), secret=secret,
                                description=body.get("description"), active=body.get("active", True),
                                owner_contact=body.get("owner_contact"),
                                trace_headers=body.get("trace_headers", True))
        with connection(self.ctx, req, who) as conn:
            ident = store.register_endpoint(conn, who.workspace_id, new, who.token_id)
            shown = _shown_endpoint(self.ctx, conn, who, ident)
        resp.status = falcon.HTTP_201
        resp.location = f"/v2/webhooks/endpoints/{ident}"
        resp.media = {**shown, "secret": secret}


class Endpoint(Resource):
    """GET, PATCH and DELETE /v2/webhooks/endpoints/{endpoint_id}."""

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
        check_url(self.ctx, body.get("url"))
        change = endpoint_store.EndpointChange(url=body.get("url"), event_types=body.get("event_types"),
                                               active=body.get("active"), description=body.get("description"),
                                               set_description="description" in body,
                                               owner_contact=body.get("owner_contact"),
                                               set_owner_contact="owner_contact" in body,
                                               trace_headers=body.get("trace_headers"))
        with connection(self.ctx, req, who) as conn:
            endpoint_store.update_endpoint(conn, who.workspace_id, ident, change, who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)

    def on_delete(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        """409 when the endpoint holds rows (paused) unless ``?confirm=held``: deleting ends them."""
        params.discard_body(req, self.ctx.config.max_body_bytes)
        with session(self.ctx, req, auth.WRITE) as (conn, who):
            ident = params.path_id(endpoint_id, "endpoint")
            params.only(req, "confirm")
            confirm = params.single(req, "confirm")
            if confirm not in (None, "held"):
                raise bad_request("confirm must be 'held'")
            endpoint_store.delete_endpoint(conn, who.workspace_id, ident, who.token_id, confirm_held=confirm == "held")
        resp.status = falcon.HTTP_204


class BreakerClose(Resource):
    """POST /v2/webhooks/endpoints/{endpoint_id}/breaker/close: an operator-style reset."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            endpoint_store.close_breaker(conn, who.workspace_id, ident, who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)


class SecretRotate(Resource):
    """POST /v2/webhooks/endpoints/{endpoint_id}/secret/rotate: a new secret, returned this once."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            secret = new_secret()
            until = endpoint_store.rotate_endpoint_secret(conn, who.workspace_id, ident, secret, self.ctx.secret_grace,
                                                          who.token_id)
        resp.media = {"endpoint_id": ident, "secret": secret, "previous_valid_until": until.isoformat()}


class Pause(Resource):
    """POST /v2/webhooks/endpoints/{endpoint_id}/pause: hold its events, send none, until resumed."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            endpoint_store.pause_endpoint(conn, who.workspace_id, ident, "customer", who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)


class Resume(Resource):
    """POST /v2/webhooks/endpoints/{endpoint_id}/resume: its held events are sent again, oldest first."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, endpoint_id: str) -> None:
        with path_action(self.ctx, req, endpoint_id, "endpoint") as (conn, who, ident):
            endpoint_store.resume_endpoint(conn, who.workspace_id, ident, who.token_id)
            resp.media = _shown_endpoint(self.ctx, conn, who, ident)
