"""The endpoint and token verbs of the CLI beyond ``add``/``create``.

They run the API's own store functions (``store.endpoints``,
``store.tokens``) without a workspace filter -- the operator may act on any
endpoint -- so the CLI and the API share one rule for each change: the URL
policy, the pending rows a deactivation or deletion ends, the breaker reset,
the rotation, the audit entry (``token_id`` NULL: an operator).  ``endpoint show``/``list`` print
what the API shows a write token (the whole URL).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from dispatcher import store
from dispatcher.config import Config, ConfigError, parse_duration
from dispatcher.contacts import InvalidContact, check_email
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.signing import new_secret
from dispatcher.store import endpoints as endpoint_store
from dispatcher.store import tokens as token_store
from dispatcher.views import endpoint_json

# Lists print every row; pages of this many are fetched.
_PAGE = 100


def endpoint_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not an endpoint id")
    return int(text)


def owner(text: str) -> str:
    """An owner contact (argparse type): an email address."""
    try:
        return check_email(text)
    except InvalidContact as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def owner_or_clear(text: str) -> str:
    """An owner contact, or '' to clear it."""
    return "" if text == "" else owner(text)


def lifetime(text: str) -> float:
    try:
        return parse_duration(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a lifetime (write e.g. 90d, 12h)") from None


def add_endpoint_parsers(endpoint: Any, event_types: Callable[[str], list[str]]) -> None:
    """``endpoint list|show|update|delete|close-breaker|rotate-secret|pause|resume``."""
    listing = endpoint.add_parser("list", help="a workspace's endpoints with breaker state and backlog")
    listing.add_argument("--workspace", required=True)
    listing.add_argument("--json", action="store_true", help="one JSON document, as the API shows it")
    for verb, text in (("show", "one endpoint as JSON, as the API shows it"),
                       ("close-breaker", "close the endpoint's breaker now; its pending rows are due at once"),
                       ("rotate-secret", "give the endpoint a new signing secret; prints it once"),
                       ("pause", "pause an endpoint: its events are held, none sent, until resumed"),
                       ("resume", "resume a paused endpoint: its held events are sent, oldest first")):
        endpoint.add_parser(verb, help=text).add_argument("id", type=endpoint_id)
    delete = endpoint.add_parser("delete", help="delete an endpoint; its pending (and held) rows end failed")
    delete.add_argument("id", type=endpoint_id)
    delete.add_argument("--yes", action="store_true", help="confirm ending the rows a paused endpoint holds")
    update = endpoint.add_parser("update", help="change an endpoint's URL, event types, description, owner or "
                                 "active flag")
    update.add_argument("id", type=endpoint_id)
    update.add_argument("--url")
    update.add_argument("--events", type=event_types, help="comma-separated types")
    update.add_argument("--all-events", action="store_true", help="subscribe to every event type")
    update.add_argument("--description", help="free text; '' clears it")
    update.add_argument("--owner", type=owner_or_clear, default=None, metavar="EMAIL",
                        help="gets this endpoint's breaker notices; '' clears it (then the workspace's owner does)")
    state = update.add_mutually_exclusive_group()
    state.add_argument("--active", dest="active", action="store_const", const=True, default=None)
    state.add_argument("--inactive", dest="active", action="store_const", const=False,
                       help="deactivate: its pending rows end failed")


def add_token_parsers(token: Any) -> None:
    """``token list|revoke`` (``create`` is declared by the CLI itself)."""
    listing = token.add_parser("list", help="a workspace's tokens: id, prefix, scopes, dates; never the token")
    listing.add_argument("--workspace", required=True)
    revoke = token.add_parser("revoke", help="revoke a token by id (see token list); 401 from its next request")
    revoke.add_argument("id", type=endpoint_id)


def _endpoint_json(config: Config, row: dict[str, Any]) -> dict[str, Any]:
    return endpoint_json(row, config.breaker.policy(), whole_url=True)


def _all(fetch: Callable[[int | None], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        page = fetch(before)
        rows += page
        if len(page) < _PAGE:
            return rows
        before = page[-1]["id"]


def _change(config: Config, args: argparse.Namespace, registrable: Callable[[Config, str], str]
            ) -> endpoint_store.EndpointChange:
    if args.events is not None and args.all_events:
        raise UsageError("give --events or --all-events, not both")
    types = [] if args.all_events else args.events
    description = None if args.description in (None, "") else args.description
    change = endpoint_store.EndpointChange(url=None if args.url is None else registrable(config, args.url),
                                           event_types=types, active=args.active, description=description,
                                           set_description=args.description is not None,
                                           owner_contact=args.owner or None, set_owner_contact=args.owner is not None)
    if not change.fields():
        raise UsageError("nothing to change: give --url, --events, --all-events, --description, --owner, --active "
                         "or --inactive")
    return change


def run_endpoint_action(config: Config, args: argparse.Namespace, conn: store.Connection,
                        registrable: Callable[[Config, str], str]) -> int:
    grace = config.secrets.rotation_grace
    if args.action == "list":
        rows = _all(lambda before: endpoint_store.endpoints(conn, args.workspace, grace, before, _PAGE))
        shown = [_endpoint_json(config, row) for row in rows]
        if args.json:
            print(json.dumps({"workspace": args.workspace, "endpoints": shown}, indent=2))
        for e in [] if args.json else shown:
            print(f"{e['id']:>8}  {'active  ' if e['active'] else 'inactive'}  {e['breaker']['state']:<9}  "
                  f"pending {e['pending']['count']:>6}  {_held(e)}{e['url']}")
        return ExitCode.OK
    if args.action == "update":
        endpoint_store.update_endpoint(conn, None, args.id, _change(config, args, registrable), token_id=None)
    elif args.action == "delete":
        endpoint_store.delete_endpoint(conn, None, args.id, token_id=None, confirm_held=args.yes)
        print(f"endpoint {args.id} deleted")
        return ExitCode.OK
    elif args.action in ("pause", "resume"):
        return _pause_or_resume(conn, args)
    elif args.action == "close-breaker":
        made_due = endpoint_store.close_breaker(conn, None, args.id, token_id=None)
        print(f"endpoint {args.id}: breaker closed, {made_due} pending row(s) made due now")
        return ExitCode.OK
    elif args.action == "rotate-secret":
        secret = new_secret()
        until = endpoint_store.rotate_endpoint_secret(conn, None, args.id, secret, grace, token_id=None)
        print(secret)
        print(f"the previous secret also signs until {until.isoformat()}", file=sys.stderr)
        return ExitCode.OK
    print(json.dumps(_endpoint_json(config, endpoint_store.endpoint_state(conn, None, args.id, grace)), indent=2))
    return ExitCode.OK


def _pause_or_resume(conn: store.Connection, args: argparse.Namespace) -> int:
    """An operator's pause or resume (audited, no token)."""
    if args.action == "pause":
        done = endpoint_store.pause_endpoint(conn, None, args.id, "operator", token_id=None)
        print(f"endpoint {args.id}: paused, {done.rows} pending row(s) held" if done.changed else
              f"endpoint {args.id}: already paused since {_when(done.paused_at)} ({done.cause}); "
              f"{done.rows} more row(s) held")
        return ExitCode.OK
    done = endpoint_store.resume_endpoint(conn, None, args.id, token_id=None)
    print(f"endpoint {args.id}: resumed, {done.rows} held row(s) pending again (paused by {done.cause} since "
          f"{_when(done.paused_at)})" if done.changed else f"endpoint {args.id}: not paused")
    return ExitCode.OK


def _when(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def run_token_action(args: argparse.Namespace, conn: store.Connection) -> int:
    if args.action == "revoke":
        token_store.revoke_token(conn, args.id)
        print(f"token {args.id} revoked")
        return ExitCode.OK
    rows = _all(lambda before: token_store.list_tokens(conn, args.workspace, before, _PAGE))
    print(f"{'id':>8}  {'prefix':<12}  {'scopes':<28}  {'created':<19}  {'expires':<19}  {'last used':<19}  revoked")
    for t in rows:
        print(f"{t['id']:>8}  {t['prefix'] or '(unknown)':<12}  {','.join(t['scopes']):<28}  "
              f"{_when(t['created_at']):<19}  {_when(t['expires_at']):<19}  {_when(t['last_used_at']):<19}  "
              f"{_when(t['revoked_at'])}")
    return ExitCode.OK


def _held(shown: dict[str, Any]) -> str:
    """The list's pause column: empty unless paused."""
    pause = shown["paused"]
    return f"paused ({pause['cause']}) held {shown['held']['count']}  " if pause["paused"] else ""
