"""The producer API (``WebhookSender``) against a real Postgres and a real local HTTP receiver.

Flag on: one statement writes the event and the fan-out inside the caller's
transaction.  Flag off: today's behaviour, one signed POST per subscribed
endpoint after the caller commits, and no outbox rows (unless shadow writes
are on).  Nothing here is mocked: the receiver is a stdlib HTTP server on
127.0.0.1 and signatures are checked with the ``standardwebhooks`` package a
customer would use.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatcher import Event, WebhookSender, load_config, store
from dispatcher.message import event_body
from dispatcher.producer import ProducerError, StoredEvent
from dispatcher.signing import as_standard_secret
from tests.conftest import TestDatabase as Database

SECRET = "plain-legacy-secret"
WriteConfig = Callable[..., Path]


# ---------------------------------------------------------------- helpers


class CountingCursor(psycopg2.extensions.cursor):
    """Records every statement sent, so a test can count round trips."""

    def execute(self, query: Any, vars: Any = None) -> None:
        self.connection.statements.append(str(query))  # type: ignore[attr-defined]
        super().execute(query, vars)

    def executemany(self, query: Any, vars_list: Any) -> None:
        self.connection.statements.append(str(query))  # type: ignore[attr-defined]
        super().executemany(query, vars_list)

    def callproc(self, procname: Any, parameters: Any = None) -> Any:
        self.connection.statements.append(f"CALL {procname}")  # type: ignore[attr-defined]
        return super().callproc(procname, parameters)


class CountingConnection(psycopg2.extensions.connection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: list[str] = []

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        factory = kwargs.get("cursor_factory")
        # A cursor that does not count would make "one round trip" unprovable.
        assert factory is None or issubclass(factory, CountingCursor), f"uncounted cursor {factory}"
        kwargs["cursor_factory"] = factory or CountingCursor
        return super().cursor(*args, **kwargs)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    seen_by_db: Any = None


@dataclass
class Receiver:
    """A local webhook receiver; records every request before answering it."""

    server: ThreadingHTTPServer
    requests: list[Request] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)  # path -> status code (default 200)
    hang: dict[str, threading.Event] = field(default_factory=dict)  # path -> released at teardown
    on_request: Callable[[Request], Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        port = self.server.server_address[1]
        return f"http://127.0.0.1:{port}{path}"

    def received(self) -> list[Request]:
        with self.lock:
            return list(self.requests)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            me = state["receiver"]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            if me.on_request is not None:
                request.seen_by_db = me.on_request(request)
            with me.lock:
                me.requests.append(request)
            gate = me.hang.get(self.path)
            if gate is not None:
                gate.wait(timeout=30)
            self.send_response(me.status.get(self.path, 200))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["receiver"] = Receiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        for gate in state["receiver"].hang.values():
            gate.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def sender(db: Database, write_config: WriteConfig) -> WebhookSender:
    return WebhookSender(load_config(write_config(db, producer__legacy_timeout="2s"), env={}))


@pytest.fixture
def conn(db: Database) -> Iterator[CountingConnection]:
    connection = psycopg2.connect(db.dsn, connection_factory=CountingConnection)
    try:
        yield connection
    finally:
        connection.close()


@contextmanager
def admin(db: Database) -> Iterator[psycopg2.extensions.connection]:
    """A separate session, as the CLI or an outside tool would have."""
    connection = db.connect()
    try:
        yield connection
    finally:
        connection.close()


def make_workspace(db: Database, workspace_id: str, outbox: bool, secret: str = SECRET) -> None:
    with admin(db) as connection:
        store.create_workspace(connection, workspace_id, secret, {"webhook_outbox": outbox})


def set_outbox_flag(db: Database, workspace_id: str, outbox: bool) -> None:
    with admin(db) as connection:
        store.set_workspace_flags(connection, workspace_id, {"webhook_outbox": outbox})


def add_endpoint(db: Database, workspace_id: str, url: str, types: list[str] | None = None,
                 active: bool = True) -> int:
    with admin(db) as connection:
        endpoint_id = store.add_endpoint(connection, workspace_id, url, types or [])
        if not active:
            store.set_endpoint_active(connection, endpoint_id, False)
        return endpoint_id


def count(db: Database, table: str, where: str = "true", params: Any = None) -> int:
    return int(db.query(f"SELECT count(*) FROM {table} WHERE {where}", params)[0][0])


def nothing_written(db: Database) -> bool:
    """No event, no delivery, and no sequence number taken."""
    return all(count(db, table) == 0 for table in ("events", "webhook_deliveries", "event_sequences"))


def open_transaction(conn: psycopg2.extensions.connection) -> None:
    """The caller's own domain work, which opens the transaction ``send`` joins."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1")


