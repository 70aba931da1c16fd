"""The static documents: ``/openapi.json`` and ``/console``."""

from __future__ import annotations

import falcon

from dispatcher.api.resources.base import Resource


class OpenApi(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.ctx.openapi


class Console(Resource):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "text/html; charset=utf-8"
        resp.set_header("Content-Security-Policy", self.ctx.console_csp)
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("Referrer-Policy", "no-referrer")
        resp.set_header("Cache-Control", "no-store")
        resp.data = self.ctx.console
