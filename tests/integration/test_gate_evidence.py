"""The rollout gates' evidence in the database (migration 0016, dispatcher/sql/rollout.sql).

The upkeep leader keeps a backlog sample every round and the backlog alert's
episodes, whichever process holds the lease; the gates' queries read them,
the shadow rows, the phase 1 workspaces and the alert counts back, with the
window's edges where docs/rollout.md puts them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dispatcher import store
from dispatcher.config import Config, config_from_mapping
from dispatcher.engine.upkeep import GATE_EVIDENCE_KEPT, Upkeep
from dispatcher.metrics import Metrics
from dispatcher.rules.gates import Window
from dispatcher.store import rollout as rollout_store
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import query, seed_workspace
from tests.conftest import TestDatabase as Database

GAP = timedelta(seconds=120)


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


def db_now(db: Database) -> Any:
    return query(db.dsn, "SELECT now()")[0][0]


class TestUpkeepRecords:
    def test_every_round_keeps_its_backlog_figures(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
        round_of(db)
        overdue(db, endpoint, 30)
        round_of(db)
        rows = query(db.dsn, "SELECT oldest_age, overdue_rows, held_rows, alerting FROM backlog_samples "
                             "ORDER BY taken_at")
        assert rows[0] == (None, 0, 0, False)
        assert rows[1][0] >= 30 and rows[1][1:] == (0, 0, False)   # the row waited 30 s when seeded

    def test_an_alert_is_one_episode_from_firing_to_clearing_across_leaders(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
        overdue(db, endpoint, 700)
        round_of(db)
        round_of(db)
        round_of(db, owner="leader-2")     # the lease passed on while it fired: the same episode
        (episode,) = episodes(db)
        assert episode[:2] == ("backlog", False)
        assert episode[2].startswith("oldest pending row overdue by ") and episode[2].endswith("(limit 600s)")
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
        ages = [row[0] for row in query(db.dsn, "SELECT oldest_age FROM backlog_samples ORDER BY taken_at")]
        assert ages[0] == 2.0 and ages[1] >= 700 and len(ages) == 2
        assert [e[1:] for e in episodes(db)] == [(False, "open")]


class TestGateQueries:
    def test_samples_read_back_in_the_window(self, db: Database) -> None:
        for _ in range(3):
            round_of(db)
        now = db_now(db)
        conn = store.connect(db.dsn)
        try:
            found = rollout_store.backlog_samples(conn, Window(now - timedelta(hours=1), now), GAP)
            none = rollout_store.backlog_samples(conn, Window(now - timedelta(hours=2), now - timedelta(hours=1)),
                                                 GAP)
        finally:
            conn.close()
        assert (len(found.times), found.ages, found.max_gap) == (3, (0.0, 0.0, 0.0), GAP)
        assert none.times == ()

    def test_alert_counts_at_the_window_edges(self, db: Database) -> None:
        now = db_now(db)
        window = Window(now - timedelta(days=7), now)
        fired = [window.since - timedelta(days=7),                # the first instant of the week before
                 window.since - timedelta(days=7, microseconds=1),  # before it: not counted
                 window.since - timedelta(microseconds=1),        # before
                 window.since,                                    # in the window
                 window.until - timedelta(microseconds=1),        # in the window
                 window.until]                                    # after it: not counted
        for when in fired:
            query(db.dsn, "INSERT INTO alert_episodes (alert, fired_at, cleared_at, detail) "
                          "VALUES ('backlog', %s, %s, 'x')", (when, when))
        conn = store.connect(db.dsn)
        try:
            counts = rollout_store.alert_counts(conn, window)
        finally:
            conn.close()
        assert (counts.in_window, counts.before) == (2, 2)

    def test_shadow_rows_by_hour_of_the_window(self, db: Database) -> None:
        (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"], outbox=False)
        now = db_now(db)
        window = Window(now - timedelta(hours=3), now)
        rows = [  # (created, seconds to its mark or None: not marked yet)
            (window.since - timedelta(seconds=1), 50.0),          # before the window: not read
            (window.since, 1.0),                                  # hour 0
            (window.since + timedelta(minutes=59, seconds=59), 2.0),   # hour 0
            (window.since + timedelta(hours=2), None),            # hour 2, unmarked: its age so far
        ]
        for n, (created, wait) in enumerate(rows):
            query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, "
                          "status, created_at, finished_at) VALUES ('ws', %s, %s, 'h', 'shadow', %s, %s, "
                          "%s::timestamptz + make_interval(secs => %s))",
                  (endpoint, f"s{n}", "pending" if wait is None else "shadow", created, created, wait))
        conn = store.connect(db.dsn)
        try:
            found = rollout_store.shadow_rows(conn, window)
        finally:
            conn.close()
        assert (found.rows, found.unmarked, found.hours) == (3, 1, frozenset({0, 2}))
        assert found.longest_wait == pytest.approx(3600, abs=60)

    def test_phase1_workspaces_by_the_path_their_events_took(self, db: Database) -> None:
        (on,) = seed_workspace(db.dsn, "ws-on", ["http://127.0.0.1:9/a"], outbox=True)
        (off,) = seed_workspace(db.dsn, "ws-off", ["http://127.0.0.1:9/b"], outbox=False)
        now = db_now(db)
        window = Window(now - timedelta(days=7), now)
        events = [("ws-on", on, "e1", "live", 1), ("ws-on", on, "e2", "shadow", 2), ("ws-on", on, "e3", "live", 8),
                  ("ws-off", off, "f1", "shadow", 3)]
        for ws, endpoint, event_id, mode, days in events:
            created = now - timedelta(days=days)
            query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload, created_at) "
                          "VALUES (%s, %s, 'job.created', nextval('event_sequence'), '{}', %s)",
                  (event_id, ws, created))
            query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, mode, "
                          "created_at, event_day) SELECT %s, %s, id, 'h', %s, %s, day FROM events "
                          "WHERE workspace_id = %s AND id = %s", (ws, endpoint, mode, created, ws, event_id))
        conn = store.connect(db.dsn)
        try:
            runs = {run.workspace_id: run for run in rollout_store.workspace_runs(conn, window, ["ws-on", "ws-off"])}
            lost = rollout_store.lost_events(conn, window, ["ws-on", "ws-off"], ["f1"])
            with pytest.raises(store.NotFound, match="nope"):
                rollout_store.workspace_runs(conn, window, ["ws-on", "nope"])
        finally:
            conn.close()
        assert (runs["ws-on"].on_outbox, runs["ws-on"].outbox_events, runs["ws-on"].synchronous_events) == (
            True, 1, 1)
        assert runs["ws-on"].last_synchronous == now - timedelta(days=2)
        assert (runs["ws-off"].on_outbox, runs["ws-off"].outbox_events, runs["ws-off"].synchronous_events) == (
            False, 0, 1)
        assert [(e.event_id, e.statuses) for e in lost] == [("e1", ("pending",))]

    def test_rollout_state_counts_the_workspaces_kept_off(self, db: Database) -> None:
        seed_workspace(db.dsn, "ws-a", [], outbox=False)
        seed_workspace(db.dsn, "ws-b", [])
        query(db.dsn, "UPDATE workspaces SET flags = '{}' WHERE id = 'ws-b'")
        query(db.dsn, "UPDATE rollout_settings SET percent = 100")
        conn = store.connect(db.dsn)
        try:
            state = rollout_store.rollout_state(conn)
        finally:
            conn.close()
        assert (state.percent, state.workspaces_off) == (100, 1)