def verified(request: Request, secret: str = SECRET) -> Any:
    """The payload of a POST whose Standard Webhooks signature checks out."""
    return Webhook(as_standard_secret(secret)).verify(request.body, request.headers)


def job(workspace_id: str = "ws", type_: str = "job.created", **payload: Any) -> Event:
    return Event(workspace_id=workspace_id, type=type_, payload=payload or {"job_id": 7, "note": "ünïcode"})


# ---------------------------------------------------------------- flag on: the outbox


class TestFanOut:
    @pytest.fixture
    def endpoints(self, db: Database) -> dict[str, int]:
        make_workspace(db, "ws", outbox=True)
        make_workspace(db, "other", outbox=True)
        return {
            "all": add_endpoint(db, "ws", "http://127.0.0.1:9/all"),
            "created": add_endpoint(db, "ws", "http://127.0.0.1:9/created", ["job.created"]),
            "both": add_endpoint(db, "ws", "http://127.0.0.1:9/both", ["job.created", "job.completed"]),
            "completed": add_endpoint(db, "ws", "http://127.0.0.1:9/completed", ["job.completed"]),
            "inactive": add_endpoint(db, "ws", "http://127.0.0.1:9/inactive", ["job.created"], active=False),
            "other_ws": add_endpoint(db, "other", "http://127.0.0.1:9/other"),
        }

    def delivered_to(self, db: Database, event_id: str) -> set[int]:
        return {row[0] for row in db.query("SELECT endpoint_id FROM webhook_deliveries WHERE event_id = %s",
                                           (event_id,))}

    @pytest.mark.parametrize(("type_", "expected"), [
        ("job.created", {"all", "created", "both"}),
        ("job.completed", {"all", "both", "completed"}),
        ("technician.location", {"all"}),
    ])
    def test_only_active_subscribed_endpoints_of_the_workspace(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, endpoints: dict[str, int],
        type_: str, expected: set[str],
    ) -> None:
        stored = sender.send(conn, job(type_=type_))
        conn.commit()
        assert stored.mode == "live"
        assert stored.deliveries == len(expected)
        assert self.delivered_to(db, stored.id) == {endpoints[name] for name in expected}

    def test_rows_are_pending_live_and_describe_the_event(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, endpoints: dict[str, int]
    ) -> None:
        occurred = datetime(2026, 9, 22, 12, 0, 0, 123456, tzinfo=UTC)
        event = Event("ws", "job.created", {"job_id": 7, "tags": ["a"], "nested": {"x": None}}, id="evt_given",
                      occurred_at=occurred)
        stored = sender.send(conn, event)
        conn.commit()
        assert stored == StoredEvent("evt_given", "ws", "job.created", "live", 1, 3)
        assert db.query("SELECT workspace_id, type, sequence, occurred_at, payload FROM events WHERE id = %s",
                        ("evt_given",)) == [("ws", "job.created", 1, occurred, dict(event.payload))]
        rows = db.query("SELECT workspace_id, status, mode, attempt, payload_hash, next_attempt_at <= now(), "
                        "locked_by, delivered_at FROM webhook_deliveries WHERE event_id = 'evt_given'")
        assert len(rows) == 3
        assert {row[:4] for row in rows} == {("ws", "pending", "live", 0)}
        assert len({row[4] for row in rows}) == 1 and len(rows[0][4]) == 64
        assert {row[5:] for row in rows} == {(True, None, None)}

    def test_event_id_defaults_to_a_uuid(self, sender: WebhookSender, conn: CountingConnection,
                                         endpoints: dict[str, int]) -> None:
        first, second = sender.send(conn, job()), sender.send(conn, job())
        assert str(uuid.UUID(first.id)) == first.id
        assert first.id != second.id
        assert (first.sequence, second.sequence) == (1, 2)

    def test_workspace_without_endpoints_still_records_the_event(
        self, db: Database, sender: WebhookSender, conn: CountingConnection
    ) -> None:
        make_workspace(db, "lonely", outbox=True)
        stored = sender.send(conn, job("lonely"))
        conn.commit()
        assert (stored.mode, stored.deliveries) == ("live", 0)
        assert count(db, "events", "workspace_id = 'lonely'") == 1

    def test_one_statement_round_trip(self, sender: WebhookSender, conn: CountingConnection,
                                      endpoints: dict[str, int]) -> None:
        open_transaction(conn)
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        conn.statements.clear()
        stored = sender.send(conn, job())
        assert stored.deliveries == 3
        assert len(conn.statements) == 1, conn.statements
        assert conn.statements[0] == store.QUERIES["send_event"]

    def test_send_never_commits(self, db: Database, sender: WebhookSender, conn: CountingConnection,
                                endpoints: dict[str, int]) -> None:
        sender.send(conn, job())
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        assert nothing_written(db)  # another session sees nothing yet
        conn.commit()
        assert count(db, "webhook_deliveries") == 3

    def test_rollback_leaves_no_event_and_no_delivery(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, endpoints: dict[str, int]
    ) -> None:
        stored = sender.send(conn, job())
        assert stored.deliveries == 3
        conn.rollback()
        assert nothing_written(db)

    def test_rollback_through_the_context_manager(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, endpoints: dict[str, int]
    ) -> None:
        with pytest.raises(KeyError), sender.transaction(conn) as tx:
            tx.send(job())
            raise KeyError("the caller's domain write failed")
        assert nothing_written(db)

    def test_context_manager_commits(self, db: Database, sender: WebhookSender, conn: CountingConnection,
                                     endpoints: dict[str, int]) -> None:
        with sender.transaction(conn) as tx:
            first = tx.send(job())
            second = tx.send(job(type_="job.completed"))
        assert tx.sent == [first, second]
        assert conn.status == psycopg2.extensions.STATUS_READY
        assert count(db, "events") == 2 and count(db, "webhook_deliveries") == 6


