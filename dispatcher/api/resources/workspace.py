"""``/v2/webhooks/workspace``: who hears of the workspace's breakers."""

from __future__ import annotations

import falcon

from dispatcher import store
from dispatcher.api import auth, params
from dispatcher.api.resources.base import Resource, check_url, connection, principal, session
from dispatcher.views import workspace_json


class WorkspaceSettings(Resource):
    """GET and PATCH /v2/webhooks/workspace: the owner contact and the operational webhook URL."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with session(self.ctx, req, auth.READ) as (conn, who):
            params.only(req)
            owner, notify_url, confirmed = store.workspace_contacts(conn, who.workspace_id)
        resp.media = workspace_json(who.workspace_id, owner, notify_url, auth.WRITE in who.scopes, confirmed)

    def on_patch(self, req: falcon.Request, resp: falcon.Response) -> None:
        who = principal(self.ctx, req, auth.WRITE)
        params.only(req)
        body = params.workspace_fields(params.json_body(req, self.ctx.config.max_body_bytes))
        check_url(self.ctx, body.get("notify_webhook_url") or None)
        with connection(self.ctx, req, who) as conn:
            store.set_workspace_contacts(
                conn, who.workspace_id, body.get("owner_contact"), body.get("notify_webhook_url"), who.token_id)
            owner, notify_url, confirmed = store.workspace_contacts(conn, who.workspace_id)
        resp.media = workspace_json(who.workspace_id, owner, notify_url, True, confirmed)
