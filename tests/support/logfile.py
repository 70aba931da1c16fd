"""A log file a test configured logging to (the unit tier's ``log_file`` fixture)."""

from __future__ import annotations

import logging
from pathlib import Path


class LogFile:
    """The file a test's ``configure_logging`` writes to."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        """Its lines, once every handler has written what it buffers."""
        for handler in logging.getLogger().handlers:
            handler.flush()
        return self.path.read_text().splitlines()

