"""The engine end to end: a real dispatcher, a real receiver, a real Postgres."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import psycopg2
import pytest
from standardwebhooks import Webhook

from dispatcher import Event, WebhookSender, load_config
from dispatcher.rules import partitions
from dispatcher.signing import as_standard_secret
from dispatcher_devtools.kit import (
    SECRET,
    CaptureServer,
    Dispatcher,
    SessionActivity,
    capture_server,
    produce,
    query,
    seed_workspace,
    seed_workspaces,
    status_counts,
    wait_until,
)
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx


@pytest.fixture
def capturing_server() -> Iterator[CaptureServer]:
    with capture_server() as server:
        yield server


def test_delivers_signed_posts_with_every_header(db, write_config, tmp_path: Path,
                                                 capturing_server: CaptureServer) -> None:
    seed_workspace(db.dsn, "ws", [f"{capturing_server.url}/hook"])
    config = write_config(db)
    event_ids = produce(config, db.dsn, "ws", 5, payload={"job": "j-1", "note": "ünïcode"})
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 5, message="5 deliveries")
    captured = capturing_server.captured
    assert sorted(h["webhook-id"] for _, h, _ in captured) == sorted(event_ids)
    verifier = Webhook(as_standard_secret(SECRET))
    for _, headers, body in captured:
        payload = verifier.verify(body, {k.lower(): v for k, v in headers.items()})
        assert payload["id"] == headers["webhook-id"] == headers["Idempotency-Key"]
        assert payload["data"] == {"job": "j-1", "note": "ünïcode"}
        assert payload["type"] == "job.created" and payload["workspace_id"] == "ws"
        assert headers["X-Larkspur-Attempt"] == "1"
        assert headers["X-Larkspur-Signature"] == headers["webhook-signature"]
        assert headers["Content-Type"] == "application/json"
        assert headers["User-Agent"].startswith("Larkspur-Webhooks/")
    attempts = query(db.dsn, "SELECT result, status_code, attempt FROM webhook_delivery_attempts")
    assert sorted(attempts) == [("delivered", 200, 1)] * 5


def test_one_event_id_in_two_workspaces_is_delivered_to_each_with_its_own_event(
        db, write_config, tmp_path: Path, capturing_server: CaptureServer) -> None:
    """Event ids are unique per workspace (migration 0009).  The rows of both events are
    claimed together, two endpoints each, and every POST carries its own workspace's
    event: the claim looks events up, and shares one payload string, by (workspace, id)."""
    workspaces = ("acme", "globex")
    conn = psycopg2.connect(db.dsn)
    try:
        seed_workspaces(conn, {ws: [f"{capturing_server.url}/{ws}/{n}" for n in (1, 2)] for ws in workspaces})
        config = write_config(db)
        with WebhookSender(load_config(config, env={})).transaction(conn) as tx:
            for ws in workspaces:
                tx.send(Event(ws, f"job.{ws}", {"of": ws}, id="evt_shared"))
    finally:
        conn.close()
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 4, message="4 deliveries")
    verifier = Webhook(as_standard_secret(SECRET))
    seen = []
    for path, headers, body in capturing_server.captured:
        event = verifier.verify(body, {k.lower(): v for k, v in headers.items()})
        seen.append((path, headers["webhook-id"], event["workspace_id"], event["type"], event["data"]))
    assert sorted(seen) == [(f"/{ws}/{n}", "evt_shared", ws, f"job.{ws}", {"of": ws})
                            for ws in workspaces for n in (1, 2)]


def test_retries_with_growing_gaps_then_dead(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("status", "down", code=500)])
    config = write_config(db, retry={"base": "200ms", "max_interval": "1s", "ceiling": "4s", "jitter": 0},
                          workers={"processes": 1, "poll_interval": "50ms", "lease": "10s"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        # Produce once the worker is up, so the schedule starts at the first attempt.
        wait_until(lambda: "started (client=" in dispatcher.log(), message="the worker to start")
        produce(config, db.dsn, "ws", 1)
        wait_until(lambda: status_counts(db.dsn).get("dead") == 1, timeout=30, message="the row to die")
    (created, last_error, attempt), = query(
        db.dsn, "SELECT extract(epoch FROM created_at)::float8, last_error, attempt FROM webhook_deliveries")
    starts = [r[0] for r in query(
        db.dsn, "SELECT extract(epoch FROM started_at)::float8 FROM webhook_delivery_attempts ORDER BY attempt")]
    assert last_error == "HTTP 500" and attempt == len(starts) >= 5
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # Nominal gaps 0.2, 0.4, 0.8, then 1.0 (the cap) ... and a final attempt at the ceiling.
    assert gaps[0] < gaps[1] < gaps[2], gaps
    assert max(gaps) < 1.5, "the cap holds"
    assert 3.5 <= starts[-1] - created <= 4.5, "the last attempt lands at the ceiling"


def test_location_events_are_not_retried(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("status", "down", code=503)])
    config = write_config(db, retry={"base": "100ms", "policies": {"technician.location": {"max_attempts": 1}}})
    produce(config, db.dsn, "ws", 3, event_type="technician.location")
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("dead") == 3, message="3 dead location rows")
    assert query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts")[0][0] == 3
    assert receiver.endpoint("down")["count"] == 3


def test_concurrency_cap_per_endpoint(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("latency", "slow", ms=300)])
    config = write_config(db, workers={"processes": 1, "per_endpoint_concurrency": 4, "poll_interval": "50ms"})
    produce(config, db.dsn, "ws", 24)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 24, message="24 deliveries")
    assert receiver.endpoint("slow")["max_concurrency"] == 4


# Dry run and shadow rows: tests/e2e/test_rollout_engine.py (a live row is never marked without a POST).


def test_rows_that_can_never_be_sent_end_failed(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    gone, inactive, fine = seed_workspace(db.dsn, "ws", [receiver.url("ok", k) for k in ("gone", "off", "fine")])
    config = write_config(db)
    produce(config, db.dsn, "ws", 1)
    query(db.dsn, "DELETE FROM webhook_endpoints WHERE id = %s", (gone,))
    query(db.dsn, "UPDATE webhook_endpoints SET active = false WHERE id = %s", (inactive,))
    (event_id,), = query(db.dsn, "SELECT id FROM events")
    query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash) "
                  "VALUES ('ws', %s, 'no-such-event', 'x')", (fine,))
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: sum(status_counts(db.dsn).get(s, 0) for s in ("failed", "delivered")) == 4,
                   message="all rows finished")
    rows = dict(query(db.dsn, "SELECT endpoint_id || ':' || event_id, status || ':' || coalesce(last_error, '') "
                              "FROM webhook_deliveries"))
    assert rows == {f"{gone}:{event_id}": "failed:endpoint deleted",
                    f"{inactive}:{event_id}": "failed:endpoint deactivated",
                    f"{fine}:{event_id}": "delivered:",
                    f"{fine}:no-such-event": "failed:event not found"}
    assert receiver.stats()["total"] == 1


def test_metrics_reach_a_real_udp_statsd(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.2)
    seed_workspace(db.dsn, "ws", [receiver.url("ok", "a"), receiver.url("status", "b", code=500)])
    config = write_config(db, statsd={"enabled": True, "host": "127.0.0.1", "port": listener.getsockname()[1],
                                      "prefix": "dx", "tags": "none"},
                          alerts={"check_interval": "200ms"}, retry={"base": "10s"})
    produce(config, db.dsn, "ws", 2)
    names: set[str] = set()
    with Dispatcher(config, tmp_path / "d.log"):
        def seen_all() -> bool:
            try:
                packet = listener.recv(65536).decode()
            except TimeoutError:
                return False
            names.update(line.split(":")[0] for line in packet.splitlines())
            return {"dx.webhook_delivery_attempts_total.delivered", "dx.webhook_delivery_attempts_total.http_5xx",
                    "dx.webhook_delivery_latency_seconds.attempt", "dx.webhook_delivery_latency_seconds.commit_to_2xx",
                    "dx.webhook_backlog_age_seconds", "dx.webhook_breaker_open_total"} <= names
        wait_until(seen_all, message="every metric name")
    listener.close()


def test_unreachable_statsd_never_blocks_delivery(db, write_config, tmp_path: Path,
                                                  receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("ok", "a")])
    config = write_config(db, statsd={"enabled": True, "host": "statsd.invalid", "port": 9})
    produce(config, db.dsn, "ws", 20)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 20, message="20 deliveries")


def test_attempt_log_lines_are_structured_and_hold_no_secret(db, write_config, tmp_path: Path,
                                                             receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("ok", "a")])
    config = write_config(db)
    (event_id,) = produce(config, db.dsn, "ws", 1, payload={"marker": "body-must-not-be-logged"})
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 1, message="the delivery")
    log = dispatcher.log()
    line = next(line for line in log.splitlines() if "attempt event_id=" in line)
    for field in (f"event_id={event_id}", "endpoint_id=", "attempt=1", "status=delivered", "duration_ms="):
        assert field in line
    assert SECRET not in log and SECRET.removeprefix("whsec_") not in log
    assert "body-must-not-be-logged" not in log


def test_standard_webhooks_rotation_sends_both_signatures(db, write_config, tmp_path: Path,
                                                          capturing_server: CaptureServer) -> None:
    seed_workspace(db.dsn, "ws", [f"{capturing_server.url}/hook"])
    new_secret = "whsec_" + "Q2hhbmdlZFNlY3JldEZvclJvdGF0aW9uMTIz"
    query(db.dsn, "UPDATE workspaces SET previous_secret = secret, secret = %s, secret_rotated_at = now()",
          (new_secret,))
    config = write_config(db)
    produce(config, db.dsn, "ws", 1)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 1, message="the delivery")
    (_, headers, body), = capturing_server.captured
    lowered = {k.lower(): v for k, v in headers.items()}
    assert len(lowered["webhook-signature"].split()) == 2
    for secret in (SECRET, new_secret):
        assert json.loads(Webhook(secret).verify(body, lowered) and body)["id"] == lowered["webhook-id"]


def test_backlog_alert_fires_from_one_process(db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("hang", "stuck")])
    config = write_config(db, alerts={"backlog_rows": 5, "backlog_row_age": "100ms", "oldest_pending_age": "1h",
                                      "check_interval": "200ms"},
                          workers={"processes": 2, "per_endpoint_concurrency": 1, "poll_interval": "50ms"})
    produce(config, db.dsn, "ws", 30)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        wait_until(lambda: "backlog alert:" in dispatcher.log(), message="the backlog alert")
        owners = wait_until(lambda: len(seen := set(re.findall(r"worker (\S+) started", dispatcher.log()))) >= 2
                            and seen, message="both workers started")
        (first,) = _alerting(dispatcher.log())
        # The other worker runs five more upkeep rounds (each starts by trying for the lease):
        # had it evaluated the alert too, it would have spoken by then.
        for owner in owners - {first}:
            SessionActivity(db.dsn, "upkeep", "INSERT INTO region_leader", owner=owner).wait_for(5)
    log = dispatcher.log()
    assert "more than 5 pending rows overdue by more than 0.1s" in log
    alerting = _alerting(log)
    assert len(alerting) == 1, f"exactly one process per region evaluates the alert: {alerting}"


def _alerting(log: str) -> set[str]:
    """The processes (``[owner]`` of the line) that logged a backlog alert."""
    return {line.split("[", 1)[1].split("]", 1)[0] for line in log.splitlines() if "backlog alert:" in line}


def test_rows_of_a_day_without_a_partition_and_of_the_legacy_partition_are_delivered(
        db, write_config, tmp_path: Path, capturing_server: CaptureServer) -> None:
    """Partitioned by day (migration 0027): a row in DEFAULT (its day had no partition: the upkeep was down)
    and a row in *_before (written before the migration, added while the worker runs) are in the worker's
    claim window and go out."""
    (endpoint,) = seed_workspace(db.dsn, "ws", [f"{capturing_server.url}/hook"])
    (today,), = query(db.dsn, "SELECT dispatcher_today()")
    three_days_ago = date.fromordinal(today.toordinal() - 3)

    def row(event_id: str, day: date, id_: int) -> None:
        query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload, day) VALUES "
                      "(%s, 'ws', 'job.created', nextval('event_sequence'), '{}', %s)", (event_id, day))
        query(db.dsn, "INSERT INTO webhook_deliveries (id, workspace_id, endpoint_id, event_id, payload_hash, "
                      "event_day) VALUES (%s, 'ws', %s, %s, 'h', %s)", (id_, endpoint, event_id, day))

    row("evt_default", three_days_ago, partitions.first_id(three_days_ago) + 5)
    config = write_config(db)
    produce(config, db.dsn, "ws", 1)  # and one of today: today's partition alone would cover the window
    assert sorted(query(db.dsn, "SELECT tableoid::regclass::text FROM webhook_deliveries")) == [
        ("webhook_deliveries_default",), (partitions.partition_name("webhook_deliveries", today),)]
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 2, message="2 deliveries")
        row("evt_before", date(2000, 1, 1), 5)  # the legacy day, and an id of before the migration
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 3, message="the legacy row too")
    assert {"evt_default", "evt_before"} <= {h["webhook-id"] for _, h, _ in capturing_server.captured}
