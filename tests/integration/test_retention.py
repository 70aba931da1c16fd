"""Q2 retention: the region's upkeep prunes finished rows by age, in batches -- the rows the DEFAULT
partitions caught (day partitions go whole: tests/integration/test_partition_upkeep.py)."""

from __future__ import annotations

from dispatcher.config import config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.rules.partitions import first_id
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace

ROWS = [  # (status, created days ago, expected to survive)
    ("delivered", 8, False), ("delivered", 6, True),
    ("dead", 32, False), ("failed", 32, False), ("dead", 30.5, True), ("dead", 20, True),
    ("pending", 60, True),  # never pruned, whatever its age: it is still owed a delivery
    ("shadow", 8, False), ("shadow", 6, True),  # marked shadow rows: kept as long as delivered ones
]


def test_upkeep_prunes_the_default_partitions_by_status_and_age_and_never_pending(db) -> None:
    """Q2's row rules, for the rows the DEFAULT partitions caught: ids of a day that has no partition."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    stray = query(db.dsn, "SELECT dispatcher_today() - 60")[0][0]
    for n, (status, days, _) in enumerate(ROWS):
        query(db.dsn, "INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                      "status, mode, created_at, event_day) VALUES (%s, 'ws', %s, %s, 'h', %s, %s, "
                      "now() - make_interval(secs => %s), %s)",
              (first_id(stray) + n, endpoint, f"ev-{n}", status, "shadow" if status == "shadow" else "live",
               days * 86400, stray))
    for n, days in enumerate((31, 29)):
        query(db.dsn, "INSERT INTO webhook_delivery_attempts (id, delivery_id, endpoint_id, attempt, started_at, "
                      "duration_ms, result) VALUES (%s, 1, %s, 1, now() - make_interval(secs => %s), 5, "
                      "'delivered')", (first_id(stray) + n, endpoint, days * 86400))
    for n, (days, referred) in enumerate([(91, False), (91, True), (89, False)]):
        query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at, day) VALUES "
                      "(%s, 'ws', 't', %s, '{}', now() - make_interval(secs => %s), %s)",
              (f"ev-{n}" if referred else f"gone-{n}", n, days * 86400, stray))
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                  "retention": {"dead": "30d", "delivered": "7d", "attempts": "30d",
                                                "events": "90d", "batch": 2}}, env={})
    Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd)).run_once()
    survivors = {row[0] for row in query(db.dsn, "SELECT event_id FROM webhook_deliveries_default")}
    assert survivors == {f"ev-{n}" for n, (_, _, kept) in enumerate(ROWS) if kept}
    assert query(db.dsn, "SELECT round(extract(epoch FROM now() - started_at) / 86400) "
                         "FROM webhook_delivery_attempts_default") == [(29,)]
    assert sorted(row[0] for row in query(db.dsn, "SELECT id FROM events_default")) == ["ev-1", "gone-2"]


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
