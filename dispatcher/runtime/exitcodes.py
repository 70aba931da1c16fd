"""Named process exit codes, shared by the CLI, the supervisor and workers."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1                 # a command failed (e.g. a row it names does not exist)
    USAGE = 2                   # bad command-line input
    CONFIG = 2                  # bad configuration: same family as usage, per the CLI contract
    DATABASE_UNAVAILABLE = 3    # could not reach the database at boot
    INCOMPLETE = 3              # a rollout gate lacks evidence to judge (an unreachable database is one case)
    WORKER_BOOT_FAILED = 4      # a worker could not boot; the supervisor halts instead of looping
    WORKER_FAILED = 5           # a worker died of an unexpected error after booting
    SCHEMA_OUTDATED = 6         # the database is reachable but not migrated
    INTERRUPTED = 130           # SIGINT at the terminal


class UsageError(Exception):
    """Bad command-line input; exits with ExitCode.USAGE.

    Defined here, not in ``dispatcher.cli``: under ``python -m dispatcher.cli``
    that module runs as ``__main__``, and a command module importing
    ``dispatcher.cli.UsageError`` would raise a class ``main`` does not catch.
    """
