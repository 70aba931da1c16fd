"""The online migration to the partitioned outbox (issue 25, docs/operations.md), under load.

A region on the previous version: its schema at migration 0024, its dispatcher (the
previous commit's code, which boots only on the schema it ships) draining, and a
producer committing one event at a time throughout.  This version's ``dispatcher
migrate`` then runs in the documented steps -- 0025 (prepare), 0026 (validate), then
the rest (the swap, 0027, re-run when it reports its lock timeout) -- while both go on;
this version's dispatcher is started and the previous one stopped (the rollout); the
producer goes on a while, stops, and the outbox drains.

Every step waits on what it can observe (events committed, rows delivered); nothing
sleeps a fixed time and nothing asserts timing.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import psycopg2
import pytest

from dispatcher import store
from dispatcher.rules.partitions import day_of_id, first_id
from dispatcher_devtools.kit import (
    REPO,
    SECRET,
    Dispatcher,
    SteadyProducer,
    query,
    seed_workspace,
    wait_until,
)
from dispatcher_devtools.kit.versions import RevisionUnavailable, export_revision, has_history
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(300)

# main when issue 25 began: its migrations stop at 0024.  Any commit of that schema would do.
PREVIOUS_VERSION = "5e0009033437cfddf0d840187f135b516ccfd3f0"
LAST_LEGACY_MIGRATION = 24
LEGACY_LIMIT = first_id(date(2020, 1, 2))  # 2^38: every id below it is a legacy sequence value
ENDPOINTS = 3
# Events committed in each phase before the next step: enough that every phase has rows
# pending and delivered, few enough for a shared 2-core machine.
PER_PHASE = 40
# 0027 fails fast (SET LOCAL lock_timeout) rather than queue producers behind it; the
# procedure is to run `dispatcher migrate` again.
SWAP_ATTEMPTS = 20


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx


@pytest.fixture
def previous_version(tmp_path: Path) -> Path:
    if not has_history(REPO):
        pytest.skip("not a git checkout: the previous version's dispatcher cannot be extracted")
    try:
        tree = export_revision(REPO, PREVIOUS_VERSION, tmp_path / "previous")
    except RevisionUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    shipped = sorted(path.name for path in (tree / "dispatcher" / "sql" / "migrations").glob("*.sql"))
    assert shipped[-1].startswith(f"{LAST_LEGACY_MIGRATION:04d}_"), shipped[-1]
    return tree


def migrate_cli(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """This version's ``bin/dispatcher -c CONFIG migrate [extra]``."""
    return subprocess.run([sys.executable, str(REPO / "bin" / "dispatcher"), "-c", str(config), "migrate", *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


def migrate_until_done(config: Path) -> list[str]:
    """``dispatcher migrate`` until it succeeds, re-run only when the swap gave up on its locks (its
    lock_timeout, or chosen as a deadlock's victim: nothing of it applied either way)."""
    outputs = []
    for _ in range(SWAP_ATTEMPTS):
        done = migrate_cli(config)
        outputs.append(done.stdout + done.stderr)
        if done.returncode == 0:
            return outputs
        assert "lock" in outputs[-1].lower(), f"migrate failed for another reason than its lock timeout: {outputs}"
    pytest.fail(f"the swap timed out on its locks {SWAP_ATTEMPTS} times: {outputs}")


def committed_after(producer: SteadyProducer, count: int) -> None:
    """Wait until ``count`` more events are committed than now (or a send failed: the test fails then)."""
    target = len(producer.committed) + count
    wait_until(lambda: len(producer.committed) >= target or producer.failures, timeout=60,
               message=f"{count} more events committed")


class Phases:
    """Where the producer was at each step: events committed and sends failed so far."""

    def __init__(self, producer: SteadyProducer) -> None:
        self._producer = producer
        self.committed: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    def mark(self, name: str) -> None:
        self.committed[name] = len(self._producer.committed)
        self.failed[name] = len(self._producer.failures)

    def check(self) -> None:
        """No send failed (the failures so far at each step say when one did)."""
        assert self._producer.failures == [], (self._producer.failures, self.failed)


def rows_by_table(dsn: str, table: str) -> dict[int, str]:
    """{id: partition holding it} of ``table``."""
    return {int(i): str(part) for i, part in query(dsn, f"SELECT id, tableoid::regclass::text FROM {table}")}


def test_the_outbox_is_partitioned_online_while_producers_write_and_workers_drain(
        empty_db, write_config, tmp_path: Path, receiver: ReceiverProcess, previous_version: Path) -> None:
    dsn = empty_db.dsn
    conn = psycopg2.connect(dsn)
    try:
        assert store.migrate(conn, up_to=LAST_LEGACY_MIGRATION)[-1] == LAST_LEGACY_MIGRATION
    finally:
        conn.close()
    keys = [f"ep{n}" for n in range(ENDPOINTS)]
    seed_workspace(dsn, "ws", [receiver.url("ok", key) for key in keys])
    config = write_config(empty_db, workers={"processes": 1, "poll_interval": "50ms", "lease": "30s",
                                             "heartbeat_interval": "200ms", "graceful_timeout": "10s"})
    with SteadyProducer(config, dsn, "ws", interval=0.005) as producer:
        phases = Phases(producer)
        with Dispatcher(config, tmp_path / "previous.log", repo=previous_version) as previous:
            committed_after(producer, PER_PHASE)
            wait_until(lambda: delivered(dsn) > 0, timeout=60, message="the previous version delivering")
            legacy = migrate_online(config, dsn, producer, phases)
            with Dispatcher(config, tmp_path / "current.log") as current:
                wait_until(lambda: "started (client=" in current.log(), timeout=60,
                           message="this version's workers")
                previous.stop()
                assert previous.process is not None and previous.process.returncode == 0, previous.log()[-3000:]
                phases.mark("rollout")
                committed_after(producer, PER_PHASE)
                producer.stop()
                phases.mark("stopped")
                phases.check()
                events = [event_id for event_id, _ in producer.committed]
                wait_until(lambda: delivered(dsn) == len(events) * ENDPOINTS, timeout=120,
                           message=f"{len(events) * ENDPOINTS} deliveries")
    assert_every_event_delivered_once(dsn, receiver, events, keys)
    assert_rows_where_their_ids_say(dsn, legacy)
    assert_events_where_their_days_say(dsn, events[:phases.committed["swap"]], events[phases.committed["rollout"]:])
    conn = psycopg2.connect(dsn)
    try:
        assert store.pending_migrations(conn) == []
    finally:
        conn.close()


def migrate_online(config: Path, dsn: str, producer: SteadyProducer, phases: Phases) -> dict[str, set[int]]:
    """0025, 0026, then the rest, each step once the producer has committed more; returns the
    ids of each outbox table just before the swap (every one a legacy id)."""
    for step in ("25", "26"):
        phases.mark(f"before {step}")
        done = migrate_cli(config, "--up-to", step)
        assert done.returncode == 0, done.stdout + done.stderr
        committed_after(producer, PER_PHASE)
    legacy = {table: set(rows_by_table(dsn, table)) for table in ("webhook_deliveries", "webhook_delivery_attempts")}
    phases.mark("swap")
    migrate_until_done(config)
    phases.mark("swapped")
    committed_after(producer, PER_PHASE)
    return legacy


def delivered(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM webhook_deliveries WHERE status = 'delivered'")[0][0])


def assert_every_event_delivered_once(dsn: str, receiver: ReceiverProcess, events: list[str],
                                      keys: list[str]) -> None:
    rows = query(dsn, "SELECT d.event_id, e.url, d.status, d.attempt FROM webhook_deliveries d "
                      "JOIN webhook_endpoints e ON e.id = d.endpoint_id")
    assert Counter(status for _, _, status, _ in rows) == {"delivered": len(events) * len(keys)}
    by_row = Counter((event_id, url.rsplit("/", 1)[-1]) for event_id, url, _, _ in rows)
    expected = {(event_id, key) for event_id in events for key in keys}
    assert set(by_row) == expected and set(by_row.values()) == {1}, "one row per event and endpoint"
    posts = {(d.webhook_id, d.endpoint): d for d in receiver.deliveries()}
    assert set(posts) == expected, "the receiver saw every row, and nothing else"
    sent_twice = {row: d.count for row, d in posts.items() if d.count != 1}
    assert sent_twice == {}, "no row was sent twice"
    assert all(d.ok == 1 and d.idempotency_keys == (event_id,) for (event_id, _), d in posts.items())


def assert_rows_where_their_ids_say(dsn: str, legacy: dict[str, set[int]]) -> None:
    """Legacy rows kept their ids and sit in ``*_before``; every newer row sits in its id's day's partition."""
    for table, before in legacy.items():
        now = rows_by_table(dsn, table)
        assert before and before <= set(now), f"{table}: legacy rows kept their ids"
        assert max(before) < LEGACY_LIMIT
        for row_id, partition in now.items():
            expected = (f"{table}_before" if row_id < LEGACY_LIMIT
                        else f"{table}_p{day_of_id(row_id):%Y%m%d}")
            assert partition == expected, (table, row_id, partition)
        assert any(row_id >= LEGACY_LIMIT for row_id in now), f"{table}: rows written after the swap"


def assert_events_where_their_days_say(dsn: str, before_swap: list[str], after_rollout: list[str]) -> None:
    """Events written before the migration sit in ``events_before``; those written after it in their day's
    partition, and so do their delivery rows, under day-encoded ids."""
    placed = {event_id: (partition, day) for event_id, partition, day in query(
        dsn, "SELECT id, tableoid::regclass::text, day FROM events WHERE workspace_id = 'ws'")}
    assert {placed[e][0] for e in before_swap} == {"events_before"}
    assert all(placed[e][0] == f"events_p{placed[e][1]:%Y%m%d}" for e in after_rollout)
    rows = query(dsn, "SELECT event_id, id, event_day FROM webhook_deliveries WHERE event_id = ANY(%s)",
                 (after_rollout,))
    assert len(rows) == len(after_rollout) * ENDPOINTS
    assert all(day_of_id(row_id) == event_day == placed[e][1] for e, row_id, event_day in rows)
    for table in ("webhook_deliveries", "webhook_delivery_attempts", "events"):
        assert query(dsn, f"SELECT count(*) FROM {table}_default")[0][0] == 0, f"{table}: DEFAULT stays empty"
