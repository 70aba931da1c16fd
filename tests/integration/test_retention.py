"""Q2 retention: the region's upkeep prunes finished rows by age, in batches."""

from __future__ import annotations

from dispatcher.config import config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace

ROWS = [  # (status, created days ago, expected to survive)
    ("delivered", 8, False), ("delivered", 6, True),
    ("dead", 32, False), ("failed", 32, False), ("dead", 30.5, True), ("dead", 20, True),
    ("pending", 60, True),  # never pruned, whatever its age: it is still owed a delivery
    ("shadow", 8, False), ("shadow", 6, True),  # marked shadow rows: kept as long as delivered ones
]


def test_upkeep_prunes_by_status_and_age_and_never_pending(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    for n, (status, days, _) in enumerate(ROWS):
        query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, "
                      "mode, created_at) VALUES ('ws', %s, %s, 'h', %s, %s, now() - make_interval(secs => %s))",
              (endpoint, f"ev-{n}", status, "shadow" if status == "shadow" else "live", days * 86400))
    for days in (31, 29):
        query(db.dsn, "INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                      "duration_ms, result) VALUES (1, %s, 1, now() - make_interval(secs => %s), 5, 'delivered')",
              (endpoint, days * 86400))
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                  "retention": {"dead": "30d", "delivered": "7d", "attempts": "30d", "batch": 2}},
                                 env={})
    Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd)).run_once()
    survivors = {row[0] for row in query(db.dsn, "SELECT event_id FROM webhook_deliveries")}
    assert survivors == {f"ev-{n}" for n, (_, _, kept) in enumerate(ROWS) if kept}
    assert query(db.dsn, "SELECT round(extract(epoch FROM now() - started_at) / 86400) "
                         "FROM webhook_delivery_attempts") == [(29,)]


def test_upkeep_prunes_bulk_replay_jobs_finished_longer_ago_than_dead_rows_are_kept(db) -> None:
    jobs = [("done", 31, False), ("done", 29, True), ("running", 60, True)]  # (state, finished days ago, kept)
    for n, (state, days, _) in enumerate(jobs):
        query(db.dsn, "INSERT INTO replay_jobs (workspace_id, request_key, fingerprint, since, statuses, state, total,"
                      " replay_units, max_id, created_at, finished_at) VALUES ('ws', %s, 'f', now(), '{dead}', %s,"
                      " 0, 0, 0, now() - make_interval(secs => %s), CASE WHEN %s = 'done'"
                      " THEN now() - make_interval(secs => %s) END)",
              (f"k{n}", state, days * 86400, state, days * 86400))
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                  "retention": {"dead": "30d"}}, env={})
    Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd)).run_once()
    kept = {row[0] for row in query(db.dsn, "SELECT request_key FROM replay_jobs")}
    assert kept == {f"k{n}" for n, (_, _, keep) in enumerate(jobs) if keep}
