"""Every metric a running dispatcher sends, checked over real UDP against the
table in docs/metrics.md: name, statsd type, tag keys and unit, in both
``statsd.tags`` modes.  And the breaker gauge's rule: 1 while open or
half-open, 0 once closed, never stuck."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from dispatcher import Event, WebhookSender
from dispatcher.config import config_from_mapping
from dispatcher.engine.upkeep import Upkeep
from dispatcher.metrics import Metrics
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, wait_until
from tests.support.metricsdoc import EMITTERS, Row, documented

pytestmark = pytest.mark.timeout(180)

SLOW = 1.0  # seconds the slow endpoints take: a lower bound on their latency, whatever the unit


@dataclass(frozen=True)
class Line:
    name: str
    value: float
    kind: str
    tags: dict[str, str]


def parse(packet: str) -> list[Line]:
    lines = []
    for text in packet.splitlines():
        match = re.fullmatch(r"([^:|#]+):([0-9.]+)\|(c|g|h|ms|d)(?:\|#(.*))?", text)
        assert match, f"not a statsd line: {text!r}"
        tags = dict(tag.split(":", 1) for tag in match.group(4).split(",")) if match.group(4) else {}
        lines.append(Line(match.group(1), float(match.group(2)), match.group(3), tags))
    return lines


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(SLOW)
        self.send_response(200 if self.path == "/ok" else 500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    yield sock
    sock.close()


def receive(sock: socket.socket, into: list[Line]) -> None:
    try:
        into.extend(parse(sock.recv(65536).decode("ascii")))
    except TimeoutError:
        pass


def plain_pattern(plain: str, prefix: str) -> re.Pattern[str]:
    parts = re.split(r"(<p>|<\w+>)", plain)
    body = "".join(re.escape(prefix) if part == "<p>" else "([^.]+)" if part.startswith("<") else re.escape(part)
                   for part in parts)
    return re.compile(body)


@pytest.mark.parametrize("mode", ["dogstatsd", "none"])
def test_every_documented_metric_arrives_as_documented(mode: str, db, write_config, tmp_path: Path,
                                                       slow_server: str, listener: socket.socket) -> None:
    ok, failing = seed_workspace(db.dsn, "ws", [f"{slow_server}/ok", f"{slow_server}/fail"])
    config = write_config(db, statsd={"enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1],
                                      "prefix": "dx.test", "tags": mode},
                          alerts={"check_interval": "200ms"}, breaker={"failure_threshold": 1, "open_for": "1s"},
                          retry={"base": "1s"}, workers={"status_interval": "200ms"})
    produce(config, db.dsn, "ws", 3)
    rows = [row for row in documented() if row.sent_by in EMITTERS]
    assert len(rows) >= 9
    seen: list[Line] = []

    def matches(row: Row) -> list[Line]:
        if mode == "dogstatsd":
            return [line for line in seen if line.name == row.name]
        pattern = plain_pattern(row.plain, "dx.test")
        return [line for line in seen if pattern.fullmatch(line.name)]

    with Dispatcher(config, tmp_path / "d.log"):
        def all_seen() -> bool:
            receive(listener, seen)
            return all(matches(row) for row in rows) and any(
                line.value > 0 for row in rows if row.name == "webhook_breaker_open" for line in matches(row))
        wait_until(all_seen, timeout=60, message="every documented metric")

    for row in rows:
        for line in matches(row):
            if mode == "dogstatsd":
                assert line.kind == row.kind, (row.name, line)
                assert set(line.tags) == row.tags, (row.name, line.tags)
                assert line.tags["region"] == "test"
            else:
                assert line.kind == row.plain_kind and not line.tags, (row.name, line)
    latency = [line for line in seen if "webhook_delivery_latency_seconds" in line.name]
    # Unit: the slow endpoints take SLOW seconds at least, and http.timeout (2 s) at most.
    scale = 1.0 if mode == "dogstatsd" else 1000.0
    assert max(line.value for line in latency) >= SLOW * scale
    assert all(line.value < 60 * scale for line in latency)
    breaker = [line for line in seen if ("webhook_breaker_open" in line.name and "total" not in line.name
                                         and "breakers" not in line.name)]
    endpoints = {line.tags["endpoint"] if line.tags else line.name.rsplit(".", 1)[1] for line in breaker}
    assert endpoints == {str(failing)}, "only the failing endpoint's breaker ever opened"
    # It failed on every probe, so its breaker was never closed: the gauge never said so.
    assert {line.value for line in breaker} == {1.0}


@pytest.mark.parametrize("state", ["open", "half_open"])
def test_leader_publishes_1_while_not_closed_and_0_once_closed(state: str, db, listener: socket.socket) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {
        "enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1], "tags": "dogstatsd"}}, env={})
    upkeep = Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd, config.region))

    def round_() -> dict[str, float]:
        upkeep.run_once()
        lines: list[Line] = []
        while True:
            before = len(lines)
            receive(listener, lines)
            if len(lines) == before:
                break
        return {line.tags.get("endpoint", line.name): line.value for line in lines
                if line.name in ("webhook_breaker_open", "webhook_breakers_open")}

    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, open_until) VALUES (%s, %s, now())",
          (endpoint, state))
    assert round_() == {str(endpoint): 1.0, "webhook_breakers_open": 1.0}
    query(db.dsn, "UPDATE endpoint_state SET state = 'closed'")
    assert round_() == {str(endpoint): 0.0, "webhook_breakers_open": 0.0}, "the gauge must not stick at 1"


def test_a_new_leader_resets_breakers_that_closed_today(db, listener: socket.socket) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/a"])
    query(db.dsn, "INSERT INTO endpoint_state (endpoint_id, state, opened_at) VALUES (%s, 'closed', now())",
          (endpoint,))
    config = config_from_mapping({"region": "test", "database": {"dsn": db.dsn}, "statsd": {
        "enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1], "tags": "dogstatsd"}}, env={})
    Upkeep(config, EngineStore(ManagedConnection(db.dsn, "test")), Metrics(config.statsd, config.region)).run_once()
    lines: list[Line] = []
    wait_until(lambda: receive(listener, lines) or any(line.name == "webhook_breaker_open" for line in lines),
               message="the breaker gauge")
    assert [(line.tags["endpoint"], line.value) for line in lines if line.name == "webhook_breaker_open"] == [
        (str(endpoint), 0.0)]


@pytest.mark.parametrize("mode", ["dogstatsd", "none"])
def test_the_producer_timers_arrive_as_documented(mode: str, db, listener: socket.socket) -> None:
    seed_workspace(db.dsn, "live", [])
    seed_workspace(db.dsn, "legacy", [], outbox=False)
    config = config_from_mapping({
        "region": "test", "database": {"dsn": db.dsn},
        "statsd": {"enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1], "prefix": "dx.test",
                   "tags": mode},
        "producer": {"shadow_writes": True}})
    sender = WebhookSender(config)
    conn = psycopg2.connect(db.dsn)
    try:
        # The last one reuses an id: its shadow row is skipped, and counted.
        for workspace, event_id in (("live", "e1"), ("legacy", "e1"), ("legacy", "e1")):
            with conn:
                sender.send(conn, Event(workspace, "job.created", {"n": 1}, id=event_id))
    finally:
        conn.close()
    rows = [row for row in documented() if row.sent_by == "producer"]
    assert {row.name for row in rows} == {"webhook_producer_send_seconds", "webhook_producer_outbox_write_seconds",
                                          "webhook_producer_shadow_skipped_total"}
    seen: list[Line] = []
    wait_until(lambda: receive(listener, seen) or len(seen) >= 6, message="the producer's five timers, one count")
    for row in rows:
        if mode == "dogstatsd":
            lines = [line for line in seen if line.name == row.name]
            assert lines and all(line.kind == row.kind and set(line.tags) == row.tags for line in lines), (row, seen)
        else:
            pattern = plain_pattern(row.plain, "dx.test")
            lines = [line for line in seen if pattern.fullmatch(line.name)]
            assert lines and all(line.kind == row.plain_kind and not line.tags for line in lines), (row, seen)
    modes = sorted(line.tags["mode"] if line.tags else line.name.rsplit(".", 1)[1]
                   for line in seen if "send_seconds" in line.name)
    assert modes == ["live", "off", "shadow"]
    skipped = [line for line in seen if "shadow_skipped" in line.name]
    assert [(line.tags.get("reason") or line.name.rsplit(".", 1)[1], line.value) for line in skipped] == [
        ("duplicate_id", 1.0)]
