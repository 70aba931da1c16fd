"""Shared fixtures: a real Postgres, a clean database per test.

``DISPATCHER_TEST_DSN`` names the server to use (``.ci/run`` points it at the
local one).  Without it the suite starts the embedded pgserver itself.  Each
test gets its own database, cloned from a migrated template, so tests never
see each other's rows and subprocesses (workers, the API) can connect by DSN.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from hypothesis import settings

from dispatcher_devtools.kit import Database, ServerUnreachable, config_for_test, scratch_database
from dispatcher_devtools.kit import write_config as write_yaml
from tests.support.embedded import stop

REPO = Path(__file__).resolve().parent.parent

# Tests never assert on timing, so hypothesis' per-example deadline (a timing
# check) is off; CI replays the same examples every run, so a failure there is
# reproducible rather than a roll of the dice.
settings.register_profile("dispatcher", deadline=None)
settings.register_profile("dispatcher-ci", deadline=None, derandomize=True)
settings.load_profile("dispatcher-ci" if os.environ.get("CI") else "dispatcher")
_counter = itertools.count()

#: The name tests import the per-test database type by.
TestDatabase = Database


def _embedded_data_dir() -> Path:
    return Path(os.environ.get("DISPATCHER_TEST_PGDATA", REPO / ".dispatcher" / "test-pgdata")).resolve()


_EMBEDDED_WAS_RUNNING = pytest.StashKey[bool]()


def _owns_the_embedded_server(config: pytest.Config) -> bool:
    """The run (not an xdist worker) that may start the embedded server: no DISPATCHER_TEST_DSN."""
    return not os.environ.get("DISPATCHER_TEST_DSN") and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _owns_the_embedded_server(session.config):
        from dispatcher.runtime.embedded import server_pid

        session.config.stash[_EMBEDDED_WAS_RUNNING] = server_pid(_embedded_data_dir()) is not None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the embedded server if this run started it (its xdist workers share it, and end first); one that
    was running before the run was someone else's and keeps running."""
    if _owns_the_embedded_server(session.config) and not session.config.stash.get(_EMBEDDED_WAS_RUNNING, True):
        from dispatcher.runtime.embedded import stop_embedded

        with FileLock(_embedded_data_dir().parent / f"{_embedded_data_dir().name}.start.lock"):
            stop_embedded(_embedded_data_dir())


@pytest.fixture(scope="session")
def pg_server_dsn() -> str:
    """The test server's DSN: ``DISPATCHER_TEST_DSN``, else the embedded server's.

    pytest-xdist runs one session per worker, so several may ask at once: a file
    lock beside the data directory lets the first start (or initialise) the one
    shared server and the others reuse it; the run that started it stops it at
    its end (``pytest_sessionfinish``).
    """
    dsn = os.environ.get("DISPATCHER_TEST_DSN")
    if dsn:
        return dsn
    from dispatcher.runtime.embedded import start_embedded

    data_dir = _embedded_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(data_dir.parent / f"{data_dir.name}.start.lock"):
        return start_embedded(data_dir)


@contextmanager
def _scratch_database(server_dsn: str, name: str, **options: Any) -> Iterator[Database]:
    """The kit's scratch database; an unreachable server fails the test in one line."""
    try:
        with scratch_database(server_dsn, name, **options) as database:
            yield database
    except ServerUnreachable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def template_db(pg_server_dsn: str) -> Iterator[str]:
    name = f"dispatcher_tmpl_{os.getpid()}"
    with _scratch_database(pg_server_dsn, name, replace=True, migrate=True):
        yield name


@pytest.fixture
def db(pg_server_dsn: str, template_db: str) -> Iterator[TestDatabase]:
    """A fresh, migrated database for this test only."""
    with _scratch_database(pg_server_dsn, f"dispatcher_t_{os.getpid()}_{next(_counter)}",
                           template=template_db) as database:
        yield database


@pytest.fixture
def empty_db(pg_server_dsn: str) -> Iterator[TestDatabase]:
    """A fresh database with no schema at all (for migration tests)."""
    with _scratch_database(pg_server_dsn, f"dispatcher_e_{os.getpid()}_{next(_counter)}") as database:
        yield database


@pytest.fixture
def write_config(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a YAML config for a test database; returns its path."""

    def write(db: TestDatabase, **overrides: Any) -> Path:
        return write_yaml(tmp_path / f"config-{next(_counter)}.yaml", config_for_test(db.dsn, **overrides))

    return write


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dispatcher-tests-") as path:
        yield Path(path)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A throwaway embedded (pgserver) data directory, stopped and removed afterwards."""
    pytest.importorskip("pgserver", reason="the embedded extra (pgserver) is not installed")
    # Not under pytest's tmp_path: run as root, pgserver runs Postgres as its own
    # user and opens up the directory's parents, while pytest resets its base
    # directory to 0700 whenever a pytest session starts (another session, say).
    parent = Path(tempfile.mkdtemp(prefix="dispatcher-embedded-"))
    path = parent / "pgdata"
    try:
        yield path
    finally:
        stop(path)
        shutil.rmtree(parent, ignore_errors=True)


