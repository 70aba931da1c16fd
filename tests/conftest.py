"""Shared fixtures: a real Postgres, a clean database per test.

``DISPATCHER_TEST_DSN`` names the server to use (``.ci/run`` points it at the
local one).  Without it the suite starts the embedded pgserver itself.  Each
test gets its own database, cloned from a migrated template, so tests never
see each other's rows and subprocesses (workers, the API) can connect by DSN.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from hypothesis import settings

from dispatcher import store
from tests.support.engine import query

REPO = Path(__file__).resolve().parent.parent

# Tests never assert on timing, so hypothesis' per-example deadline (a timing
# check) is off; CI replays the same examples every run, so a failure there is
# reproducible rather than a roll of the dice.
settings.register_profile("dispatcher", deadline=None)
settings.register_profile("dispatcher-ci", deadline=None, derandomize=True)
settings.load_profile("dispatcher-ci" if os.environ.get("CI") else "dispatcher")
_counter = itertools.count()


def _with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg2.extensions.parse_dsn(dsn)
    params["dbname"] = dbname
    return psycopg2.extensions.make_dsn(**params)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    dsn = os.environ.get("DISPATCHER_TEST_DSN")
    if dsn:
        yield dsn
        return
    from dispatcher.embedded import start_embedded

    data_dir = Path(os.environ.get("DISPATCHER_TEST_PGDATA", REPO / ".dispatcher" / "test-pgdata"))
    yield start_embedded(data_dir)


def _admin(dsn: str) -> psycopg2.extensions.connection:
    try:
        conn = psycopg2.connect(dsn, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(f"test Postgres unreachable at {dsn!r}: {exc}", pytrace=False)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="session")
def template_db(pg_server_dsn: str) -> Iterator[str]:
    name = f"dispatcher_tmpl_{os.getpid()}"
    admin = _admin(pg_server_dsn)
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn = psycopg2.connect(_with_dbname(pg_server_dsn, name))
    store.migrate(conn)
    conn.close()
    yield name
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@dataclass(frozen=True)
class TestDatabase:
    dsn: str
    name: str

    def connect(self) -> psycopg2.extensions.connection:
        return psycopg2.connect(self.dsn)

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return query(self.dsn, sql, params)


@contextmanager
def _scratch_database(server_dsn: str, prefix: str, template: str | None = None) -> Iterator[TestDatabase]:
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    clone = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""
    admin = _admin(server_dsn)
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"{clone}')
    try:
        yield TestDatabase(_with_dbname(server_dsn, name), name)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def db(pg_server_dsn: str, template_db: str) -> Iterator[TestDatabase]:
    """A fresh, migrated database for this test only."""
    with _scratch_database(pg_server_dsn, "dispatcher_t", template_db) as database:
        yield database


@pytest.fixture
def empty_db(pg_server_dsn: str) -> Iterator[TestDatabase]:
    """A fresh database with no schema at all (for migration tests)."""
    with _scratch_database(pg_server_dsn, "dispatcher_e") as database:
        yield database


@pytest.fixture
def write_config(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a YAML config for a test database; returns its path."""
    import yaml

    def write(db: TestDatabase, **overrides: Any) -> Path:
        raw: dict[str, Any] = {
            "region": "test",
            "database": {"dsn": db.dsn},
            "http": {"require_https": False, "allow_private_networks": True, "timeout": "2s"},
            "workers": {"processes": 1, "poll_interval": "100ms", "lease": "10s", "heartbeat_interval": "200ms"},
            "statsd": {"enabled": False},
            "logging": {"level": "INFO"},
        }
        for dotted, value in overrides.items():
            section, _, key = dotted.partition("__")
            if key:
                raw.setdefault(section, {})[key] = value
            elif isinstance(value, dict) and isinstance(raw.get(section), dict):
                raw[section] = {**raw[section], **value}
            else:
                raw[section] = value
        path = tmp_path / f"config-{next(_counter)}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    return write


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dispatcher-tests-") as path:
        yield Path(path)
