"""Logging set-up shared by the supervisor, workers and the API process.

Attempt lines are key=value text, one per attempt, cheap to format.  A log
file that cannot be opened falls back to stderr rather than stopping delivery.
"""

from __future__ import annotations

import logging
import sys

from dispatcher.config import LoggingConfig


def configure_logging(config: LoggingConfig, process_name: str = "dispatcher") -> None:
    handler: logging.Handler
    if config.file == "-":
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            handler = logging.FileHandler(config.file, encoding="utf-8")
        except OSError as exc:
            handler = logging.StreamHandler(sys.stderr)
            print(f"dispatcher: cannot open log file {config.file}: {exc}; logging to stderr", file=sys.stderr)
    # The process name is fixed per process, so it goes into the format once
    # instead of being looked up on every record.
    safe_name = process_name.replace("%", "%%")
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{safe_name}] %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
