"""``dispatcher -c CONFIG api``: replace the CLI process with the gevent server.

gevent must monkey-patch before anything imports ``socket``, ``ssl`` or
``threading``, and the CLI has already imported plenty.  So the command does
not serve from this process: it ``exec``s a fresh interpreter running
``dispatcher.runtime.api_main``, whose first statements patch.  ``exec`` (not a
child process) keeps the pid, so the caller's SIGTERM reaches the server.
"""

from __future__ import annotations

import os
import sys

from dispatcher.config import Config


def serve_argv(config: Config) -> list[str]:
    return [sys.executable, "-m", "dispatcher.runtime.api_main", "-c", config.source]


def exec_api(config: Config) -> int:
    """Never returns on success; the exec'd server's exit status is the command's."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = serve_argv(config)
    os.execv(argv[0], argv)
    return 1  # unreachable: execv either replaces the process or raises OSError
