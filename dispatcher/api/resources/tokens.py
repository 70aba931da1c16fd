"""``/v2/webhooks/tokens``: the workspace's own tokens."""

from __future__ import annotations

import falcon

from dispatcher.api import auth, params
from dispatcher.api.resources.base import Resource, page, session
from dispatcher.store import tokens as token_store
from dispatcher.views import token_json


class Tokens(Resource):
    """GET /v2/webhooks/tokens: the workspace's own tokens, newest first."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        with session(self.ctx, req, auth.READ) as (conn, who):
            params.only(req, "limit", "cursor")
            limit, before = params.limit(req), params.cursor(req)
            rows = token_store.list_tokens(conn, who.workspace_id, before, limit + 1)
        resp.media = page(rows, limit, token_json)
