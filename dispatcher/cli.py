"""``dispatcher -c CONFIG <command>``: the command line.

This module stays free of gevent: the supervisor (``run``) is a plain process
like gunicorn's arbiter, and the green processes (workers, the API server) are
started through their own entry points, which monkey-patch before any import.
"""

from __future__ import annotations

import argparse
import base64
import logging
import re
import secrets
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import psycopg2
import psycopg2.errors

from dispatcher import __version__, gate, rollout, store
from dispatcher.config import Config, ConfigError, load_config
from dispatcher.embedded import EmbeddedUnavailable, resolve_dsn
from dispatcher.exitcodes import ExitCode, UsageError

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dispatcher", description="Queue-backed webhook delivery (RFC-014).")
    parser.add_argument("-c", "--config", default="config/local.yaml", help="YAML config file (default: %(default)s)")
    parser.add_argument("--version", action="version", version=f"dispatcher {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("run", help="start the supervisor and its workers (the default)")
    commands.add_parser("migrate", help="apply pending schema migrations")
    commands.add_parser("api", help="serve the delivery history / replay HTTP API and console")
    demo = commands.add_parser("demo", help="local demo: receiver, dispatcher and a producer, with progress")
    demo.add_argument("--events", type=int, default=2000, help="events to produce (default: %(default)s)")
    demo.add_argument("--rate", type=float, default=200.0, help="events per second (default: %(default)s)")
    workspace = commands.add_parser("workspace", help="manage workspaces").add_subparsers(dest="action", required=True)
    create = workspace.add_parser("create", help="create a workspace (or update its flags)")
    create.add_argument("--id", required=True)
    create.add_argument("--secret", help="signing secret (default: a new random whsec_ secret)")
    create.add_argument("--flag", action="append", type=_flag, default=[], help="NAME=on|off, e.g. webhook_outbox=on")
    rollout.add_flag_parser(workspace)
    endpoint = commands.add_parser("endpoint", help="manage endpoints").add_subparsers(dest="action", required=True)
    add = endpoint.add_parser("add", help="register an endpoint; prints its id")
    add.add_argument("--workspace", required=True)
    add.add_argument("--url", required=True)
    add.add_argument("--events", type=_event_types, default=[], help="comma-separated types (default: all)")
    token = commands.add_parser("token", help="manage API tokens").add_subparsers(dest="action", required=True)
    tcreate = token.add_parser("create", help="create an API token; prints it once")
    tcreate.add_argument("--workspace", required=True)
    tcreate.add_argument("--scope", default="webhooks:read", help="comma-separated scopes")
    rollout.add_parsers(commands)
    gate.add_parser(commands)
    return parser


def _connect(config: Config) -> store.Connection:
    return store.connect(resolve_dsn(config.database), config.database.connect_timeout, "dispatcher-cli")


def cmd_migrate(config: Config, args: argparse.Namespace) -> int:
    conn = _connect(config)
    applied = store.migrate(conn)
    print(f"migrated: applied {len(applied)} migration(s)" + (f" {applied}" if applied else ", schema up to date"))
    return ExitCode.OK


def cmd_workspace(config: Config, args: argparse.Namespace) -> int:
    if args.action == "flag":
        return rollout.cmd_flag(config, args)
    secret = args.secret or "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode("ascii")
    existed = store.create_workspace(_connect(config), args.id, secret, dict(args.flag))
    print(f"workspace {args.id} {'updated' if existed else 'created'}")
    return ExitCode.OK


def cmd_endpoint(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.netguard import BlockedURL, InvalidURL, check_registration_url

    try:
        check_registration_url(args.url, _outbound_policy(config))
    except (InvalidURL, BlockedURL) as exc:
        raise UsageError(f"endpoint URL refused: {exc}") from None
    endpoint_id = store.add_endpoint(_connect(config), args.workspace, args.url, args.events)
    print(endpoint_id)
    return ExitCode.OK


def _outbound_policy(config: Config):  # type: ignore[no-untyped-def]
    from dispatcher.netguard import OutboundPolicy

    return OutboundPolicy(require_https=config.http.require_https,
                          allow_private_networks=config.http.allow_private_networks,
                          allow_networks=tuple(config.http.allow_networks))


def cmd_token(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.api.auth import create_token

    print(create_token(_connect(config), args.workspace, [s.strip() for s in args.scope.split(",") if s.strip()]))
    return ExitCode.OK


def cmd_run(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.supervisor import run_supervisor

    return run_supervisor(config)


def cmd_api(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.api.serve import exec_api

    return exec_api(config)


def cmd_demo(config: Config, args: argparse.Namespace) -> int:
    from dispatcher.demo import demo_main

    return demo_main(config, events=args.events, rate=args.rate)


COMMANDS: dict[str, Command] = {
    "run": cmd_run, "migrate": cmd_migrate, "api": cmd_api, "demo": cmd_demo,
    "workspace": cmd_workspace, "endpoint": cmd_endpoint, "token": cmd_token,
    "rollout": rollout.cmd_rollout, "gate": gate.cmd_gate,
}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _fail(code: ExitCode, message: str) -> NoReturn:
    print(f"dispatcher: {message}", file=sys.stderr)
    raise SystemExit(int(code))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load_config(args.config)
        return COMMANDS[args.command or "run"](config, args)
    except ConfigError as exc:
        _fail(ExitCode.CONFIG, f"config error ({args.config}): {exc}")
    except UsageError as exc:
        _fail(ExitCode.USAGE, str(exc))
    except (store.DatabaseUnavailable, EmbeddedUnavailable) as exc:
        _fail(ExitCode.DATABASE_UNAVAILABLE, str(exc))
    except store.SchemaOutdated as exc:
        _fail(ExitCode.SCHEMA_OUTDATED, str(exc))
    except store.StoreError as exc:
        _fail(ExitCode.FAILURE, str(exc))
    except psycopg2.errors.UndefinedTable as exc:
        _fail(ExitCode.SCHEMA_OUTDATED, f"database not migrated ({_first_line(exc)}): run `dispatcher migrate`")
    except psycopg2.Error as exc:
        _fail(ExitCode.FAILURE, f"database error: {_first_line(exc)}")
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
