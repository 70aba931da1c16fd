"""An idle worker wakes for new rows before its poll (``rules.wake``; docs/claim.md, "Waking for
new rows").  The poll is an hour here, so every row below is delivered because a wake read
saw it come, or not at all within the test's bound."""

from __future__ import annotations

from pathlib import Path

import psycopg2
import pytest

from dispatcher.config import load_config
from dispatcher.producer import Event, WebhookSender
from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(90)

IDLE = {"workers": {"processes": 1, "poll_interval": "1h", "wake_interval": "20ms"}}
WAKE_READ = "%backend_xid%"


def _wake_reads(dsn: str) -> list[object]:
    """When the worker's claim connection began its statement, if that is a wake read."""
    return [started for (started,) in query(
        dsn, "SELECT query_start FROM pg_stat_activity WHERE application_name LIKE 'dispatcher claim %%' "
             "AND query LIKE %s", (WAKE_READ,))]


def _idle(dispatcher: Dispatcher, dsn: str, reads: int = 3) -> None:
    """Wait until the worker has made ``reads`` distinct wake reads: it is in its pause, past any
    claim that a read before them made."""
    seen: set[object] = set()

    def counted() -> bool:
        seen.update(_wake_reads(dsn))
        return len(seen) >= reads
    settle(dispatcher, dsn, counted, f"{reads} wake reads of the idle worker")


def test_an_idle_worker_claims_a_new_row_before_its_poll(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("ok", "a")])
        config = write_config(db, **IDLE)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            _idle(dispatcher, db.dsn)
            events = produce(config, db.dsn, "ws", 3)
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 3}, "3 rows delivered")
        assert {d.webhook_id for d in receiver.deliveries() if d.ok} == set(events)


def test_rows_committed_after_the_wake_read_that_saw_them_numbered_are_claimed(
        db, write_config, tmp_path: Path) -> None:
    """The producer's transaction numbers its rows, the worker reads the moved sequence and claims
    (finding nothing: the rows are not committed), then the producer commits: the next read sees
    that transaction end and claims again."""
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("ok", "a")])
        config = write_config(db, **IDLE)
        sender = WebhookSender(load_config(config, env={}))
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            _idle(dispatcher, db.dsn)
            conn = psycopg2.connect(db.dsn)
            try:
                with sender.transaction(conn) as tx:
                    event = tx.send(Event("ws", "job.created", {"n": 1})).id
                    _idle(dispatcher, db.dsn, reads=6)  # reads after the sequence moved, and their claim
                    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries") == [(0,)]
            finally:
                conn.close()
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 1},
                   "the row delivered after its producer's commit")
        assert [d.webhook_id for d in receiver.deliveries() if d.ok] == [event]