# ---------------------------------------------------------------- bad input


class TestBadInput:
    @pytest.fixture(autouse=True)
    def workspace(self, db: Database) -> None:
        make_workspace(db, "ws", outbox=True)
        add_endpoint(db, "ws", "http://127.0.0.1:9/all")

    def test_unknown_workspace(self, db: Database, sender: WebhookSender, conn: CountingConnection) -> None:
        open_transaction(conn)
        with pytest.raises(ProducerError, match="unknown workspace 'nope'"):
            sender.send(conn, job("nope"))
        # The caller's transaction is still usable and nothing was written.
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        sender.send(conn, job("ws"))
        conn.commit()
        assert count(db, "events") == 1 and count(db, "events", "workspace_id = 'nope'") == 0

    @pytest.mark.parametrize("payload", [
        {"tags": {"a", "b"}},
        {"ratio": float("nan")},
        {"ratio": float("inf")},
        {"when": datetime(2026, 1, 1)},
        {"blob": b"bytes"},
        {"obj": object()},
        {"text": "nul \x00 inside"},
        {"nul\x00key": 1},
        {"text": "lone surrogate \ud800"},
    ], ids=["set", "nan", "inf", "datetime", "bytes", "object", "nul-value", "nul-key", "lone-surrogate"])
    def test_payload_that_is_not_json_writes_nothing(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, payload: dict[str, Any]
    ) -> None:
        open_transaction(conn)
        conn.statements.clear()
        with pytest.raises(ProducerError, match="payload"):
            sender.send(conn, Event("ws", "job.created", payload))
        assert conn.statements == []
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        conn.commit()
        assert nothing_written(db)

    def test_valid_unicode_outside_the_bmp_is_stored(self, db: Database, sender: WebhookSender,
                                                     conn: CountingConnection) -> None:
        stored = sender.send(conn, Event("ws", "job.created", {"emoji": "\U0001f600", "path": "C:\\udir"}))
        conn.commit()
        assert db.query("SELECT payload FROM events WHERE id = %s", (stored.id,)) == [
            ({"emoji": "\U0001f600", "path": "C:\\udir"},)]

    @pytest.mark.parametrize("event", [
        Event("", "job.created", {}),
        Event("ws", "", {}),
        Event("ws", 42, {}),  # type: ignore[arg-type]
        Event(None, "job.created", {}),  # type: ignore[arg-type]
    ], ids=["no-workspace", "no-type", "type-not-text", "workspace-none"])
    def test_missing_names(self, db: Database, sender: WebhookSender, conn: CountingConnection, event: Event) -> None:
        with pytest.raises(ProducerError):
            sender.send(conn, event)
        assert conn.statements == []
        conn.commit()
        assert nothing_written(db)


