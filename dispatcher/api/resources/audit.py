"""``/v2/webhooks/audit``: the workspace's audit log."""

from __future__ import annotations

from typing import Any

import falcon

from dispatcher.api import auth, params
from dispatcher.api.resources.base import Resource, page, read
from dispatcher.store import Connection
from dispatcher.store import audit as audit_store
from dispatcher.views import audit_json


class AuditLog(Resource):
    """GET /v2/webhooks/audit: the workspace's audit entries, newest first."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> list[dict[str, Any]]:
            params.only(req, "endpoint_id", "limit", "cursor")
            endpoint_id, before = params.query_int(req, "endpoint_id"), params.cursor(req)
            return audit_store.list_audit(conn, who.workspace_id, endpoint_id, before, params.limit(req) + 1)

        resp.media = page(read(self.ctx, req, auth.READ, query), params.limit(req), audit_json)
