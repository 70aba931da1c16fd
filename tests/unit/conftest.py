"""The unit tier: pure code, no database.

A unit test that asks for a database (``db``, ``empty_db``, the server's DSN)
fails at once instead of starting the embedded server: it belongs in
``tests/integration`` or ``tests/e2e``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.config import LoggingConfig
from dispatcher.runtime.logsetup import configure_logging
from tests.support.logfile import LogFile


@pytest.fixture(scope="session")
def pg_server_dsn() -> str:
    pytest.fail("a unit test asked for a database: move it to tests/integration or tests/e2e", pytrace=False)


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[LogFile]:
    """Logging configured as a process of the product's does (``configure_logging``, INFO, process
    "api"), into a file of the test's; the root's handlers and the levels are put back after."""
    root, ours = logging.getLogger(), logging.getLogger("dispatcher")
    saved = root.handlers[:], root.level, ours.level
    path = tmp_path / "dispatcher.log"
    configure_logging(LoggingConfig(level="INFO", file=str(path)), "api")
    try:
        yield LogFile(path)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], level, our_level = saved
        root.setLevel(level)
        ours.setLevel(our_level)
