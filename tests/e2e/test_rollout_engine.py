"""Dry run and rollback with a real dispatcher, a real receiver and a real Postgres (issue 10)."""

from __future__ import annotations

import json
import re
import socket
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg2
import pytest

from dispatcher import Event, WebhookSender, load_config
from dispatcher.runtime.supervisor import DRY_RUN_WARNING
from dispatcher_devtools import kit

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def receiver() -> Iterator[kit.CaptureServer]:
    with kit.capture_server() as server:
        yield server


def url(server: kit.CaptureServer, path: str) -> str:
    return f"{server.url}/{path}"


def posts(server: kit.CaptureServer, path: str) -> int:
    return server.posts(f"/{path}")


def test_dry_run_sends_live_rows_and_marks_only_shadow_rows(db, write_config, tmp_path: Path,
                                                           receiver: kit.CaptureServer) -> None:
    kit.seed_workspace(db.dsn, "live", [url(receiver, "live")])
    kit.seed_workspace(db.dsn, "legacy", [url(receiver, "shadow")], outbox=False)
    kit.produce(write_config(db), db.dsn, "live", 3)
    kit.produce(write_config(db, producer={"shadow_writes": True}), db.dsn, "legacy", 2)
    assert posts(receiver, "shadow") == 2  # the flag-off path posted inline
    with kit.Dispatcher(write_config(db, dry_run=True), tmp_path / "d.log") as dispatcher:
        kit.wait_until(lambda: kit.status_counts(db.dsn) == {"delivered": 3, "shadow": 2},
                       message="3 rows delivered, 2 marked")
        log = dispatcher.log()
    assert posts(receiver, "live") == 3, "a live row was marked delivered without a POST"
    assert posts(receiver, "shadow") == 2, "a shadow row was sent"
    assert kit.query(db.dsn, "SELECT d.mode, count(a.status_code) FROM webhook_deliveries d "
                         "LEFT JOIN webhook_delivery_attempts a ON a.delivery_id = d.id "
                         "GROUP BY d.mode ORDER BY d.mode") == [("live", 3), ("shadow", 0)]
    (line,) = [line for line in log.splitlines() if DRY_RUN_WARNING in line]
    assert " WARNING " in line and "dispatcher.supervisor" in line


@pytest.mark.parametrize("switch_off", ["flag", "percent"])
def test_turning_the_outbox_off_leaves_queued_rows_draining(db, write_config, tmp_path: Path,
                                                           receiver: kit.CaptureServer, switch_off: str) -> None:
    kit.seed_workspace(db.dsn, "ws", [url(receiver, "a"), url(receiver, "b")])
    if switch_off == "percent":  # in by the percentage, not by its flag
        kit.query(db.dsn, "UPDATE workspaces SET flags = '{}'")
        kit.query(db.dsn, "UPDATE rollout_settings SET percent = 100")
    config = write_config(db)
    event_ids = kit.produce(config, db.dsn, "ws", 10)
    assert kit.status_counts(db.dsn) == {"pending": 20}
    if switch_off == "flag":
        kit.query(db.dsn, "UPDATE workspaces SET flags = flags || '{\"webhook_outbox\": false}'")
    else:
        kit.query(db.dsn, "UPDATE rollout_settings SET percent = 0")
    with kit.Dispatcher(config, tmp_path / "d.log"):
        kit.wait_until(lambda: kit.status_counts(db.dsn).get("delivered") == 20, message="20 rows drained")
    assert (posts(receiver, "a"), posts(receiver, "b")) == (10, 10)
    assert len(event_ids) == 10


# ---------------------------------------------------------------- the flag-off body is the engine's body

BODY_FIELDS = ["id", "type", "workspace_id", "sequence", "occurred_at", "data"]
SAME_HEADERS = ("Content-Type", "User-Agent", "Idempotency-Key", "webhook-id", "X-Larkspur-Attempt")


def send_once(config: Path, dsn: str, event: Event) -> int | None:
    """``WebhookSender.send`` in a transaction of its own; the event's sequence."""
    conn = psycopg2.connect(dsn)
    try:
        with WebhookSender(load_config(config, env={})).transaction(conn) as tx:
            return tx.send(event).sequence
    finally:
        conn.close()


