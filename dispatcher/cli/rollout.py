"""``dispatcher -c CFG rollout ...`` and ``workspace flag``: the rollout controls (docs/rollout.md).

* ``status``: the percentage, the explicit lists, how many workspaces are on
  the outbox and why, and the rows still draining;
* ``set --percent P``: a workspace is in when ``rollout_bucket(id) < P``
  (dispatcher/rules/rollout.py), so raising P only ever adds workspaces;
* ``include W...`` / ``exclude W...`` / ``unlist W...``: the explicit lists;
* ``workspace flag --id W webhook_outbox=on|off|default``: the per-workspace
  override (``default`` removes it); an unknown id fails, nothing is created;
* ``rank --log FILE``: endpoints by legacy failure rate, read from the
  synchronous path's log lines (phase 0 input to the phase 2 invitations).

Turning a workspace off or lowering the percentage never touches rows already
queued: the dispatcher drains pending rows whatever the flag says.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dispatcher import store
from dispatcher.config import Config
from dispatcher.runtime.embedded import resolve_dsn
from dispatcher.runtime.exitcodes import ExitCode, UsageError
from dispatcher.store import rollout as rollout_store

_LEGACY_LINE = "legacy webhook "
_FIELD = re.compile(r"(\w+)=([^\s\"',]+)")


def add_parsers(commands: Any) -> None:
    """Register ``rollout`` on the CLI's subparsers."""
    rollout = commands.add_parser("rollout", help="percentage rollout, include/exclude lists, legacy ranking")
    actions = rollout.add_subparsers(dest="action", required=True)
    status = actions.add_parser("status", help="percent, counts, the listed workspaces, rows draining")
    status.add_argument("--json", action="store_true")
    percent = actions.add_parser("set", help="set the rollout percentage")
    percent.add_argument("--percent", required=True, help="0..100")
    for name, text in (("include", "always on (unless the workspace flag says off)"),
                       ("exclude", "always off (unless the workspace flag says on)"),
                       ("unlist", "take workspaces off both lists")):
        listing = actions.add_parser(name, help=text)
        listing.add_argument("workspaces", nargs="+", metavar="WORKSPACE")
    rank = actions.add_parser("rank", help="endpoints by legacy (flag off) failure rate, from the producer log")
    rank.add_argument("--log", required=True, type=Path, action="append", help="log file (repeatable)")
    rank.add_argument("--top", type=int, default=23, help="how many to list (default: %(default)s)")
    rank.add_argument("--min-posts", type=int, default=1, help="ignore endpoints with fewer POSTs")
    rank.add_argument("--json", action="store_true")
    workspace = actions.add_parser("workspace", help="one workspace's override").add_subparsers(
        dest="workspace_action", required=True)
    add_flag_parser(workspace)


def add_flag_parser(actions: Any) -> None:
    """``flag --id W webhook_outbox=on|off|default`` (also registered under ``workspace``)."""
    flag = actions.add_parser("flag", help="set one workspace's webhook_outbox override (fails on an unknown id)")
    flag.add_argument("--id", required=True)
    flag.add_argument("setting", metavar="webhook_outbox=on|off|default")


def _usage(message: str) -> Exception:
    return UsageError(message)


def _connect(config: Config) -> store.Connection:
    return store.connect(resolve_dsn(config.database), config.database.connect_timeout, "dispatcher-rollout")


def cmd_rollout(config: Config, args: argparse.Namespace) -> int:
    if args.action == "rank":
        return _rank(args)
    if args.action == "workspace":
        return cmd_flag(config, args)
    if args.action == "set":
        percent = _percent(args.percent)
        rollout_store.set_percent(_connect(config), percent)
        print(f"rollout percent set to {percent}")
    elif args.action in ("include", "exclude", "unlist"):
        listed = None if args.action == "unlist" else args.action
        rollout_store.set_list(_connect(config), args.workspaces, listed)
        print(f"{args.action}d: {', '.join(args.workspaces)}")
    else:
        _print_status(rollout_store.status(_connect(config)), args.json)
    return ExitCode.OK


