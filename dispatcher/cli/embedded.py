"""``dispatcher embedded status|stop|reset``: the local embedded Postgres (``database.dsn: embedded``).

The server is started on demand and left running so the next command reuses it
(``dispatcher/runtime/embedded.py``); these verbs are how a user sees it, stops
it, or starts over with an empty database.  They act on
``database.embedded_dir`` and never start the server themselves.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dispatcher.config import EMBEDDED, Config
from dispatcher.runtime.embedded import reset_embedded, server_pid, stop_embedded
from dispatcher.runtime.exitcodes import ExitCode, UsageError


def add_parser(commands: Any) -> None:
    embedded = commands.add_parser("embedded", help="the local embedded Postgres: status, stop, reset")
    actions = embedded.add_subparsers(dest="action", required=True)
    actions.add_parser("status", help="is it running, on which data directory (exit 0 running, 1 stopped)")
    actions.add_parser("stop", help="stop it (the next command that needs it starts it again)")
    reset = actions.add_parser("reset", help="stop it and delete its data: the next start is an empty database")
    reset.add_argument("--yes", action="store_true", help="really delete every row of the embedded database")


def cmd_embedded(config: Config, args: argparse.Namespace) -> int:
    data_dir = Path(config.database.embedded_dir).resolve()
    note = "" if config.database.dsn == EMBEDDED else " (database.dsn is not 'embedded': this config does not use it)"
    if args.action == "status":
        pid = server_pid(data_dir)
        state = f"running (pid {pid})" if pid is not None else "stopped"
        print(f"embedded Postgres in {data_dir}: {state}{note}")
        return ExitCode.OK if pid is not None else ExitCode.FAILURE
    if args.action == "stop":
        stopped = stop_embedded(data_dir)
        print(f"embedded Postgres in {data_dir}: {'stopped' if stopped else 'was not running'}{note}")
        return ExitCode.OK
    if not args.yes:
        raise UsageError(f"embedded reset deletes every row of the embedded database in {data_dir}: add --yes")
    removed = reset_embedded(data_dir)
    print(f"embedded Postgres in {data_dir}: {'stopped and deleted' if removed else 'nothing to delete'}; "
          f"the next command starts an empty one{note}")
    return ExitCode.OK