@pytest.mark.parametrize("shadow_writes", [False, True], ids=["flag off", "shadow writes (phase 0)"])
def test_the_flag_off_body_is_the_engines_body_field_by_field(db, write_config, tmp_path: Path,
                                                             receiver: kit.CaptureServer, shadow_writes: bool) -> None:
    """The same event, POSTed by the flag-off path and then by a dispatcher: the same six fields in the
    same order, each equal; the sequence the very number the event row holds (shadow writes), or the
    number of its own send, taken from the same SEQUENCE (no shadow write: nothing is stored)."""
    (endpoint,) = kit.seed_workspace(db.dsn, "ws", [url(receiver, "hook")], outbox=False)
    event = Event("ws", "job.completed", {"z": 1, "a": [1.5, "ü", None], "nested": {"b": True}}, id="evt-body-1",
                  occurred_at=datetime(2026, 9, 22, 8, 30, 5, 123456, tzinfo=UTC))
    legacy_sequence = send_once(write_config(db, producer={"shadow_writes": shadow_writes}), db.dsn, event)
    kit.query(db.dsn, "UPDATE workspaces SET flags = '{\"webhook_outbox\": true}'")
    if shadow_writes:  # the engine sends the stored event: a live row for it, as a replay writes one
        kit.query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                          "VALUES ('ws', %s, 'evt-body-1', 'h')", (endpoint,))
        engine_sequence = legacy_sequence
    else:  # nothing was stored: the same event, sent again with the outbox on
        engine_sequence = send_once(write_config(db), db.dsn, event)
    with kit.Dispatcher(write_config(db), tmp_path / "d.log"):
        kit.wait_until(lambda: posts(receiver, "hook") == 2, message="the engine's POST")
    legacy, engine = receiver.captured
    ours, theirs = json.loads(legacy.body), json.loads(engine.body)
    assert list(ours) == list(theirs) == BODY_FIELDS
    for field in BODY_FIELDS:
        if field != "sequence":
            assert ours[field] == theirs[field], field
    assert isinstance(ours["sequence"], int) and isinstance(theirs["sequence"], int)
    assert (ours["sequence"], theirs["sequence"]) == (legacy_sequence, engine_sequence)
    if not shadow_writes:
        assert ours["sequence"] < theirs["sequence"], "allocation order"
    # Byte for byte, once the sequence is the engine's.
    assert re.sub(rb'"sequence":\d+', b'"sequence":%d' % theirs["sequence"], legacy.body) == engine.body
    for header in SAME_HEADERS:
        assert legacy.headers[header] == engine.headers[header], header


# ---------------------------------------------------------------- shadow rows are never deliveries


def statsd_counts(sock: socket.socket) -> Counter[tuple[str, str]]:
    """(name, the tags but region) -> summed value of every DogStatsD line read from ``sock`` until it goes quiet."""
    seen: Counter[tuple[str, str]] = Counter()
    while True:
        try:
            packet = sock.recv(65536).decode()
        except TimeoutError:
            return seen
        for line in packet.splitlines():
            head, _, tags = line.partition("|#")
            name, _, value = head.partition(":")
            labels = ",".join(tag for tag in tags.split(",") if not tag.startswith("region:"))
            seen[(name, labels)] += int(float(value.split("|")[0])) if "|c" in head else 1


def test_shadow_rows_are_never_counted_as_deliveries(db, write_config, tmp_path: Path,
                                                      receiver: kit.CaptureServer) -> None:
    """3 live events to one endpoint, 3 flag-off events to three (9 shadow rows): exactly 3 deliveries,
    in the attempt history, the counter, the latency samples and the attempt log; 9 rows marked shadow."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(1.0)
    statsd = {"enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1], "tags": "dogstatsd"}
    kit.seed_workspace(db.dsn, "live", [url(receiver, "live")])
    kit.seed_workspace(db.dsn, "legacy", [url(receiver, f"legacy{n}") for n in range(3)], outbox=False)
    live_ids = kit.produce(write_config(db), db.dsn, "live", 3)
    kit.produce(write_config(db, producer={"shadow_writes": True}), db.dsn, "legacy", 3)
    statsd_counts(listener)  # the producers' own timers: not the dispatcher's to count
    try:
        with kit.Dispatcher(write_config(db, dry_run=True, statsd=statsd), tmp_path / "d.log") as dispatcher:
            kit.wait_until(lambda: kit.status_counts(db.dsn) == {"delivered": 3, "shadow": 9},
                           message="3 rows delivered, 9 marked shadow")
        log = dispatcher.log()
        seen = statsd_counts(listener)
    finally:
        listener.close()
    assert posts(receiver, "live") == 3 and sum(posts(receiver, f"legacy{n}") for n in range(3)) == 9
    assert kit.query(db.dsn, "SELECT d.mode, d.status, a.result, count(*), count(d.delivered_at) "
                             "FROM webhook_deliveries d JOIN webhook_delivery_attempts a ON a.delivery_id = d.id "
                             "GROUP BY 1, 2, 3 ORDER BY 1") == [("live", "delivered", "delivered", 3, 3),
                                                                ("shadow", "shadow", "shadow", 9, 0)]
    attempts = {labels: n for (name, labels), n in seen.items() if name == "webhook_delivery_attempts_total"}
    assert attempts == {"result:delivered": 3, "result:shadow": 9}
    latency = {labels: n for (name, labels), n in seen.items() if name == "webhook_delivery_latency_seconds"}
    assert latency == {"stage:attempt": 3, "stage:commit_to_2xx": 3}, "a shadow row is no latency sample"
    lines = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in log.splitlines() if " attempt event_id=" in line]
    assert Counter((line["status"], line["result"]) for line in lines) == {("delivered", "delivered"): 3,
                                                                           ("shadow", "shadow"): 9}
    assert sorted(line["event_id"] for line in lines if line["status"] == "delivered") == sorted(live_ids)
