"""``dispatcher -c CONFIG <command>``: the command line.

This module stays free of gevent: the supervisor (``run``) is a plain process
like gunicorn's arbiter, and the green processes (workers, the API server) are
started through their own entry points, which monkey-patch before any import.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence

from dispatcher import store
from dispatcher.cli import embedded, gate, manage, replay, rollout
from dispatcher.config import Config, load_config
from dispatcher.runtime.embedded import connect
from dispatcher.runtime.entry import run_command
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.runtime.logsetup import quiet_libraries
from dispatcher.signing import WeakSecret, check_strength, new_secret
from dispatcher.version import __version__

Command = Callable[[Config, argparse.Namespace], int]


def _flag(text: str) -> tuple[str, bool]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or value not in ("on", "off", "true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=on|off")
    return name, value in ("on", "true")


def _event_types(text: str) -> list[str]:
    types = [part.strip() for part in text.split(",") if part.strip()]
    if not types:
        raise argparse.ArgumentTypeError("--events needs at least one event type")
    return types


def _migration_version(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a migration number (e.g. 25 for 0025_partition_prepare)")
    return int(text)


def _per_second(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of requests per second")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dispatcher", description="Queue-backed webhook delivery (RFC-014).")
    parser.add_argument("-c", "--config", default="config/local.yaml", help="YAML config file (default: %(default)s)")
    parser.add_argument("--version", action="version", version=f"dispatcher {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show other libraries' INFO logs (e.g. the embedded Postgres' start-up)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("run", help="start the supervisor and its workers (the default)")
    migrate = commands.add_parser("migrate", help="apply pending schema migrations")
    migrate.add_argument("--up-to", type=_migration_version, default=None, metavar="VERSION",
                         help="apply only the pending migrations numbered up to VERSION (a region migrated in steps: "
                              "docs/operations.md)")
    commands.add_parser("api", help="serve the delivery history / replay HTTP API and console")
    workspace = commands.add_parser("workspace", help="manage workspaces").add_subparsers(dest="action", required=True)
    create = workspace.add_parser("create", help="create a workspace (or update its flags)")
    create.add_argument("--id", required=True)
    given = create.add_mutually_exclusive_group()
    given.add_argument("--secret", help="signing secret (default: a new random whsec_ secret); visible to every "
                                        "user in `ps` while the command runs: prefer --secret-stdin or --secret-file")
    given.add_argument("--secret-stdin", action="store_true",
                       help="read the signing secret from standard input (first line); stays out of `ps`")
    given.add_argument("--secret-file", metavar="PATH",
                       help="read the signing secret from PATH (first line); stays out of `ps`")
    create.add_argument("--flag", action="append", type=_flag, default=[], help="NAME=on|off, e.g. webhook_outbox=on")
    rollout.add_flag_parser(workspace)
    contacts = workspace.add_parser("set", help="set a workspace's owner email and notify webhook URL "
                                                "(breaker notices; '' clears one)")
    contacts.add_argument("--id", required=True)
    contacts.add_argument("--owner", type=manage.owner_or_clear, default=None, metavar="EMAIL",
                          help="gets breaker notices of endpoints that name no owner of their own")
    contacts.add_argument("--notify-url", default=None, metavar="URL",
                          help="also send breaker notices as an operational webhook here (same URL policy as "
                               "endpoints)")
    endpoint = commands.add_parser("endpoint", help="manage endpoints").add_subparsers(dest="action", required=True)
    add = endpoint.add_parser("add", help="register an endpoint; prints its id, then its own signing secret (once)")
    add.add_argument("--workspace", required=True)
    add.add_argument("--url", required=True)
    add.add_argument("--events", type=_event_types, default=[], help="comma-separated types (default: all)")
    add.add_argument("--max-per-second", type=_per_second, default=None,
                     help="requests per second to this endpoint, across the region (default: no limit)")
    add.add_argument("--owner", type=manage.owner, default=None, metavar="EMAIL",
                     help="gets this endpoint's breaker notices (default: the workspace's owner)")
    manage.add_endpoint_parsers(endpoint, _event_types)
    status = commands.add_parser("status", help="the region at a glance, read from the database")
    status.add_argument("--json", action="store_true", help="a stable JSON document (docs/operations.md)")
    check = commands.add_parser("check", help="monitoring probe: Nagios exit codes 0 OK, 1 WARNING, 2 CRITICAL, "
                                              "3 UNKNOWN")
    check.add_argument("--json", action="store_true", help="the verdict and its figures as JSON")
    token = commands.add_parser("token", help="manage API tokens").add_subparsers(dest="action", required=True)
    tcreate = token.add_parser("create", help="create an API token; prints it once")
    tcreate.add_argument("--workspace", required=True)
    tcreate.add_argument("--scope", default="webhooks:read", help="comma-separated scopes")
    tcreate.add_argument("--expires", type=manage.lifetime, default=None,
                         help="lifetime, e.g. 90d or 12h; then every request with it gets 401 (default: none)")
    manage.add_token_parsers(token)
    rollout.add_parsers(commands)
    gate.add_parser(commands)
    replay.add_parser(commands)
    embedded.add_parser(commands)
    return parser


def _connect(config: Config) -> store.Connection:
    return connect(config, "dispatcher-cli")


def cmd_migrate(config: Config, args: argparse.Namespace) -> int:
    conn = _connect(config)
    applied = store.migrate(conn, up_to=args.up_to)
    print(f"migrated: applied {len(applied)} migration(s)" + (f" {applied}" if applied else ", schema up to date"))
    return ExitCode.OK


def _given_secret(args: argparse.Namespace) -> str | None:
    """The secret from --secret, --secret-stdin or --secret-file (first line, trimmed), or None."""
    if args.secret_stdin:
        text = sys.stdin.readline()
    elif args.secret_file:
        try:
            with open(args.secret_file, encoding="utf-8") as file:
                text = file.readline()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the secret file {args.secret_file}: "
                             f"{getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    else:
        return args.secret
    secret = text.strip()
    if not secret:
        raise UsageError("the given secret is empty")
    return secret


def cmd_workspace(config: Config, args: argparse.Namespace) -> int:
    if args.action == "flag":
        return rollout.cmd_flag(config, args)
    if args.action == "set":
        return _set_workspace_contacts(config, args)
    given = _given_secret(args)
    if given is not None:
        try:
            check_strength(given)
        except WeakSecret as exc:
            raise UsageError(f"the given secret is refused: {exc}") from None
    secret = new_secret() if given is None else given
    existed = store.create_workspace(_connect(config), args.id, secret, dict(args.flag))
    print(f"workspace {args.id} {'updated' if existed else 'created'}")
    if given is None and not existed:
        # A secret nobody has seen verifies nothing: the one we made is shown this
        # once (an existing workspace keeps its own, so there is nothing new to show).
        print(secret)
        print(f"workspace {args.id} signs its breaker notices to --notify-url with its own secret (the second "
              "line), shown this once; each endpoint has its own (endpoint add)", file=sys.stderr)
    return ExitCode.OK


def _check_url(config: Config, url: str, what: str) -> None:
    """The endpoint URL policy (https when required, the SSRF check), for every URL we will POST to."""
    from dispatcher.outbound.netguard import OutboundPolicy, registration_refusal

    refusal = registration_refusal(url, OutboundPolicy.from_config(config.http))
    if refusal is not None:
        raise UsageError(f"{what} refused: {refusal}")


def _registrable(config: Config, url: str) -> str:
    _check_url(config, url, "endpoint URL")
    return url


def _set_workspace_contacts(config: Config, args: argparse.Namespace) -> int:
    if args.owner is None and args.notify_url is None:
        raise UsageError("workspace set needs --owner and/or --notify-url")
    if args.notify_url:
        _check_url(config, args.notify_url, "notify URL")
    owner, notify_url = store.set_workspace_contacts(_connect(config), args.id, args.owner, args.notify_url)
    print(f"workspace {args.id}: owner {owner or '(none: the operator address)'}, "
          f"notify webhook {notify_url or '(none)'}")
    return ExitCode.OK


def cmd_endpoint(config: Config, args: argparse.Namespace) -> int:
    if args.action != "add":
        return manage.run_endpoint_action(config, args, _connect(config), _registrable)
    # Its own secret (docs/decisions.md, "Own secret per endpoint"), printed this once:
    # the id on the first line, the secret on the second.
    secret = new_secret()
    endpoint_id = store.add_endpoint(_connect(config), args.workspace, _registrable(config, args.url), args.events,
                                     secret, max_per_second=args.max_per_second, owner_contact=args.owner)
    print(endpoint_id)
    print(secret)
    print(f"endpoint {endpoint_id} signs with its own secret (the second line), shown this once", file=sys.stderr)
    return ExitCode.OK


def cmd_token(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.tokens import InvalidTokenRequest, create_token

    if args.action != "create":
        return manage.run_token_action(args, _connect(config))
    scopes = [s.strip() for s in args.scope.split(",") if s.strip()]
    try:
        print(create_token(_connect(config), args.workspace, scopes, expires_in=args.expires))
    except InvalidTokenRequest as exc:
        raise UsageError(str(exc)) from None
    return ExitCode.OK


def cmd_run(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.runtime.supervisor import run_supervisor

    return run_supervisor(config)


def cmd_api(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.runtime.api_exec import exec_api

    return exec_api(config)


def cmd_replay(config: Config, args: argparse.Namespace) -> int:
    return replay.cmd_replay(config, args, _connect(config))


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.cli.status import cmd_status as status

    return status(config, args)


COMMANDS: dict[str, Command] = {
    "run": cmd_run, "migrate": cmd_migrate, "api": cmd_api,
    "workspace": cmd_workspace, "endpoint": cmd_endpoint, "token": cmd_token, "status": cmd_status,
    "rollout": rollout.cmd_rollout, "gate": gate.cmd_gate, "replay": cmd_replay,
    "embedded": embedded.cmd_embedded,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries(args.verbose)
    if args.command == "check":
        # A monitoring probe: its own exit codes (Nagios), every failure UNKNOWN (3), never a traceback.
        from dispatcher.cli.status import check_main

        return check_main(args.config, args.json)

    def command() -> int:
        return COMMANDS[args.command or "run"](load_config(args.config), args)

    return run_command(command, "dispatcher", args.config)


if __name__ == "__main__":
    sys.exit(main())