def _percent(text: str) -> int:
    try:
        percent = int(text)
    except ValueError:
        raise _usage(f"--percent must be a whole number 0..100, got {text!r}") from None
    if not 0 <= percent <= 100:
        raise _usage(f"--percent must be within 0..100, got {percent}")
    return percent


def cmd_flag(config: Config, args: argparse.Namespace) -> int:
    name, sep, value = args.setting.partition("=")
    if name != "webhook_outbox" or not sep or value not in ("on", "off", "default"):
        raise _usage(f"{args.setting!r} is not webhook_outbox=on|off|default")
    conn = _connect(config)
    if value == "default":
        rollout_store.clear_outbox_flag(conn, args.id)
    else:
        store.set_workspace_flags(conn, args.id, {"webhook_outbox": value == "on"})  # NotFound if unknown
    print(f"workspace {args.id}: webhook_outbox={value}")
    return ExitCode.OK


def _print_status(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(status, default=str, sort_keys=True))
        return
    counts = status["counts"]
    print(f"percent: {status['percent']} (set {status['updated_at']:%Y-%m-%d %H:%M:%S %Z})")
    print(f"workspaces: {counts['workspaces']}, outbox on: {counts['outbox_on']} "
          f"(flag on {counts['flag_on']}, flag off {counts['flag_off']}, "
          f"included {counts['included']}, excluded {counts['excluded']})")
    for listed in ("include", "exclude"):
        names = [row["workspace_id"] for row in status["listed"] if row["list"] == listed]
        print(f"{listed}: {', '.join(names) if names else '-'}")
    pending = status["pending"]
    print(f"pending rows: live {pending.get('live', 0)}, shadow {pending.get('shadow', 0)}")


@dataclass(frozen=True)
class Ranked:
    workspace_id: str
    endpoint_id: str
    posts: int
    failures: int
    failure_rate: float


def rank_lines(lines: Iterable[str], min_posts: int = 1) -> list[Ranked]:
    """Endpoints by legacy failure rate (non-2xx or error class), worst first."""
    tally: dict[tuple[str, str], list[int]] = {}
    for line in lines:
        at = line.find(_LEGACY_LINE)
        if at < 0:
            continue
        fields = dict(_FIELD.findall(line[at:]))
        if not {"workspace_id", "endpoint_id", "status"} <= fields.keys():
            continue
        counts = tally.setdefault((fields["workspace_id"], fields["endpoint_id"]), [0, 0])
        counts[0] += 1
        counts[1] += not re.fullmatch(r"2\d\d", fields["status"])
    ranked = [Ranked(ws, ep, posts, failures, round(failures / posts, 4))
              for (ws, ep), (posts, failures) in tally.items() if posts >= min_posts]
    return sorted(ranked, key=lambda r: (-r.failure_rate, -r.failures, r.workspace_id, r.endpoint_id))


def _rank(args: argparse.Namespace) -> int:
    lines: list[str] = []
    for path in args.log:
        try:
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
        except OSError as exc:
            raise _usage(f"cannot read --log {path}: {exc.strerror or exc}") from None
    ranked = rank_lines(lines, args.min_posts)[: max(args.top, 0)]
    if args.json:
        print(json.dumps([asdict(r) for r in ranked]))
        return ExitCode.OK
    print(f"{'workspace':<24} {'endpoint':>9} {'posts':>8} {'failed':>8} {'rate':>7}")
    for r in ranked:
        print(f"{r.workspace_id:<24} {r.endpoint_id:>9} {r.posts:>8} {r.failures:>8} {r.failure_rate:>7.2%}")
    if not ranked:
        print("no legacy webhook lines found", file=sys.stderr)
    return ExitCode.OK
