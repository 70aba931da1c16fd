"""Database faults: killed sessions, a Postgres restart, a producer cut off mid-transaction.

Every case ends with each row delivered at least once, none marked delivered
without a recorded 2xx, and none left claimed.  The supervisor's own blip test
(``tests/e2e/test_supervisor.py::test_database_blips_are_survived_without_losing_rows``)
checks that workers are not replaced for a blip.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg2
import pytest

from dispatcher import Event, WebhookSender, load_config, store
from dispatcher_devtools.kit import SECRET, Dispatcher, assert_no_event, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import ThrowawayPostgres, settle, terminate_dispatcher_sessions

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:XDG_RUNTIME_DIR is not set")]

# Delivered rows without an attempt that recorded a 2xx: must always be empty.
UNPROVEN = ("SELECT d.id FROM webhook_deliveries d WHERE d.status = 'delivered' AND NOT EXISTS ("
            "SELECT 1 FROM webhook_delivery_attempts a WHERE a.delivery_id = d.id "
            "AND a.result = 'delivered' AND a.status_code BETWEEN 200 AND 299)")
LOCKED = "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL"


def _received(receiver: ReceiverProcess) -> set[tuple[str, str]]:
    """(webhook-id, endpoint key) pairs the receiver answered 2xx at least once."""
    return {(d.webhook_id, d.endpoint) for d in receiver.iter_deliveries() if d.ok}


def test_killed_sessions_during_claims_sends_and_result_writes_lose_nothing(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    keys = [f"e{n}" for n in range(8)]
    seed_workspace(db.dsn, "ws", [receiver.url("latency", key, ms=250) for key in keys])
    config = write_config(db, http={"timeout": "1s"},
                          database={"connect_timeout": "2s", "reconnect_max": "500ms"},
                          workers={"processes": 2, "lease": "3s", "poll_interval": "50ms", "flush_interval": "50ms"})
    event_ids = produce(config, db.dsn, "ws", 50)
    rows = len(keys) * len(event_ids)
    killed = 0
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        pids = sorted(settle(dispatcher, db.dsn, lambda: len(dispatcher.worker_pids()) == 2
                             and dispatcher.worker_pids(), "2 workers"))
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("delivered", 0) >= 20, "deliveries to flow")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and status_counts(db.dsn).get("delivered", 0) < rows - 40:
            killed += terminate_dispatcher_sessions(db.dsn)
            time.sleep(0.1)
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": rows}, f"all {rows} delivered",
               timeout=60)
        assert sorted(dispatcher.worker_pids()) == pids, "no worker died for a killed session"
        log = dispatcher.log()
    assert killed >= 10, f"only {killed} sessions were killed"
    # The kills landed on every path: the claim, and the result write after sends.
    assert "claim failed, backing off" in log
    assert "result write failed, will retry" in log
    assert_no_event(log, "worker_restarting")
    assert query(db.dsn, UNPROVEN) == [], "a row was marked delivered without a recorded 2xx"
    assert query(db.dsn, LOCKED) == [(0,)]
    assert _received(receiver) == {(e, k) for e in event_ids for k in keys}, "every delivered id reached its endpoint"


def test_a_postgres_restart_with_10000_rows_pending(tmp_path: Path, write_config) -> None:
    with ThrowawayPostgres() as pg, ReceiverProcess(secrets=[SECRET]) as receiver:
        conn = psycopg2.connect(pg.dsn)
        store.migrate(conn)
        conn.close()
        keys = [f"r{n}" for n in range(10)]
        seed_workspace(pg.dsn, "ws", [receiver.url("ok", key) for key in keys])
        # 1000 events x 10 endpoints, written as an outside tool would.
        query(pg.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) "
                      "SELECT 'evt-' || g, 'ws', 'job.created', g, jsonb_build_object('n', g) "
                      "FROM generate_series(1, 1000) g")
        query(pg.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                      "SELECT 'ws', e.id, ev.id, 'h', ev.day FROM events ev, webhook_endpoints e "
                      "WHERE ev.workspace_id = 'ws'")
        rows = 10_000
        config = write_config(type("Db", (), {"dsn": pg.dsn})(), http={"timeout": "2s"},
                              database={"dsn": pg.dsn, "connect_timeout": "2s", "reconnect_max": "1s"},
                              workers={"processes": 2, "lease": "10s", "poll_interval": "50ms"})
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            pids = sorted(settle(dispatcher, pg.dsn, lambda: len(dispatcher.worker_pids()) == 2
                                 and dispatcher.worker_pids(), "2 workers"))
            settle(dispatcher, pg.dsn, lambda: status_counts(pg.dsn).get("delivered", 0) >= 1000,
                   "deliveries to flow")
            pg.stop()
            stopped_at = time.monotonic()
            time.sleep(3.0)
            pg.start()
            down_for = time.monotonic() - stopped_at
            assert status_counts(pg.dsn).get("pending", 0) > 0, "the restart happened with rows pending"
            settle(dispatcher, pg.dsn, lambda: status_counts(pg.dsn) == {"delivered": rows}, f"all {rows} delivered",
                   timeout=90)
            assert sorted(dispatcher.worker_pids()) == pids, "workers reconnected instead of being replaced"
            log = dispatcher.log()
        assert query(pg.dsn, UNPROVEN) == []
        assert query(pg.dsn, LOCKED) == [(0,)]
        received = _received(receiver)
    assert len(received) == rows and {k for _, k in received} == set(keys)
    assert_no_event(log, "worker_restarting")  # no worker exited: each reconnected
    retries = log.count("claim failed, backing off")
    assert retries >= 2, "the workers noticed the outage"
    # Backoff, not a hot loop: with a 1 s cap each worker retries a few times a second at most.
    assert retries <= 2 * (down_for / 0.1), retries


def test_a_producer_killed_before_commit_leaves_neither_event_nor_rows(db, write_config) -> None:
    seed_workspace(db.dsn, "ws", [f"http://127.0.0.1:9/hook{n}" for n in range(3)])
    sender = WebhookSender(load_config(write_config(db), env={}))
    conn = psycopg2.connect(db.dsn)
    try:
        with pytest.raises(psycopg2.OperationalError):
            with sender.transaction(conn) as tx:
                stored = tx.send(Event("ws", "job.created", {"n": 1}))
                assert stored.deliveries == 3, "the event fans out to three rows in this transaction"
                assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries") == [(0,)], "not visible yet"
                (killed,) = query(db.dsn, "SELECT pg_terminate_backend(%s)", (conn.get_backend_pid(),))[0]
                assert killed
        # ... the commit at the end of the block failed, and the caller heard of it.
    finally:
        conn.close()
    assert query(db.dsn, "SELECT count(*) FROM events") == [(0,)]
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries") == [(0,)]
    # (Its sequence number is spent: sequences have gaps since 0004, docs/producer.md.)
    # The next producer transaction works as usual.
    assert len(produce(write_config(db), db.dsn, "ws", 1)) == 1
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries") == [(3,)]


def test_a_read_only_database_is_waited_out_not_a_silent_stop(db, write_config, tmp_path: Path,
                                                             receiver: ReceiverProcess) -> None:
    """A failover can briefly point the dispatcher at a server that is still read-only
    (a demoted primary, a standby): every claim and write is refused with SQLSTATE
    25006.  The worker must back off and resume once writes work again, not lose
    its claim loop to an unexpected error while it keeps heartbeating."""
    seed_workspace(db.dsn, "ws", [receiver.url("ok", "ro")])
    config = write_config(db, database={"connect_timeout": "2s", "reconnect_max": "300ms"},
                          workers={"processes": 1, "poll_interval": "50ms"})
    producer = psycopg2.connect(db.dsn)  # opened before the switch: it stays writable
    try:
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            (pid,) = settle(dispatcher, db.dsn, dispatcher.worker_pids, "a worker")
            produce(config, db.dsn, "ws", 5)
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 5}, "5 delivered")
            query(db.dsn, f'ALTER DATABASE "{db.name}" SET default_transaction_read_only = on')
            terminate_dispatcher_sessions(db.dsn)  # they reconnect to a read-only database
            sender = WebhookSender(load_config(config, env={}))
            with sender.transaction(producer) as tx:
                for n in range(5):
                    tx.send(Event("ws", "job.created", {"n": n}))
            settle(dispatcher, db.dsn, lambda: dispatcher.log().count("read-only") >= 2, "refused claims")
            assert status_counts(db.dsn) == {"delivered": 5, "pending": 5}
            writable = psycopg2.connect(db.dsn, options="-c default_transaction_read_only=off")
            writable.autocommit = True
            with writable.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{db.name}" RESET default_transaction_read_only')
            writable.close()
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 10}, "10 delivered")
            assert dispatcher.worker_pids() == [pid]
    finally:
        producer.close()


def test_an_api_request_the_database_never_answers_gets_503_within_the_deadline(db, write_config) -> None:
    # The server-side statement_timeout is an hour here, so only the API's own deadline
    # (database.statement_deadline) can end the wait: as for a frozen primary or a host
    # gone silent, which never answer at all.
    from tests.support.faults import ApiServer, create_token

    seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    config = write_config(db, database={"statement_deadline": "2s"},
                          api={"listen": "127.0.0.1:0", "pool_size": 1, "statement_timeout": "1h"})
    token = create_token(config, "ws")
    with ApiServer(config) as api:
        assert api.request("GET", "/v2/webhooks/endpoints", token)[0] == 200
        locker = psycopg2.connect(db.dsn)
        try:
            with locker.cursor() as cur:
                cur.execute("LOCK TABLE api_tokens, webhook_endpoints IN ACCESS EXCLUSIVE MODE")
            status, body = api.request("GET", "/v2/webhooks/endpoints", token)
            assert status == 503, body
            assert "unavailable" in body["detail"], body
        finally:
            locker.rollback()
            locker.close()
        # The connection given up on was dropped; the next request gets a fresh one.
        assert api.request("GET", "/v2/webhooks/endpoints", token)[0] == 200
        assert not [line for line in api.lines if "Traceback" in line]