# ---------------------------------------------------------------- sequences


class TestSequence:
    PRODUCERS = 8
    EVENTS_EACH = 40

    def test_unique_and_in_commit_order_under_concurrent_producers(
        self, db: Database, sender: WebhookSender
    ) -> None:
        """8 producers, each on its own connection, write to one workspace.

        Commit order is recorded soundly: each producer commits while holding a
        Python lock and appends to the log before releasing it, so the log's
        order *is* the order in which commits happened.  The sends themselves
        run unserialised, with random pauses between send and commit (and some
        rollbacks) to interleave transactions.  A sequence taken from e.g. a
        Postgres SEQUENCE would then show up out of commit order; the per-
        workspace counter row, locked until commit, cannot.
        """
        make_workspace(db, "ws", outbox=True)
        add_endpoint(db, "ws", "http://127.0.0.1:9/all")
        commit_log: list[tuple[int, str]] = []
        commit_lock = threading.Lock()
        errors: list[BaseException] = []
        start = threading.Barrier(self.PRODUCERS)

        def produce(worker: int) -> None:
            rng = random.Random(worker)
            connection = db.connect()
            try:
                start.wait(timeout=30)
                for n in range(self.EVENTS_EACH):
                    stored = sender.send(connection, job(worker=worker, n=n))
                    if rng.random() < 0.5:
                        time.sleep(rng.random() / 1000)
                    if n % 7 == 3:
                        connection.rollback()
                        continue
                    with commit_lock:
                        connection.commit()
                        assert stored.sequence is not None
                        commit_log.append((stored.sequence, stored.id))
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(self.PRODUCERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=100)
        assert not errors, errors
        committed_per_producer = self.EVENTS_EACH - len([n for n in range(self.EVENTS_EACH) if n % 7 == 3])
        assert len(commit_log) == self.PRODUCERS * committed_per_producer

        sequences = [sequence for sequence, _ in commit_log]
        assert sequences == sorted(sequences), "a later commit carries an earlier sequence"
        assert len(set(sequences)) == len(sequences), "duplicate sequence"
        stored_rows = dict(db.query("SELECT id, sequence FROM events WHERE workspace_id = 'ws'"))
        assert stored_rows == {event_id: sequence for sequence, event_id in commit_log}

    def test_each_workspace_counts_on_its_own(self, db: Database, sender: WebhookSender,
                                              conn: CountingConnection) -> None:
        make_workspace(db, "a", outbox=True)
        make_workspace(db, "b", outbox=True)
        got = [sender.send(conn, job(ws)).sequence for ws in ["a", "a", "b", "a", "b"]]
        conn.commit()
        assert got == [1, 2, 1, 3, 2]


# ---------------------------------------------------------------- the endpoint limit


