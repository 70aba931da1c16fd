"""``/v2/webhooks/endpoints/stats``: each endpoint's success rate and p95 duration, in time buckets,
a page of endpoints at a time (``limit``, ``cursor``) as every list."""

from __future__ import annotations

import falcon

from dispatcher.api import auth, params
from dispatcher.api.resources.base import Resource, read
from dispatcher.store import Connection
from dispatcher.store import endpoints as endpoint_store
from dispatcher.views import endpoint_stats_json


class EndpointStats(Resource):
    """GET /v2/webhooks/endpoints/stats: a page of endpoints with their success rate and p95 duration,
    in time buckets."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        def query(conn: Connection, who: auth.Principal) -> endpoint_store.StatsWindow:
            params.only(req, "window", "buckets", "limit", "cursor")
            # One extra endpoint is fetched only to learn whether another page exists.
            return endpoint_store.endpoint_stats(conn, who.workspace_id, params.stats_window(req),
                                                 params.stats_buckets(req), params.cursor(req),
                                                 params.stats_limit(req) + 1)

        limit = params.stats_limit(req)
        body = endpoint_stats_json(read(self.ctx, req, auth.READ, query), params.stats_buckets(req))
        more = len(body["data"]) > limit
        body["data"] = body["data"][:limit]
        body["next_cursor"] = params.encode_cursor(body["data"][-1]["endpoint_id"]) if more else None
        resp.media = body
