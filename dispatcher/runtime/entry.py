"""Process start-up, written once for every process the product runs.

* :func:`patch_or_exit` -- gevent's monkey-patching and psycogreen, the first
  call of each green entry point (``worker_main``, ``api_main``);
* :func:`run_command` -- the ladder from an exception to a named exit code
  and a one-line message, shared by the CLI, the API server and the demo;
* :func:`check_schema` -- the boot check that the database is reachable and
  migrated, shared by the supervisor and the API server.

``UsageError`` (bad command-line input, exit 2) lives in ``dispatcher.runtime.exitcodes``
beside the codes: see there why it is not in ``dispatcher.cli``.

This module must be importable before the patch: at import time it loads
nothing but ``sys`` and the exit codes.  Everything else is imported inside
the functions that need it, which run after the patch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dispatcher.runtime.exitcodes import ExitCode, UsageError

__all__ = ["check_schema", "exit_code_for", "patch_or_exit", "run_command"]


def patch_or_exit(program: str) -> None:
    """Make this process cooperative: gevent patches ``socket``, ``ssl``,
    ``threading`` and friends, psycogreen makes psycopg2 wait on the hub.

    Call it before any other import of the entry point.  A broken install is a
    boot failure (exit 4), which the supervisor halts on instead of restarting.
    """
    try:
        from gevent import monkey

        monkey.patch_all()

        from psycogreen.gevent import patch_psycopg

        patch_psycopg()
    except Exception as exc:
        print(f"{program}: boot failed: cannot set up gevent: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(ExitCode.WORKER_BOOT_FAILED)


def exit_code_for(exc: BaseException, config_path: str | None = None) -> tuple[ExitCode, str] | None:
    """The exit code and message for an error a command may end with, or None
    for an error nobody expected (a bug: let it show its traceback)."""
    from dispatcher import store
    from dispatcher.config import ConfigError
    from dispatcher.runtime.embedded import EmbeddedUnavailable

    if isinstance(exc, ConfigError):
        return ExitCode.CONFIG, f"config error ({config_path}): {exc}" if config_path else f"config error: {exc}"
    if isinstance(exc, UsageError):
        return ExitCode.USAGE, str(exc)
    if isinstance(exc, store.DatabaseUnavailable | EmbeddedUnavailable):
        return ExitCode.DATABASE_UNAVAILABLE, str(exc)
    if isinstance(exc, store.SchemaOutdated):
        return ExitCode.SCHEMA_OUTDATED, str(exc)
    if isinstance(exc, store.StoreError):
        return ExitCode.FAILURE, str(exc)
    return None


def run_command(command: Callable[[], int], program: str = "dispatcher",
                config_path: str | None = None) -> int:
    """Run ``command`` and return its exit code.  The errors a command may end
    with become one line on stderr and ``SystemExit`` with their named code:
    never a traceback for bad input or a database that is down."""
    try:
        return command()
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:
        known = exit_code_for(exc, config_path)
        if known is None:
            raise
        code, message = known
        print(f"{program}: {(message.strip().splitlines() or [message])[0]}", file=sys.stderr)
        raise SystemExit(int(code)) from None


def check_schema(config_source: str, dsn: str, connect_timeout: float, application_name: str) -> None:
    """Boot check: the database answers and has every migration this code ships."""
    from dispatcher import store

    conn = store.connect(dsn, connect_timeout, application_name)
    try:
        missing = store.pending_migrations(conn)
    finally:
        conn.close()
    if missing:
        raise store.SchemaOutdated(
            f"database schema is missing migration(s) {missing}; run: dispatcher -c {config_source} migrate")
