"""The rollout gates' evidence in the database (migration 0016): the upkeep leader
keeps a backlog sample every round and the backlog alert's episodes, whichever
process holds the lease.
"""

from __future__ import annotations

from typing import Any

from dispatcher.config import Config, config_from_mapping
from dispatcher.engine.upkeep import GATE_EVIDENCE_KEPT, Upkeep
from dispatcher.metrics import Metrics
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace
from tests.conftest import TestDatabase as Database


def config_for(db: Database) -> Config:
    return config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {"enabled": False},
                                "alerts": {"oldest_pending_age": "10m"}}, env={})


def round_of(db: Database, owner: str = "leader-1") -> None:
    """One upkeep round by ``owner``, which takes the lease first if another process held it."""
    query(db.dsn, "DELETE FROM region_leader WHERE owner <> %s", (owner,))
    config = config_for(db)
    Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd), owner=owner).run_once()


def overdue(db: Database, endpoint: int, seconds: float, event_id: str = "ev-old") -> None:
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, next_attempt_at) "
                  "VALUES ('ws', %s, %s, 'h', now() - make_interval(secs => %s))", (endpoint, event_id, seconds))


def episodes(db: Database) -> list[tuple[Any, ...]]:
    return query(db.dsn, "SELECT alert, cleared_at IS NOT NULL, detail FROM alert_episodes ORDER BY id")


class TestUpkeepRecords:
    def test_every_round_keeps_its_backlog_figures(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
        round_of(db)
        overdue(db, endpoint, 30)
        round_of(db)
        rows = query(db.dsn, "SELECT oldest_age IS NULL, round(oldest_age), overdue_rows, alerting "
                             "FROM backlog_samples ORDER BY taken_at")
        assert [row[0] for row in rows] == [True, False]
        assert rows[1][1:] == (30, 0, False)

    def test_an_alert_is_one_episode_from_firing_to_clearing_across_leaders(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
        overdue(db, endpoint, 700)
        round_of(db)
        round_of(db)
        round_of(db, owner="leader-2")     # the lease passed on while it fired: the same episode
        assert episodes(db) == [("backlog", False, "oldest pending row overdue by 700s (limit 600s)")]
        query(db.dsn, "UPDATE webhook_deliveries SET status = 'delivered'")
        round_of(db, owner="leader-2")
        round_of(db)
        assert [e[:2] for e in episodes(db)] == [("backlog", True)]
        overdue(db, endpoint, 800, "ev-older")
        round_of(db)
        assert [e[:2] for e in episodes(db)] == [("backlog", True), ("backlog", False)]
        assert query(db.dsn, "SELECT alerting FROM backlog_samples ORDER BY taken_at") == [
            (True,), (True,), (True,), (False,), (False,), (True,)]

    def test_old_evidence_is_pruned_but_an_open_episode_stays(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
        overdue(db, endpoint, 700)     # the alert still fires
        old = GATE_EVIDENCE_KEPT + 86400
        query(db.dsn, "INSERT INTO backlog_samples (taken_at, oldest_age, overdue_rows, held_rows, alerting) "
                      "VALUES (now() - make_interval(secs => %s), 1, 0, 0, false), "
                      "(now() - make_interval(secs => %s), 2, 0, 0, false)", (old, GATE_EVIDENCE_KEPT - 86400))
        query(db.dsn, "INSERT INTO alert_episodes (alert, fired_at, cleared_at, detail) VALUES "
                      "('backlog', now() - make_interval(secs => %s), now() - make_interval(secs => %s), 'closed'), "
                      "('backlog', now() - make_interval(secs => %s), NULL, 'open')", (old, old - 60, old))
        round_of(db)
        assert query(db.dsn, "SELECT round(oldest_age) FROM backlog_samples ORDER BY taken_at") == [(2,), (700,)]
        assert [e[1:] for e in episodes(db)] == [(False, "open")]
