"""``/healthz``: the process serves and its database answers."""

from __future__ import annotations

import falcon

from dispatcher.api.resources.base import Resource


class Health(Resource):
    """GET /healthz: the process serves and its database answers."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.ctx.health.check()
        resp.media = {"status": "ok"}
