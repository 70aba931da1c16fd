"""A scenario's database: a fresh clone of one template the benchmark process migrates once."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import harness
from dispatcher import store


def test_scenario_databases_are_migrated_clones_of_one_template(pg_server_dsn: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_PG_DSN", pg_server_dsn)
    with harness.bench_database("clone_first"):
        pass  # the process's template exists from here on (a smoke scenario may have made it already)
    migrated: list[str] = []
    real_migrate = store.migrate

    def counting_migrate(conn: Any, *args: Any, **kwargs: Any) -> list[int]:
        migrated.append(conn.get_dsn_parameters()["dbname"])
        return real_migrate(conn, *args, **kwargs)

    monkeypatch.setattr(store, "migrate", counting_migrate)
    with harness.bench_database("clone_a") as first, harness.bench_database("clone_b") as second:
        for database in (first, second):
            conn = database.connect()
            try:
                assert store.pending_migrations(conn) == []
            finally:
                conn.close()
        first.execute_autocommit("INSERT INTO workspaces (id, secret) VALUES ('only-in-a', 'x')")
        assert first.scalar("SELECT count(*) FROM workspaces WHERE id = 'only-in-a'") == 1
        assert second.scalar("SELECT count(*) FROM workspaces WHERE id = 'only-in-a'") == 0
    assert migrated == [], f"scenario databases were migrated one by one: {migrated}"
