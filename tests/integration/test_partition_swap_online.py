"""The swap (migration 0027) against a producer caught in the middle of a send.

Two orderings a busy region meets at nearly every swap (tests/e2e/test_partition_migration.py
meets them by chance; here each is set up on purpose): a send waiting for the swap's locks
when the swap commits, and a send already holding ``events`` when the swap asks for its
locks.  Neither may fail the producer.  No sleeps: each side waits until the database shows
the other one waiting for its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest

from dispatcher import Event, WebhookSender, load_config, store
from dispatcher_devtools.kit import Database, seed_workspace, wait_until

pytestmark = pytest.mark.timeout(60)
SWAP = 27


def migration(version: int) -> store.Migration:
    (found,) = [m for m in store.migrations() if m.version == version]
    return found


@pytest.fixture
def before_swap(empty_db: Database) -> Database:
    """A region migrated up to the swap, with one workspace and two endpoints."""
    conn = empty_db.connect()
    try:
        store.migrate(conn, up_to=SWAP - 1)
    finally:
        conn.close()
    seed_workspace(empty_db.dsn, "ws", ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"])
    return empty_db


class Background:
    """``work`` in a thread; its result or exception kept for the test."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._work()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def join(self) -> None:
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "still waiting"


def waiting_for_a_lock(db: Database, pid: int) -> bool:
    rows = db.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    return bool(rows) and rows[0][0] == "Lock"


@pytest.fixture
def swap_session(before_swap: Database) -> Iterator[psycopg2.extensions.connection]:
    conn = before_swap.connect()
    yield conn
    conn.close()


def test_a_send_waiting_for_the_swap_goes_through_when_it_commits(
        before_swap: Database, swap_session: psycopg2.extensions.connection, write_config: Any) -> None:
    sender = WebhookSender(load_config(Path(write_config(before_swap)), env={}))
    producer = before_swap.connect()
    with swap_session.cursor() as cur:
        cur.execute(migration(SWAP).sql)  # holds its locks: not committed yet
    producer_pid = producer.get_backend_pid()

    def send() -> str:
        with sender.transaction(producer) as tx:
            return tx.send(Event("ws", "job.created", {"n": 1})).id

    sending = Background(send)
    wait_until(lambda: waiting_for_a_lock(before_swap, producer_pid), timeout=20, message="the send to wait")
    with swap_session.cursor() as cur:
        cur.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (SWAP, migration(SWAP).name))
    swap_session.commit()
    sending.join()
    producer.close()
    assert sending.error is None, sending.error
    ((partition, day),) = before_swap.query("SELECT tableoid::regclass::text, day FROM events WHERE id = %s",
                                            (sending.result,))
    assert partition == f"events_p{day:%Y%m%d}", "the event is in its day's partition"
    rows = before_swap.query("SELECT event_day FROM webhook_deliveries WHERE event_id = %s", (sending.result,))
    assert rows == [(day,), (day,)], "and its deliveries say so"


def test_the_swap_waits_for_a_send_holding_events_without_deadlocking_it(
        before_swap: Database, swap_session: psycopg2.extensions.connection) -> None:
    """The send's own statements, one by one: events first, then webhook_deliveries."""
    producer = before_swap.connect()
    with producer.cursor() as cur:
        cur.execute("INSERT INTO events (id, workspace_id, type, sequence, payload) "
                    "VALUES ('e-1', 'ws', 'job.created', nextval('event_sequence'), '{}')")
    # Without its lock_timeout the swap waits as long as it takes: the order of its locks is
    # what is tested, not how long it waits.
    swap_sql = migration(SWAP).sql.replace("SET LOCAL lock_timeout = '2s';", "", 1)
    swap_pid = swap_session.get_backend_pid()

    def swap() -> None:
        with swap_session.cursor() as cur:
            cur.execute(swap_sql)

    swapping = Background(swap)
    wait_until(lambda: waiting_for_a_lock(before_swap, swap_pid), timeout=20, message="the swap to wait")
    with producer.cursor() as cur:
        cur.execute("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                    "SELECT 'ws', id, 'e-1', 'h' FROM webhook_endpoints WHERE workspace_id = 'ws'")
    producer.commit()
    producer.close()
    swapping.join()
    assert swapping.error is None, swapping.error
    swap_session.commit()
    assert before_swap.query("SELECT count(*) FROM webhook_deliveries_before WHERE event_id = 'e-1'") == [(2,)]