class TestEndpointLimit:
    URL = "http://127.0.0.1:9/hook"

    def active(self, db: Database) -> int:
        return count(db, "webhook_endpoints", "workspace_id = 'ws' AND active")

    def test_eleventh_active_endpoint_is_refused(self, db: Database) -> None:
        make_workspace(db, "ws", outbox=True)
        spare = add_endpoint(db, "ws", self.URL, active=False)  # inactive endpoints do not count
        ids = [add_endpoint(db, "ws", self.URL) for _ in range(10)]
        with pytest.raises(store.LimitReached, match="10 active endpoints"):
            add_endpoint(db, "ws", self.URL)
        assert self.active(db) == 10
        # Re-activating past the limit is refused too.
        with admin(db) as connection:
            with pytest.raises(store.LimitReached):
                store.set_endpoint_active(connection, spare, True)
            store.set_endpoint_active(connection, ids[0], False)
            store.set_endpoint_active(connection, spare, True)
        assert self.active(db) == 10

    @pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
    def test_two_sessions_racing_for_the_tenth_slot(self, db: Database, first_commits: bool) -> None:
        """Session A inserts the 10th endpoint and holds its transaction open;
        session B's insert must wait for A and then see A's outcome."""
        make_workspace(db, "ws", outbox=True)
        for _ in range(9):
            add_endpoint(db, "ws", self.URL)
        first, second, monitor = db.connect(), db.connect(), db.connect()
        outcome: list[Any] = []
        try:
            with first.cursor() as cur:
                cur.execute("INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('ws', %s)", (self.URL,))

            def race() -> None:
                try:
                    outcome.append(store.add_endpoint(second, "ws", self.URL, []))
                except store.LimitReached as exc:
                    outcome.append(exc)

            thread = threading.Thread(target=race)
            thread.start()
            wait_until_blocked(monitor, second.get_backend_pid())
            if first_commits:
                first.commit()
            else:
                first.rollback()
            thread.join(timeout=30)
            assert not thread.is_alive()
        finally:
            for connection in (first, second, monitor):
                connection.close()
        assert len(outcome) == 1
        if first_commits:
            assert isinstance(outcome[0], store.LimitReached)
        else:
            assert isinstance(outcome[0], int)
        assert self.active(db) == 10

    def test_many_sessions_racing_for_the_last_two_slots(self, db: Database) -> None:
        make_workspace(db, "ws", outbox=True)
        for _ in range(8):
            add_endpoint(db, "ws", self.URL)
        racers = 6
        barrier = threading.Barrier(racers)
        outcomes: list[Any] = []
        lock = threading.Lock()

        def race() -> None:
            connection = db.connect()
            try:
                barrier.wait(timeout=30)
                result: Any = store.add_endpoint(connection, "ws", self.URL, [])
            except store.LimitReached as exc:
                result = exc
            finally:
                connection.close()
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=race) for _ in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(outcomes) == racers
        assert sum(isinstance(o, int) for o in outcomes) == 2
        assert sum(isinstance(o, store.LimitReached) for o in outcomes) == racers - 2
        assert self.active(db) == 10


def wait_until_blocked(monitor: psycopg2.extensions.connection, pid: int, limit: float = 20.0) -> None:
    """Wait (bounded) until backend ``pid`` is waiting on a lock."""
    monitor.autocommit = True
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with monitor.cursor() as cur:
            cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
            row = cur.fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.02)
    pytest.fail(f"backend {pid} never blocked on the endpoint limit's lock")


# ---------------------------------------------------------------- flag off: today's synchronous path


