"""The producer API (``WebhookSender``) against a real Postgres and a real local HTTP receiver.

Flag on: one statement writes the event and the fan-out inside the caller's
transaction.  Flag off: today's behaviour, one signed POST per subscribed
endpoint made inline by ``send`` itself, and no outbox rows (unless shadow
writes are on).  Nothing here is mocked: the receiver is a stdlib HTTP server on
127.0.0.1 and signatures are checked with the ``standardwebhooks`` package a
customer would use.
"""

from __future__ import annotations

import json
import random
import re
import socket
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
from dnslib import QTYPE, RR, A
from dnslib.server import BaseResolver, DNSServer
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatcher import Event, WebhookSender, load_config, store
from dispatcher.message import event_body
from dispatcher.producer import ProducerError, StoredEvent, json_depth, walked_depth
from dispatcher.signing import as_standard_secret, new_secret
from dispatcher_devtools.kit import wait_until
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
    behaviour: dict[str, str] = field(default_factory=dict)  # path -> "trickle" | "endless" | "redirect"
    aborted: list[str] = field(default_factory=list)  # paths whose client hung up before the body ended

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
            special = me.behaviour.get(self.path)
            if special is not None:
                self.answer(me, special)
                return
            self.send_response(me.status.get(self.path, 200))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def answer(self, me: Receiver, special: str) -> None:
            if special == "redirect":
                self.send_response(307)
                self.send_header("Location", "/all")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            total = 200 if special == "trickle" else 256 * 1024 * 1024
            self.send_response(200)
            self.send_header("Content-Length", str(total))
            self.end_headers()
            chunk = b"x" if special == "trickle" else b"x" * 65536
            try:
                for _ in range(total // len(chunk)):
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    if special == "trickle":
                        time.sleep(0.05)
            except OSError:  # the client hung up
                with me.lock:
                    me.aborted.append(self.path)

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
    """An endpoint signing with its workspace's secret (these tests verify with it), as one
    written before migration 0017 or by an outside tool without a secret does."""
    with admin(db) as connection:
        endpoint_id = store.add_endpoint(connection, workspace_id, url, types or [], new_secret())
        if not active:
            store.set_endpoint_active(connection, endpoint_id, False)
    db.query("UPDATE webhook_endpoints SET secret = NULL WHERE id = %s", (endpoint_id,))
    return endpoint_id


def count(db: Database, table: str, where: str = "true", params: Any = None) -> int:
    return int(db.query(f"SELECT count(*) FROM {table} WHERE {where}", params)[0][0])


def nothing_written(db: Database) -> bool:
    """No event and no delivery."""
    return all(count(db, table) == 0 for table in ("events", "webhook_deliveries"))


def open_transaction(conn: psycopg2.extensions.connection) -> None:
    """The caller's own domain work, which opens the transaction ``send`` joins."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1")


def verified(request: Request, secret: str = SECRET) -> Any:
    """The payload of a POST whose Standard Webhooks signature checks out."""
    return Webhook(as_standard_secret(secret)).verify(request.body, request.headers)


def job(workspace_id: str = "ws", type_: str = "job.created", **payload: Any) -> Event:
    return Event(workspace_id=workspace_id, type=type_, payload=payload or {"job_id": 7, "note": "ünïcode"})

def send_past_an_open_transaction(sender: WebhookSender, first: Any, second: Any) -> tuple[Any, Any]:
    """A sends on ``first`` and keeps its transaction open; B sends on ``second`` and commits.
    B must not wait for A, and B's sequence comes after A's."""
    held = sender.send(first, job())
    with second.cursor() as cur:
        # Were B to queue behind A's transaction, this fails instead of hanging.
        cur.execute("SET lock_timeout = '10s'")
    second.commit()
    passed = sender.send(second, job())
    second.commit()  # B commits while A is still open
    assert first.status == psycopg2.extensions.STATUS_IN_TRANSACTION
    assert held.sequence is not None and passed.sequence is not None
    assert passed.sequence > held.sequence, "allocation order"
    return held, passed



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
        assert stored == StoredEvent("evt_given", "ws", "job.created", "live", stored.sequence, 3)
        assert db.query("SELECT workspace_id, type, sequence, occurred_at, payload FROM events WHERE id = %s",
                        ("evt_given",)) == [("ws", "job.created", stored.sequence, occurred, dict(event.payload))]
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
        assert first.sequence is not None and second.sequence is not None
        assert second.sequence > first.sequence

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


def nested(depth: int, kind: type = list) -> dict[str, Any]:
    """A payload ``depth`` containers deep (the payload object itself is level 1), built without recursion."""
    inner: Any = 1
    for _ in range(depth - 1):
        inner = [inner] if kind is list else {"k": inner}
    return {"k": inner}


class TestLimits:
    """Hostile producers (issue 13 item 2): a huge or deeply nested payload, an id that cannot be a header.
    Each is refused by ``send`` before any statement, so the caller's transaction stays usable."""

    LIMIT = 256 * 1024

    @pytest.fixture(autouse=True)
    def workspace(self, db: Database) -> None:
        make_workspace(db, "ws", outbox=True)
        add_endpoint(db, "ws", "http://127.0.0.1:9/all")

    def refused(self, db: Database, sender: WebhookSender, conn: CountingConnection, event: Event,
                match: str) -> None:
        """``send`` raises ProducerError before any statement; the caller's transaction commits other work."""
        open_transaction(conn)
        conn.statements.clear()
        with pytest.raises(ProducerError, match=match):
            sender.send(conn, event)
        assert conn.statements == []
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION
        other = sender.send(conn, job())
        conn.commit()
        assert [row[0] for row in db.query("SELECT id FROM events")] == [other.id]
        assert count(db, "webhook_deliveries", "event_id <> %s", (other.id,)) == 0

    def test_a_50_mb_payload_is_refused_and_nothing_is_written(
        self, db: Database, sender: WebhookSender, conn: CountingConnection
    ) -> None:
        self.refused(db, sender, conn, Event("ws", "job.created", {"blob": "x" * 50_000_000}),
                     match=r"payload is 50000011 bytes of JSON, over producer.max_payload_bytes \(262144\)")

    def test_the_size_limit_is_the_serialized_json_in_bytes(
        self, db: Database, sender: WebhookSender, conn: CountingConnection
    ) -> None:
        overhead = len('{"blob":""}')
        # Non-ASCII counts by its UTF-8 bytes (what is stored and sent), not by its \u escapes:
        # 'é' is two bytes, so this payload is one byte over.
        over = {"blob": "é" * ((self.LIMIT - overhead) // 2) + "xx"}
        self.refused(db, sender, conn, Event("ws", "job.created", over),
                     match=r"payload is 262145 bytes of JSON, over producer.max_payload_bytes")
        at_limit = {"blob": "x" * (self.LIMIT - overhead)}
        stored = sender.send(conn, Event("ws", "job.created", at_limit))
        conn.commit()
        assert db.query("SELECT payload FROM events WHERE id = %s", (stored.id,)) == [(at_limit,)]

    def test_the_limit_is_configurable(self, db: Database, write_config: WriteConfig,
                                       conn: CountingConnection) -> None:
        small = WebhookSender(load_config(write_config(db, producer__max_payload_bytes=100), env={}))
        with pytest.raises(ProducerError, match=r"over producer.max_payload_bytes \(100\)"):
            small.send(conn, Event("ws", "job.created", {"blob": "x" * 100}))
        assert conn.statements == []

    @pytest.mark.parametrize(("depth", "kind"), [(65, list), (65, dict), (100_000, list), (100_000, dict)],
                             ids=["65-lists", "65-dicts", "100k-lists", "100k-dicts"])
    def test_deep_nesting_is_a_producer_error_not_a_recursion_error(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, depth: int, kind: type
    ) -> None:
        self.refused(db, sender, conn, Event("ws", "job.created", nested(depth, kind)),
                     match="payload is nested deeper than 64 levels")

    def test_both_depth_measures_agree(self) -> None:
        """``json_depth`` (the text, for payloads json.dumps encodes) and ``walked_depth`` (the objects,
        for those it cannot) measure the same thing, on strings full of brackets, quotes and escapes."""
        rng = random.Random(13)
        tricky = ['"', "\\", '\\"', "[", "]", "{", "}", "\n", "é", "\U0001f600", "\\u005b", " ", "a"]

        def value(depth: int) -> Any:
            kind = rng.choice(["list", "dict", "tuple", "text", "number"] if depth < 12 else ["text", "number"])
            if kind == "text":
                return "".join(rng.choice(tricky) for _ in range(rng.randrange(6)))
            if kind == "number":
                return rng.choice([0, -1.5, None, True])
            items = [value(depth + 1) for _ in range(rng.randrange(4))]
            if kind == "dict":
                return {"".join(rng.choice(tricky) for _ in range(3)) + str(n): item for n, item in enumerate(items)}
            return items if kind == "list" else tuple(items)

        cases = [value(0) for _ in range(400)] + [nested(d, kind) for d in (1, 2, 64, 65) for kind in (list, dict)]
        assert {walked_depth(case, 10_000) for case in cases} >= {0, 1, 2, 5, 64, 65}
        for case in cases:
            text = json.dumps(case, separators=(",", ":"))
            assert json_depth(text) == walked_depth(case, 10_000), text

    def test_64_levels_are_stored_as_sent(self, db: Database, sender: WebhookSender,
                                          conn: CountingConnection) -> None:
        payload = nested(64, dict)
        stored = sender.send(conn, Event("ws", "job.created", payload))
        conn.commit()
        assert db.query("SELECT payload FROM events WHERE id = %s", (stored.id,)) == [(payload,)]

    @pytest.mark.parametrize(("event_id", "problem"), [
        ("", "is empty"),
        ("evt\r\nX-Injected: 1", "control character"),
        ("evt\n1", "control character"),
        ("evt\t1", "control character"),
        ("evt\x00", "control character"),
        ("evt\x7f", "control character"),
        ("evt 1", "space"),
        ("évt", "non-ASCII"),
        ("evt-\U0001f600", "non-ASCII"),
        ("x" * 201, "201 characters, over 200"),
        (42, "not a string"),
    ], ids=["empty", "crlf", "lf", "tab", "nul", "del", "space", "latin1", "emoji", "201-chars", "not-text"])
    def test_bad_event_ids_are_refused_naming_the_problem(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, event_id: Any, problem: str
    ) -> None:
        self.refused(db, sender, conn, Event("ws", "job.created", {}, id=event_id),
                     match=f"event id .*{re.escape(problem)}")

    @pytest.mark.parametrize("event_id", ["x" * 200, "evt_01HZ:a-b.c~d!$&'()*+,;=/?@[]{}|^`\"<>%#\\"])
    def test_visible_ascii_ids_up_to_200_characters_are_accepted(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, event_id: str
    ) -> None:
        stored = sender.send(conn, Event("ws", "job.created", {}, id=event_id))
        conn.commit()
        assert stored.id == event_id
        assert count(db, "webhook_deliveries", "event_id = %s", (event_id,)) == 1


class TestWorkspaceScope:
    """Event ids are unique per workspace, not globally (docs/decisions.md, Limits; migration 0009)."""

    def test_the_same_id_in_two_workspaces_both_commit_with_their_own_event(
        self, db: Database, sender: WebhookSender, conn: CountingConnection
    ) -> None:
        for workspace_id in ("acme", "globex"):
            make_workspace(db, workspace_id, outbox=True)
            add_endpoint(db, workspace_id, f"http://127.0.0.1:9/{workspace_id}")
        with admin(db) as other:  # another producer, committed first
            sender.send(other, Event("globex", "job.completed", {"of": "globex"}, id="evt_1"))
            other.commit()
        sender.send(conn, Event("acme", "job.created", {"of": "acme"}, id="evt_1"))
        conn.commit()
        assert sorted(db.query("SELECT workspace_id, type, payload FROM events WHERE id = 'evt_1'")) == [
            ("acme", "job.created", {"of": "acme"}), ("globex", "job.completed", {"of": "globex"})]
        assert sorted(db.query("SELECT d.workspace_id, e.url FROM webhook_deliveries d "
                               "JOIN webhook_endpoints e ON e.id = d.endpoint_id WHERE d.event_id = 'evt_1'")) == [
            ("acme", "http://127.0.0.1:9/acme"), ("globex", "http://127.0.0.1:9/globex")]

    def test_an_id_used_twice_in_one_workspace_is_a_producer_error_and_the_transaction_lives_on(
        self, db: Database, sender: WebhookSender, conn: CountingConnection
    ) -> None:
        make_workspace(db, "acme", outbox=True)
        add_endpoint(db, "acme", "http://127.0.0.1:9/acme")
        sender.send(conn, Event("acme", "job.created", {"n": 1}, id="evt_1"))
        conn.commit()
        open_transaction(conn)
        with pytest.raises(ProducerError, match="already has an event with id 'evt_1'"):
            sender.send(conn, Event("acme", "job.created", {"n": 2}, id="evt_1"))
        # The caller's own work in the same transaction still commits (a unique
        # violation would have aborted it), and the first event is untouched.
        sender.send(conn, Event("acme", "job.created", {"n": 3}, id="evt_2"))
        conn.commit()
        assert sorted(db.query("SELECT id, payload FROM events")) == [("evt_1", {"n": 1}), ("evt_2", {"n": 3})]
        assert count(db, "webhook_deliveries") == 2


# ---------------------------------------------------------------- sequences


class TestSequence:
    """The contract (docs/producer.md): unique per workspace and increasing in
    allocation order, with gaps; *not* commit order.  Producers of one
    workspace never wait for each other's transactions (docs/decisions.md, Sequence)."""

    PRODUCERS = 8
    EVENTS_EACH = 40

    def test_unique_and_increasing_in_allocation_order_under_concurrent_producers(
        self, db: Database, sender: WebhookSender
    ) -> None:
        make_workspace(db, "ws", outbox=True)
        add_endpoint(db, "ws", "http://127.0.0.1:9/all")
        committed: dict[int, list[tuple[int, str]]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(self.PRODUCERS)

        def produce(worker: int) -> None:
            rng = random.Random(worker)
            connection = db.connect()
            mine: list[tuple[int, str]] = []
            try:
                start.wait(timeout=30)
                for n in range(self.EVENTS_EACH):
                    stored = sender.send(connection, job(worker=worker, n=n))
                    assert stored.sequence is not None
                    if rng.random() < 0.5:
                        time.sleep(rng.random() / 1000)
                    if n % 7 == 3:
                        connection.rollback()  # leaves a gap
                        continue
                    connection.commit()
                    mine.append((stored.sequence, stored.id))
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()
                committed[worker] = mine

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(self.PRODUCERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=100)
        assert not errors, errors
        for worker, mine in committed.items():
            sequences = [sequence for sequence, _ in mine]
            assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences), worker
        everything = [entry for mine in committed.values() for entry in mine]
        assert len({sequence for sequence, _ in everything}) == len(everything), "duplicate sequence"
        stored_rows = dict(db.query("SELECT id, sequence FROM events WHERE workspace_id = 'ws'"))
        assert stored_rows == {event_id: sequence for sequence, event_id in everything}

    def test_an_open_transaction_does_not_block_another_producer_of_the_workspace(
        self, db: Database, sender: WebhookSender
    ) -> None:
        make_workspace(db, "ws", outbox=True)
        add_endpoint(db, "ws", "http://127.0.0.1:9/all")
        first, second = db.connect(), db.connect()
        try:
            held, passed = send_past_an_open_transaction(sender, first, second)
            assert db.query("SELECT id FROM events") == [(passed.id,)]
            first.commit()
        finally:
            first.close()
            second.close()
        # Committed out of allocation order: sequence order is allocation order, not commit order.
        assert db.query("SELECT id FROM events ORDER BY sequence") == [(held.id,), (passed.id,)]

    def test_each_workspace_increases_on_its_own(self, db: Database, sender: WebhookSender,
                                                 conn: CountingConnection) -> None:
        make_workspace(db, "a", outbox=True)
        make_workspace(db, "b", outbox=True)
        got = [(ws, sender.send(conn, job(ws)).sequence) for ws in ["a", "a", "b", "a", "b"]]
        conn.commit()
        for ws in ("a", "b"):
            mine = [sequence for owner, sequence in got if owner == ws]
            assert mine == sorted(mine) and len(set(mine)) == len(mine)

    def test_a_rolled_back_send_leaves_a_gap_never_a_reuse(self, db: Database, sender: WebhookSender,
                                                            conn: CountingConnection) -> None:
        make_workspace(db, "ws", outbox=True)
        lost = sender.send(conn, job()).sequence
        conn.rollback()
        kept = sender.send(conn, job()).sequence
        conn.commit()
        assert lost is not None and kept is not None and kept > lost
        assert db.query("SELECT sequence FROM events") == [(kept,)]

    def test_migration_continues_above_the_old_counters(self, empty_db: Database) -> None:
        """Workspaces that produced under the counter table stay monotonic after 0004."""
        conn = empty_db.connect()
        try:
            real = store.migrations()
            with conn, conn.cursor() as cur:  # apply up to 0003 by hand, as an older release did
                cur.execute(store.QUERIES["migrations_table"])
                for migration in real:
                    if migration.version < 4:
                        cur.execute(migration.sql)
                        cur.execute(store.QUERIES["record_migration"],
                                    {"version": migration.version, "name": migration.name})
                cur.execute("INSERT INTO workspaces (id, secret, flags) "
                            "VALUES ('ws', 's', '{\"webhook_outbox\": true}')")
                cur.execute("INSERT INTO event_sequences VALUES ('ws', 41)")
                cur.execute("INSERT INTO events (id, workspace_id, type, sequence, payload) "
                            "VALUES ('old', 'ws', 't', 41, '{}')")
            assert store.migrate(conn) == [m.version for m in real if m.version >= 4]
        finally:
            conn.close()
        assert empty_db.query("SELECT nextval('event_sequence')") == [(42,)]


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
                    outcome.append(store.add_endpoint(second, "ws", self.URL, [], new_secret()))
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
                result: Any = store.add_endpoint(connection, "ws", self.URL, [], new_secret())
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


class LateZone(BaseResolver):  # type: ignore[misc]
    """A real nameserver (dnslib, UDP on loopback): ``*.late.test`` is 127.0.0.1, answered 3 s late."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.port = 0
        self.stop = threading.Event()

    def resolve(self, request, handler):  # type: ignore[no-untyped-def]
        name = str(request.q.qname).rstrip(".").lower()
        self.queries.append(name)
        reply = request.reply()
        if name.endswith(".late.test") and request.q.qtype == QTYPE.A:
            self.stop.wait(3.0)
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("127.0.0.1"), ttl=60))
        return reply


@pytest.fixture
def late_dns() -> Iterator[LateZone]:
    zone = LateZone()
    server = DNSServer(zone, port=0, address="127.0.0.1")
    server.start_thread()
    zone.port = server.server.server_address[1]
    try:
        yield zone
    finally:
        zone.stop.set()
        server.stop()


def legacy_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The ``key=value`` fields of every legacy webhook log line."""
    return [dict(re.findall(r"(\w+)=(\S+)", r.getMessage())) for r in caplog.records
            if r.getMessage().startswith("legacy webhook ")]


class TestFlagOff:
    """``send`` itself POSTs, inline, exactly as the synchronous path did (issue 10, RFC rollout plan)."""

    @pytest.fixture
    def urls(self, db: Database, receiver: Receiver) -> dict[str, str]:
        make_workspace(db, "ws", outbox=False)
        urls = {name: receiver.url(f"/{name}") for name in ["all", "created", "completed", "inactive"]}
        add_endpoint(db, "ws", urls["all"])
        add_endpoint(db, "ws", urls["created"], ["job.created"])
        add_endpoint(db, "ws", urls["completed"], ["job.completed"])
        add_endpoint(db, "ws", urls["inactive"], ["job.created"], active=False)
        return urls

    def test_send_then_commit_posts_once_per_subscribed_endpoint(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        """The drop-in call: ``send(conn, event)`` and the caller's own commit."""
        open_transaction(conn)
        stored = sender.send(conn, job(job_id=42))
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created"], "POSTed before send returned"
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION, "send never commits"
        conn.commit()
        assert (stored.mode, stored.deliveries, stored.legacy_posts) == (None, 0, 2)
        assert isinstance(stored.sequence, int)
        requests = receiver.received()
        assert len(requests) == 2
        for request in requests:
            body = verified(request)
            assert body["sequence"] == stored.sequence
            assert body["id"] == stored.id == request.headers["webhook-id"] == request.headers["idempotency-key"]
            assert (body["type"], body["workspace_id"], body["data"]) == ("job.created", "ws", {"job_id": 42})
            assert request.headers["content-type"] == "application/json"
            assert request.headers["x-larkspur-attempt"] == "1"
        assert nothing_written(db), "the flag-off path touched the outbox"

    def test_transaction_and_after_commit_do_not_send_again(
        self, sender: WebhookSender, conn: CountingConnection, receiver: Receiver, urls: dict[str, str]
    ) -> None:
        with sender.transaction(conn) as tx:
            stored = tx.send(job(type_="job.completed"))
        sender.after_commit(stored)  # callers of the earlier contract still call it
        assert sorted(r.path for r in receiver.received()) == ["/all", "/completed"]

    @pytest.mark.parametrize("shadow_writes", [False, True], ids=["flag off", "shadow writes (phase 0)"])
    def test_a_post_is_not_recalled_when_the_caller_rolls_back(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], shadow_writes: bool,
    ) -> None:
        """Today's behaviour, kept (docs/producer.md): the POST is made inline, before the outcome is known;
        the caller's rollback takes the shadow rows with it."""
        sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=shadow_writes), env={}))
        with pytest.raises(RuntimeError), sender.transaction(conn) as tx:
            tx.send(job())
            raise RuntimeError("domain write failed")
        assert nothing_written(db)
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created"]

    def test_signature_fails_with_another_secret(
        self, sender: WebhookSender, conn: CountingConnection, receiver: Receiver, urls: dict[str, str]
    ) -> None:
        sender.send(conn, job())
        with pytest.raises(WebhookVerificationError):
            verified(receiver.received()[0], secret="some-other-secret")

    def test_failures_are_logged_with_ids_and_never_raised(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        sender = WebhookSender(load_config(write_config(db, producer__legacy_timeout="300ms"), env={}))
        receiver.status["/all"] = 500
        receiver.hang["/slow"] = threading.Event()
        refused = add_endpoint(db, "ws", "http://127.0.0.1:1/refused", ["job.created"])
        slow = add_endpoint(db, "ws", receiver.url("/slow"), ["job.created"])
        caplog.set_level("INFO", logger="dispatcher.producer")
        stored = sender.send(conn, job())
        conn.commit()
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created", "/slow"]
        lines = legacy_lines(caplog)
        by_endpoint = {int(line["endpoint_id"]): line for line in lines}
        assert len(lines) == len(by_endpoint) == 4
        assert {line["workspace_id"] for line in lines} == {"ws"}
        assert {line["event_id"] for line in lines} == {stored.id}
        assert all(line["duration_ms"].isdigit() for line in lines)
        assert sorted(line["status"] for line in lines) == ["200", "500", "connection", "timeout"]
        assert (by_endpoint[refused]["status"], by_endpoint[slow]["status"]) == ("connection", "timeout")

    def test_a_bad_stored_secret_or_url_is_logged_not_raised(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level("INFO", logger="dispatcher.producer")
        add_endpoint(db, "ws", "http://[::1/unparseable", ["job.created"])
        sender.send(conn, job())
        assert sorted(r.path for r in receiver.received()) == ["/all", "/created"]
        db.query("UPDATE workspaces SET secret = 'whsec_not*base64'")
        sender.send(conn, job())
        assert len(receiver.received()) == 2  # nothing sent with a key that cannot be decoded
        statuses = [line["status"] for line in legacy_lines(caplog)]
        assert sorted(statuses) == ["200", "200", "invalid_secret", "invalid_secret", "invalid_secret",
                                    "invalid_url"]

    def test_the_deadline_is_total_not_per_read(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A receiver trickling its answer is cut off at the deadline, in a process gevent never patched."""
        import gevent.monkey

        assert not gevent.monkey.is_module_patched("socket"), "this must run in a plain, unpatched process"
        sender = WebhookSender(load_config(write_config(db, producer__legacy_timeout="500ms"), env={}))
        receiver.behaviour["/trickle"] = "trickle"  # a byte every 50 ms for 10 s: no single read waits 500 ms
        add_endpoint(db, "ws", receiver.url("/trickle"), ["job.created"])
        caplog.set_level("INFO", logger="dispatcher.producer")
        sender.send(conn, job())
        assert sorted(line["status"] for line in legacy_lines(caplog)) == ["200", "200", "timeout"]

    def test_a_name_lookup_fits_the_deadline_and_its_failure_is_cached(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], late_dns: LateZone, caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Two endpoints on a name whose nameserver answers (the receiver's address) only 3 s late, sent
        twice with a 500 ms deadline and a 30 s ``http.dns_timeout``: each POST, its lookup included,
        ends inside its deadline, so the late answer is never used; the failed lookup is asked once."""
        port = receiver.server.server_address[1]
        for path in ("/late1", "/late2"):
            add_endpoint(db, "ws", f"http://one.late.test:{port}{path}", ["job.created"])
        sender = WebhookSender(load_config(write_config(db, producer__legacy_timeout="500ms", http__dns_timeout="30s",
                                                        http__dns_servers=[f"127.0.0.1:{late_dns.port}"]), env={}))
        caplog.set_level("INFO", logger="dispatcher.producer")
        sender.send(conn, job())
        sender.send(conn, job())
        assert sorted(r.path for r in receiver.received()) == ["/all", "/all", "/created", "/created"]
        assert sorted(line["status"] for line in legacy_lines(caplog)) == ["200"] * 4 + ["dns"] * 4
        assert late_dns.queries.count("one.late.test") == 1, late_dns.queries

    def test_the_response_read_is_capped(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        receiver.behaviour["/endless"] = "endless"  # a 256 MiB body
        make_workspace(db, "ws", outbox=False)
        add_endpoint(db, "ws", receiver.url("/endless"))
        sender = WebhookSender(load_config(write_config(db, producer__legacy_timeout="20s"), env={}))
        caplog.set_level("INFO", logger="dispatcher.producer")
        sender.send(conn, job())
        assert [line["status"] for line in legacy_lines(caplog)] == ["200"]
        wait_until(lambda: receiver.aborted, message="the receiver to see the hang-up")
        assert receiver.aborted == ["/endless"], "the whole body was read"

    def test_no_redirects_are_followed(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        make_workspace(db, "ws", outbox=False)
        add_endpoint(db, "ws", receiver.url("/moved"))
        receiver.behaviour["/moved"] = "redirect"  # 307 to /all
        caplog.set_level("INFO", logger="dispatcher.producer")
        sender.send(conn, job())
        assert [r.path for r in receiver.received()] == ["/moved"]
        assert [line["status"] for line in legacy_lines(caplog)] == ["307"]

    @pytest.mark.parametrize("target", ["receiver", "http://169.254.169.254/latest/meta-data/"])
    def test_the_outbound_policy_refuses_private_and_metadata_targets(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        caplog: pytest.LogCaptureFixture, target: str,
    ) -> None:
        make_workspace(db, "ws", outbox=False)
        add_endpoint(db, "ws", receiver.url("/all") if target == "receiver" else target)
        sender = WebhookSender(load_config(write_config(db, http={"allow_private_networks": False}), env={}))
        caplog.set_level("INFO", logger="dispatcher.producer")
        sender.send(conn, job())
        assert receiver.received() == []
        assert [line["status"] for line in legacy_lines(caplog)] == ["blocked"]

    def test_no_post_when_the_flag_is_on(self, db: Database, sender: WebhookSender, conn: CountingConnection,
                                         receiver: Receiver, urls: dict[str, str]) -> None:
        set_outbox_flag(db, "ws", True)
        with sender.transaction(conn) as tx:
            stored = tx.send(job())
        assert (stored.mode, stored.deliveries, stored.legacy_posts) == ("live", 2, 0)
        assert receiver.received() == []
        assert count(db, "webhook_deliveries", "mode = 'live'") == 2

    def test_rotated_secret_signs_with_both_inside_the_grace(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        new_secret = "whsec_" + "bmV3LXNlY3JldC1rZXktYnl0ZXM="
        with admin(db) as connection:
            store.rotate_workspace_secret(connection, "ws", new_secret)
        sender.send(conn, job(type_="technician.location"))
        (request,) = receiver.received()
        assert verified(request, SECRET) == verified(request, new_secret)
        assert len(request.headers["webhook-signature"].split()) == 2

        db.query("UPDATE workspaces SET secret_rotated_at = now() - interval '25 hours'")
        sender.send(conn, job(type_="technician.location"))
        latest = receiver.received()[-1]
        verified(latest, new_secret)
        with pytest.raises(WebhookVerificationError):
            verified(latest, SECRET)


    def test_an_endpoints_own_secret_signs_its_legacy_post(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str],
    ) -> None:
        from dispatcher.store import endpoints

        ((own,),) = db.query("SELECT id FROM webhook_endpoints WHERE url = %s", (urls["all"],))
        endpoint_secret = "whsec_" + "ZW5kcG9pbnQtc2VjcmV0LWtleS1ieXRlcy0zMg=="
        with admin(db) as connection:
            endpoints.rotate_endpoint_secret(connection, None, own, endpoint_secret, 3600.0, token_id=None)
        sender.send(conn, job())
        by_path = {r.path: r for r in receiver.received()}
        # The rotated endpoint: its new secret and, inside the grace, the workspace secret it signed with.
        assert verified(by_path["/all"], endpoint_secret) == verified(by_path["/all"], SECRET)
        verified(by_path["/created"], SECRET)
        with pytest.raises(WebhookVerificationError):
            verified(by_path["/created"], endpoint_secret)
        # Past secrets.rotation_grace (24 h): only the endpoint's secret signs.
        db.query("UPDATE webhook_endpoints SET secret_rotated_at = now() - interval '25 hours'")
        sender.send(conn, job())
        latest = [r for r in receiver.received() if r.path == "/all"][-1]
        verified(latest, endpoint_secret)
        with pytest.raises(WebhookVerificationError):
            verified(latest, SECRET)

    def test_an_empty_secret_never_produces_an_unsigned_legacy_post(
        self, db: Database, sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        urls: dict[str, str], caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level("INFO", logger="dispatcher.producer")
        db.query("ALTER TABLE workspaces DROP CONSTRAINT workspaces_secret_not_empty")  # as before 0010
        db.query("UPDATE workspaces SET secret = 'whsec_'")
        sender.send(conn, job())
        assert receiver.received() == []
        assert {line["status"] for line in legacy_lines(caplog)} == {"invalid_secret"}


class TestProducerTimer:
    """``webhook_producer_send_seconds.<path>`` and the outbox write, to a real UDP statsd listener."""

    @pytest.fixture
    def statsd_socket(self) -> Iterator[socket.socket]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        yield sock
        sock.close()

    def test_send_is_timed_by_path(self, db: Database, write_config: WriteConfig, conn: CountingConnection,
                                   statsd_socket: socket.socket) -> None:
        make_workspace(db, "on", outbox=True)
        make_workspace(db, "off", outbox=False)
        port = statsd_socket.getsockname()[1]
        config = write_config(db, statsd={"enabled": True, "host": "127.0.0.1", "port": port, "prefix": "p",
                                          "tags": "none"},
                              producer__shadow_writes=True)
        sender = WebhookSender(load_config(config, env={}))
        sender.send(conn, job("on"))
        sender.send(conn, job("off"))
        lines: list[str] = []
        while len(lines) < 4:  # one datagram per send(), a line per timer
            lines += statsd_socket.recv(2048).decode().splitlines()
        names = sorted(line.split(":")[0] for line in lines)
        assert names == ["p.webhook_producer_outbox_write_seconds", "p.webhook_producer_outbox_write_seconds",
                         "p.webhook_producer_send_seconds.live", "p.webhook_producer_send_seconds.shadow"]
        assert all(line.endswith("|ms") for line in lines)


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
        # What another session sees when the POST arrives: nothing yet, the
        # POST is inline in send(), as the synchronous path always was.
        receiver.on_request = lambda request: count(db, "webhook_deliveries", "mode = 'shadow'")
        with shadow_sender.transaction(conn) as tx:
            stored = tx.send(job())
        assert (stored.mode, stored.deliveries, stored.legacy_posts) == ("shadow", 2, 2)
        assert stored.sequence is not None
        rows = db.query("SELECT endpoint_id, mode, status FROM webhook_deliveries WHERE event_id = %s", (stored.id,))
        assert sorted(rows) == sorted([(endpoints["all"], "shadow", "pending"),
                                       (endpoints["created"], "shadow", "pending")])
        assert count(db, "events", "id = %s", (stored.id,)) == 1
        requests = receiver.received()
        assert sorted(r.path for r in requests) == ["/all", "/created"]
        assert all(verified(r)["id"] == stored.id for r in requests)
        assert [r.seen_by_db for r in requests] == [0, 0], "the POST waited for the commit"

    def test_legacy_log_line_names_workspace_endpoint_and_event(
        self, db: Database, shadow_sender: WebhookSender, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int], caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level("INFO", logger="dispatcher.producer")
        receiver.status["/created"] = 503
        stored = shadow_sender.send(conn, job())
        conn.commit()
        lines = sorted(legacy_lines(caplog), key=lambda line: int(line["endpoint_id"]))
        assert [(line["workspace_id"], int(line["endpoint_id"]), line["event_id"], line["status"])
                for line in lines] == [("ws", endpoints["all"], stored.id, "200"),
                                       ("ws", endpoints["created"], stored.id, "503")]
        assert all(line["duration_ms"].isdigit() for line in lines)

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


# ---------------------------------------------------------------- flag off: the body and the shadow write


@pytest.fixture
def statsd_socket() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def statsd_lines(sock: socket.socket, want: Callable[[list[str]], bool]) -> list[str]:
    """Lines read from ``sock`` until ``want`` holds of them (each read waits up to the socket's timeout)."""
    lines: list[str] = []
    while not want(lines):
        lines += sock.recv(4096).decode().splitlines()
    return lines


def skipped_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The ``key=value`` fields of every WARNING about what a flag-off send could not write."""
    return [dict(re.findall(r"(\w+)=(\S+)", r.getMessage())) for r in caplog.records
            if r.levelname == "WARNING" and r.getMessage().startswith("flag-off send ")]


class TestFlagOffSequence:
    """Every body carries a sequence, flag on or off, shadow writes on or off (docs/decisions.md, Sequence in
    every body), from the same SEQUENCE as the outbox path: producers of one workspace never wait for each other."""

    @pytest.fixture
    def endpoints(self, db: Database, receiver: Receiver) -> dict[str, int]:
        make_workspace(db, "ws", outbox=False)
        return {"all": add_endpoint(db, "ws", receiver.url("/all"))}

    @pytest.mark.parametrize("shadow_writes", [False, True], ids=["flag off", "shadow writes (phase 0)"])
    def test_every_flag_off_body_carries_an_increasing_sequence(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int], shadow_writes: bool,
    ) -> None:
        sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=shadow_writes), env={}))
        with sender.transaction(conn) as tx:
            sent = [tx.send(job(n=n)) for n in range(3)]
        bodies = [json.loads(r.body) for r in receiver.received()]
        assert [body["id"] for body in bodies] == [stored.id for stored in sent]
        sequences = [body["sequence"] for body in bodies]
        assert all(isinstance(sequence, int) for sequence in sequences), sequences
        assert sequences == sorted(set(sequences)), "unique and increasing in allocation order"
        assert sequences == [stored.sequence for stored in sent]
        stored_rows = dict(db.query("SELECT id, sequence FROM events"))
        assert stored_rows == ({stored.id: stored.sequence for stored in sent} if shadow_writes else {})

    @pytest.mark.parametrize("shadow_writes", [False, True], ids=["flag off", "shadow writes (phase 0)"])
    def test_an_open_transaction_does_not_block_another_flag_off_producer(
        self, db: Database, write_config: WriteConfig, receiver: Receiver, endpoints: dict[str, int],
        shadow_writes: bool,
    ) -> None:
        sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=shadow_writes), env={}))
        first, second = db.connect(), db.connect()
        try:
            held, passed = send_past_an_open_transaction(sender, first, second)
            first.commit()
        finally:
            first.close()
            second.close()
        assert [json.loads(r.body)["sequence"] for r in receiver.received()] == [held.sequence, passed.sequence]

    @pytest.mark.parametrize("shadow_writes", [False, True], ids=["flag off", "shadow writes (phase 0)"])
    def test_a_read_only_transaction_still_gets_its_post(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int], shadow_writes: bool, statsd_socket: socket.socket,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Postgres refuses nextval and inserts in a read-only transaction: that send numbers and writes
        nothing, and the POST goes out as it always did (without a sequence); logged, and counted when a
        shadow row was due."""
        statsd = {"enabled": True, "host": "127.0.0.1", "port": statsd_socket.getsockname()[1], "tags": "dogstatsd"}
        config = write_config(db, producer__shadow_writes=shadow_writes, statsd=statsd)
        sender = WebhookSender(load_config(config, env={}))
        caplog.set_level("INFO", logger="dispatcher.producer")
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
        stored = sender.send(conn, job())
        (request,) = receiver.received()
        assert json.loads(request.body)["sequence"] is None
        assert (stored.mode, stored.sequence, stored.deliveries, stored.legacy_posts) == (None, None, 0, 1)
        with conn.cursor() as cur:  # the caller's transaction is not aborted
            cur.execute("SELECT 1")
        conn.commit()
        assert nothing_written(db)
        assert [(line["workspace_id"], line["event_id"], line["reason"]) for line in skipped_lines(caplog)] == [
            ("ws", stored.id, "read_only")]
        counted = [line for line in statsd_lines(statsd_socket, lambda got: len(got) >= 1 + shadow_writes)
                   if line.startswith("webhook_producer_shadow_skipped_total")]
        assert counted == (["webhook_producer_shadow_skipped_total:1|c|#reason:read_only,region:test"]
                           if shadow_writes else [])


class TestReusedIdWithTheFlagOff:
    """On the flag-off path the POST is always made: a shadow row that cannot be written is skipped,
    logged and counted (docs/producer.md, "A shadow row that cannot be written")."""

    @pytest.fixture
    def endpoints(self, db: Database, receiver: Receiver) -> dict[str, int]:
        make_workspace(db, "ws", outbox=False)
        return {"all": add_endpoint(db, "ws", receiver.url("/all")),
                "created": add_endpoint(db, "ws", receiver.url("/created"), ["job.created"])}

    def test_a_reused_event_id_still_posts_and_skips_the_shadow_rows(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int], statsd_socket: socket.socket, caplog: pytest.LogCaptureFixture,
    ) -> None:
        statsd = {"enabled": True, "host": "127.0.0.1", "port": statsd_socket.getsockname()[1], "prefix": "p",
                  "tags": "none"}
        sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=True, statsd=statsd), env={}))
        caplog.set_level("INFO", logger="dispatcher.producer")
        first = sender.send(conn, Event("ws", "job.created", {"n": 1}, id="evt_1"))
        conn.commit()
        open_transaction(conn)
        again = sender.send(conn, Event("ws", "job.created", {"n": 2}, id="evt_1"))
        assert (again.mode, again.deliveries, again.legacy_posts) == (None, 0, 2)
        assert first.sequence is not None and again.sequence is not None and again.sequence > first.sequence
        requests = receiver.received()
        assert sorted(r.path for r in requests) == ["/all", "/all", "/created", "/created"]
        latest = [verified(r) for r in requests[2:]]
        assert latest == [{"id": "evt_1", "type": "job.created", "workspace_id": "ws", "sequence": again.sequence,
                           "occurred_at": latest[0]["occurred_at"], "data": {"n": 2}}] * 2
        assert [(line["workspace_id"], line["event_id"], line["reason"]) for line in skipped_lines(caplog)] == [
            ("ws", "evt_1", "duplicate_id")]
        # The caller's transaction lives on: its next event is written as usual.
        sender.send(conn, Event("ws", "job.created", {"n": 3}, id="evt_2"))
        conn.commit()
        assert sorted(db.query("SELECT id, payload FROM events")) == [("evt_1", {"n": 1}), ("evt_2", {"n": 3})]
        assert sorted(db.query("SELECT event_id, count(*) FROM webhook_deliveries GROUP BY event_id")) == [
            ("evt_1", 2), ("evt_2", 2)]
        lines = statsd_lines(statsd_socket, lambda got: sum("send_seconds" in line for line in got) >= 3)
        assert [line for line in lines if "shadow_skipped" in line] == [
            "p.webhook_producer_shadow_skipped_total.duplicate_id:1|c"]

    def test_the_flag_on_path_still_refuses_a_reused_id(
        self, db: Database, write_config: WriteConfig, conn: CountingConnection, receiver: Receiver,
        endpoints: dict[str, int],
    ) -> None:
        sender = WebhookSender(load_config(write_config(db, producer__shadow_writes=True), env={}))
        set_outbox_flag(db, "ws", True)
        sender.send(conn, Event("ws", "job.created", {"n": 1}, id="evt_1"))
        conn.commit()
        with pytest.raises(ProducerError, match="already has an event with id 'evt_1'"):
            sender.send(conn, Event("ws", "job.created", {"n": 2}, id="evt_1"))
        assert receiver.received() == []
