"""A scenario's database: a fresh clone of one template the benchmark process migrates once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness, load
from dispatcher import store
from dispatcher_devtools.kit import config_for_test, produce, seed_endpoints, wait_until, write_config


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


def test_backlog_samplers_count_every_endpoint_but_the_faulty(pg_server_dsn: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_PG_DSN", pg_server_dsn)
    with harness.bench_database("samplers") as db:
        healthy, faulty = seed_endpoints(db.connect(), [["https://healthy.example/hook"],
                                                        ["https://faulty.example/hook"]])
        config = write_config(tmp_path / "config.yaml", config_for_test(db.dsn))
        produce(config, db.dsn, "ws0", 3)
        produce(config, db.dsn, "ws1", 5)
        # The faulty endpoint's rows are the older due ones: a sampler that counted them would report their age.
        db.execute_autocommit("UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 hour' "
                              f"WHERE endpoint_id = {faulty[0]}")
        db.execute_autocommit("UPDATE webhook_deliveries SET next_attempt_at = now() - interval '10 seconds' "
                              f"WHERE endpoint_id = {healthy[0]}")
        ages: list[float] = []
        stop = threading.Event()
        sampler = threading.Thread(target=load.sample_backlog, args=(db, faulty, ages, stop, 0.05))
        sampler.start()
        wait_until(lambda: len(ages) >= 2, timeout=10.0, interval=0.05)
        stop.set()
        sampler.join(5)
        assert all(5.0 < age < 1800.0 for age in ages), ages
        assert not load.wait_delivered(db, faulty, 1, timeout=0.1)
        db.execute_autocommit(f"UPDATE webhook_deliveries SET status = 'delivered' WHERE endpoint_id = {faulty[0]}")
        assert not load.wait_delivered(db, faulty, 1, timeout=0.1), "the faulty endpoint's rows were counted"
        db.execute_autocommit(f"UPDATE webhook_deliveries SET status = 'delivered' WHERE endpoint_id = {healthy[0]}")
        assert load.wait_delivered(db, faulty, 3, timeout=5.0)
        assert not load.wait_delivered(db, faulty, 4, timeout=0.1)
