"""``/v2/contacts/confirm``: an owner contact confirms, by the mailed link, that it wants
breaker notices (issue 23 item 6; dispatcher.engine.notifier.ContactConfirmations).

No bearer token: the link's token is the credential, and only its SHA-256 is
stored.  GET shows what the link confirms and a button; only the POST it sends
confirms, so a mail scanner that follows links does not confirm an address.
"""

from __future__ import annotations

import html

import falcon

from dispatcher.api import params
from dispatcher.api.problems import bad_request, not_found
from dispatcher.api.resources.base import Resource
from dispatcher.contacts import token_hash
from dispatcher.store import notices as notice_store

# The page has no script and no style; the form posts back to this page's own URL.
_CSP = "default-src 'none'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
_TOKEN_CHARS = 128  # the notifier's tokens have 43; a longer one is not ours


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title></head>"
            f"<body><h1>{title}</h1>{body}</body></html>\n")


class ContactConfirm(Resource):
    """GET and POST /v2/contacts/confirm?token=...: show, then confirm, one owner contact."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        digest = self._digest(req)
        with self.ctx.pool.connection() as conn:
            row = notice_store.confirmation(conn, digest)
        if row is None:
            raise not_found("this confirmation link is not valid (any more)")
        who = f"<p><b>{html.escape(row['address'])}</b> is to hear when webhook endpoints of workspace " \
              f"<b>{html.escape(row['workspace_id'])}</b> fail and recover.</p>"
        if row["confirmed_at"] is not None:
            self._answer(resp, _page("Already confirmed", who))
            return
        # No action: the form posts to this very URL, token included.
        self._answer(resp, _page("Confirm webhook notices",
                                 f"{who}<form method=\"post\"><button type=\"submit\">Confirm</button></form>"))

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        digest = self._digest(req)
        with self.ctx.pool.connection() as conn:
            row = notice_store.confirm(conn, digest)
        if row is None:
            raise not_found("this confirmation link is not valid (any more)")
        self._answer(resp, _page("Confirmed", f"<p><b>{html.escape(row['address'])}</b> now hears of the "
                                              f"webhook endpoints of workspace "
                                              f"<b>{html.escape(row['workspace_id'])}</b>.</p>"))

    @staticmethod
    def _digest(req: falcon.Request) -> str:
        params.only(req, "token")
        token = req.get_param("token")
        if not token:
            raise bad_request("token is required: open the link from the confirmation mail")
        if len(token) > _TOKEN_CHARS or not token.isascii():
            raise not_found("this confirmation link is not valid (any more)")
        return token_hash(token)

    @staticmethod
    def _answer(resp: falcon.Response, page: str) -> None:
        resp.content_type = "text/html; charset=utf-8"
        resp.set_header("Content-Security-Policy", _CSP)
        resp.set_header("X-Content-Type-Options", "nosniff")
        resp.set_header("Referrer-Policy", "no-referrer")
        resp.set_header("Cache-Control", "no-store")
        resp.text = page