class TestFlagOff:
    @pytest.fixture
    def urls(self, db: Database, receiver: Receiver) -> dict[str, str]:
        make_workspace(db, "ws", outbox=False)
        urls = {name: receiver.url(f"/{name}") for name in ["all", "created", "completed", "inactive"]}
        add_endpoint(db, "ws", urls["all"])
        add_endpoint(db, "ws", urls["created"], ["job.created"])
        add_endpoint(db, "ws", urls["completed"], ["job.completed"])
        add_endpoint(db, "ws", urls["inactive"], ["job.created"], active=False)
        return urls

    def test_one_signed_post_per_subscribed_endpoint_after_commit(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        with sender.transaction(conn) as tx:
            stored = tx.send(job(job_id=42))
            assert receiver.received() == [], "a webhook left before the commit"
        assert (stored.mode, stored.sequence, stored.deliveries) == (None, None, 0)
        requests = receiver.received()
        assert sorted(r.path for r in requests) == ["/all", "/created"]
        for request in requests:
            body = verified(request)
            assert body["id"] == stored.id == request.headers["webhook-id"] == request.headers["idempotency-key"]
            assert (body["type"], body["workspace_id"], body["data"]) == ("job.created", "ws", {"job_id": 42})
            assert request.headers["content-type"] == "application/json"
            assert request.headers["x-larkspur-attempt"] == "1"
        assert nothing_written(db), "the flag-off path touched the outbox"

    def test_signature_fails_with_another_secret(
        self, sender: WebhookSender, conn: CountingConnection, receiver: Receiver, urls: dict[str, str]
    ) -> None:
        with sender.transaction(conn) as tx:
            tx.send(job())
        with pytest.raises(WebhookVerificationError):
            verified(receiver.received()[0], secret="some-other-secret")

    def test_nothing_is_sent_after_a_rollback(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        with pytest.raises(RuntimeError), sender.transaction(conn) as tx:
            tx.send(job())
            raise RuntimeError("domain write failed")
        stored = sender.send(conn, job())
        conn.rollback()  # managing the transaction by hand: after_commit is simply never called
        assert stored.legacy_urls
        assert receiver.received() == []
        assert nothing_written(db)

    def test_nothing_is_sent_when_the_commit_fails(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        db.query("CREATE TABLE domain (k int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        with pytest.raises(psycopg2.errors.UniqueViolation), sender.transaction(conn) as tx:
            with conn.cursor() as cur:
                cur.execute("INSERT INTO domain VALUES (1), (1)")  # only checked at COMMIT
            tx.send(job())
        assert receiver.received() == []

    def test_after_commit_by_hand(
        self, sender: WebhookSender, conn: CountingConnection, receiver: Receiver, urls: dict[str, str]
    ) -> None:
        stored = sender.send(conn, job(type_="job.completed"))
        conn.commit()
        assert receiver.received() == []
        sender.after_commit(stored)
        assert sorted(r.path for r in receiver.received()) == ["/all", "/completed"]

    def test_failing_endpoints_are_logged_and_do_not_stop_the_others(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        sender = WebhookSender(load_config(write_config(db, producer__legacy_timeout="200ms"), env={}))
        receiver.status["/all"] = 500
        receiver.hang["/slow"] = threading.Event()
        add_endpoint(db, "ws", "http://127.0.0.1:1/refused", ["job.created"])
        add_endpoint(db, "ws", receiver.url("/slow"), ["job.created"])
        caplog.set_level("INFO", logger="dispatcher.producer")
        with sender.transaction(conn) as tx:
            tx.send(job())
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created", "/slow"]
        statuses = [r.getMessage().rsplit("status=", 1)[1].split()[0] for r in caplog.records
                    if "legacy webhook" in r.getMessage()]
        assert len(statuses) == 4
        assert {"500", "200"} <= set(statuses)
        assert len([s for s in statuses if not s.isdigit()]) == 2  # refused + timed out: error class names

    def test_a_bad_stored_secret_or_url_is_logged_not_raised(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        # The caller has committed by then: raising would look like a failed commit.
        caplog.set_level("INFO", logger="dispatcher.producer")
        add_endpoint(db, "ws", "http://[::1/unparseable", ["job.created"])
        with sender.transaction(conn) as tx:
            tx.send(job())
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created"]
        db.query("UPDATE workspaces SET secret = 'whsec_not*base64'")
        with sender.transaction(conn) as tx:
            tx.send(job())
        assert len(receiver.received()) == 2  # nothing sent with a key that cannot be decoded
        statuses = [r.getMessage().rsplit("status=", 1)[1].split()[0] for r in caplog.records
                    if "legacy webhook" in r.getMessage()]
        assert statuses.count("InvalidSecret") == 3
        assert len(statuses) == 6

    def test_no_post_when_the_flag_is_on(self, db: Database, sender: WebhookSender, conn: CountingConnection,
                                         receiver: Receiver, urls: dict[str, str]) -> None:
        set_outbox_flag(db, "ws", True)
        with sender.transaction(conn) as tx:
            stored = tx.send(job())
        assert (stored.mode, stored.deliveries, stored.legacy_urls) == ("live", 2, ())
        assert receiver.received() == []
        assert count(db, "webhook_deliveries", "mode = 'live'") == 2

    def test_rotated_secret_signs_with_both_inside_the_grace(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        new_secret = "whsec_" + "bmV3LXNlY3JldC1rZXktYnl0ZXM="
        with admin(db) as connection:
            store.rotate_workspace_secret(connection, "ws", new_secret)
        with sender.transaction(conn) as tx:
            tx.send(job(type_="technician.location"))
        (request,) = receiver.received()
        assert verified(request, SECRET) == verified(request, new_secret)
        assert len(request.headers["webhook-signature"].split()) == 2

        db.query("UPDATE workspaces SET secret_rotated_at = now() - interval '25 hours'")
        with sender.transaction(conn) as tx:
            tx.send(job(type_="technician.location"))
        latest = receiver.received()[-1]
        verified(latest, new_secret)
        with pytest.raises(WebhookVerificationError):
            verified(latest, SECRET)


class TestShadowWrites:
    @pytest.fixture
    def shadow_sender(self, db: Database, write_config: WriteConfig) -> WebhookSender:
        return WebhookSender(load_config(write_config(db, producer__shadow_writes=True), env={}))

    @pytest.fixture
    def endpoints(self, db: Database, receiver: Receiver) -> dict[str, int]:
        make_workspace(db, "ws", outbox=False)
        return {
            "all": add_endpoint(db, "ws", receiver.url("/all")),
            "created": add_endpoint(db, "ws", receiver.url("/created"), ["job.created"]),
            "completed": add_endpoint(db, "ws", receiver.url("/completed"), ["job.completed"]),
        }

    def test_flag_off_writes_shadow_rows_and_still_posts(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        # What the receiver's side can see of the database when the POST arrives:
        # the shadow rows must already be committed.
        receiver.on_request = lambda request: count(db, "webhook_deliveries", "mode = 'shadow'")
        with shadow_sender.transaction(conn) as tx:
            stored = tx.send(job())
        assert (stored.mode, stored.sequence, stored.deliveries) == ("shadow", 1, 2)
        rows = db.query("SELECT endpoint_id, mode, status FROM webhook_deliveries WHERE event_id = %s", (stored.id,))
        assert sorted(rows) == sorted([(endpoints["all"], "shadow", "pending"),
                                       (endpoints["created"], "shadow", "pending")])
        assert count(db, "events", "id = %s", (stored.id,)) == 1
        requests = receiver.received()
        assert sorted(r.path for r in requests) == ["/all", "/created"]
        assert all(verified(r)["id"] == stored.id for r in requests)
        assert [r.seen_by_db for r in requests] == [2, 2], "a POST left before the commit"

    def test_shadow_rows_roll_back_with_the_caller(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        with pytest.raises(ValueError), shadow_sender.transaction(conn) as tx:
            tx.send(job())
            raise ValueError("nope")
        assert nothing_written(db)
        assert receiver.received() == []

    def test_flag_on_ignores_shadow_writes(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        set_outbox_flag(db, "ws", True)
        with shadow_sender.transaction(conn) as tx:
            stored = tx.send(job())
        assert (stored.mode, stored.deliveries) == ("live", 2)
        assert count(db, "webhook_deliveries", "mode = 'shadow'") == 0
        assert receiver.received() == []

    def test_shadow_body_matches_the_stored_event(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        occurred = datetime.now(UTC) - timedelta(minutes=1)
        with shadow_sender.transaction(conn) as tx:
            stored = tx.send(Event("ws", "job.completed", {"job_id": 9}, occurred_at=occurred))
        (request,) = [r for r in receiver.received() if r.path == "/completed"]
        body = json.loads(request.body)
        seq, occurred_db = db.query("SELECT sequence, occurred_at FROM events WHERE id = %s", (stored.id,))[0]
        assert body["sequence"] == seq == stored.sequence
        assert datetime.fromisoformat(body["occurred_at"].replace("Z", "+00:00")) == occurred_db == occurred

    def test_legacy_body_is_byte_identical_to_the_dispatchers(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        payload = {"z": 1, "a": [1.5, "ü", None], "nested": {"b": True, "a": "x"}}
        with shadow_sender.transaction(conn) as tx:
            stored = tx.send(Event("ws", "job.completed", payload))
        (request,) = [r for r in receiver.received() if r.path == "/completed"]
        # What the dispatcher would send for this event: built from the stored row.
        (sequence, occurred_at, payload_text), = db.query(
            "SELECT sequence, to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
            "payload::text FROM events WHERE id = %s", (stored.id,))
        assert request.body == event_body(stored.id, "job.completed", "ws", sequence, occurred_at, payload_text)
