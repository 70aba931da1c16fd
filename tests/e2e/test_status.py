"""``dispatcher status`` and ``dispatcher check`` against a live region, a dead
one and an unreachable database: real dispatchers, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher_devtools import kit

pytestmark = pytest.mark.timeout(180)

UNREACHABLE_DSN = "host=127.0.0.1 port=1 dbname=nowhere user=postgres connect_timeout=3"
FAST = {"workers": {"processes": 2, "status_interval": "200ms"},
        "alerts": {"check_interval": "200ms", "heartbeat_age": "2s", "leader_age": "2s"}}
STATUS_KEYS = {"version", "region", "generated_at", "health", "pending", "backlog", "oldest_due", "statuses",
               "breakers", "top_failing", "leader", "workers", "silent_processes", "last_stop", "partitions"}
WORKER_KEYS = {"owner", "host", "pid", "started_at", "heartbeat_at", "heartbeat_age", "in_flight", "leader"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env["PYTHONPATH"] = str(kit.REPO)
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", *args], cwd=kit.REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def check(config: Path) -> tuple[int, dict[str, Any]]:
    result = cli("-c", str(config), "check", "--json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout)


def status(config: Path) -> dict[str, Any]:
    result = cli("-c", str(config), "status", "--json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


@pytest.fixture
def receiver_url() -> Iterator[str]:
    with kit.capture_server() as server:
        yield f"{server.url}/hook"


def _seed_operations_picture(dsn: str) -> tuple[int, int]:
    """An endpoint in a maintenance window (open breaker, rows behind it) and one failing."""
    held, failing = kit.seed_workspace(dsn, "ws-ops", ["http://127.0.0.1:9/held", "http://127.0.0.1:9/failing"])
    kit.query(dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at) "
               "VALUES (%s, 'open', 20, now() + interval '1 hour', now() - interval '10 minutes')", (held,))
    for n in range(3):
        kit.query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, "
                   "next_attempt_at) VALUES ('ws-ops', %s, %s, 'h', now() - interval '20 minutes')", (held, f"h{n}"))
        kit.query(dsn, "INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                   "duration_ms, result, status_code) VALUES (1, %s, 1, now() - interval '1 minute', 5, "
                   "'http_5xx', 503)", (failing,))
    return held, failing


def test_live_region_then_all_workers_killed(db, write_config, tmp_path: Path) -> None:
    held, failing = _seed_operations_picture(db.dsn)
    config = write_config(db, **FAST)
    assert check(config)[0] == 2, "no dispatcher has run yet: the fleet is dead"
    dispatcher = kit.Dispatcher(config, tmp_path / "d.log")
    try:
        dispatcher.__enter__()
        kit.wait_until(lambda: check(config)[0] == 0, timeout=60, message="check OK with a live fleet")
        code, verdict = check(config)
        assert verdict["backlog"]["held_rows"] == 3 and verdict["backlog"]["overdue_rows"] == 0

        document = kit.wait_until(lambda: (d := status(config)) and len(d["workers"]) == 2 and d["leader"] and d,
                              message="both workers and a leader in status")
        assert set(document) == STATUS_KEYS and all(set(w) == WORKER_KEYS for w in document["workers"])
        assert {w["pid"] for w in document["workers"]} == set(dispatcher.worker_pids())
        assert [w["owner"] for w in document["workers"] if w["leader"]] == [document["leader"]["owner"]]
        assert document["health"]["status"] == "OK"
        assert [(b["endpoint_id"], b["state"], b["pending"]) for b in document["breakers"]] == [(held, "open", 3)]
        assert [(t["endpoint_id"], t["failures"]) for t in document["top_failing"]] == [(failing, 3)]
        assert document["pending"]["overdue"]["over_15m"] == 3 and document["pending"]["total"] == 3

        human = cli("-c", str(config), "status")
        assert human.returncode == 0, human.stderr
        assert all(len(line) <= 100 for line in human.stdout.splitlines()), human.stdout
        assert "leader" in human.stdout and str(held) in human.stdout

        # Every dispatcher process dies at once: nothing is left to raise an alarm but the database.
        for pid in [*dispatcher.worker_pids(), dispatcher.process.pid]:  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)
        dispatcher.process.wait(10)  # type: ignore[union-attr]
        code, verdict = kit.wait_until(lambda: (c := check(config))[0] == 2 and c, timeout=60,
                                   message="check CRITICAL once the heartbeat threshold passed")
        assert "dead fleet" in " ".join(verdict["problems"])
        assert verdict["fleet"]["workers_alive"] == 0
        dead = status(config)
        assert dead["workers"] == [] and dead["silent_processes"] == 2 and dead["leader"] is None
        assert dead["health"]["status"] == "CRITICAL"
    finally:
        dispatcher.stop()


def test_a_graceful_stop_removes_the_rows(db, write_config, tmp_path: Path) -> None:
    config = write_config(db, **FAST)
    with kit.Dispatcher(config, tmp_path / "d.log"):
        kit.wait_until(lambda: len(status(config)["workers"]) == 2, message="two live workers")
    assert kit.query(db.dsn, "SELECT count(*) FROM dispatcher_processes") == [(0,)]


@pytest.mark.parametrize(("signum", "how"), [(signal.SIGTERM, "TERM: graceful shutdown"),
                                             (signal.SIGINT, "INT: fast shutdown")])
def test_a_stopped_fleet_is_reported_as_stopped_not_as_never_run(db, write_config, tmp_path: Path,
                                                                 signum: int, how: str) -> None:
    config = write_config(db, **FAST)
    code, never = check(config)
    assert (code, never["problems"]) == (0, ["fleet never run: no dispatcher worker has ever recorded a heartbeat; "
                                             "no pending rows"])
    dispatcher = kit.Dispatcher(config, tmp_path / "d.log")
    try:
        dispatcher.__enter__()
        kit.wait_until(lambda: len(status(config)["workers"]) == 2, message="two live workers")
        dispatcher.process.send_signal(signum)  # type: ignore[union-attr]
        assert dispatcher.process.wait(60) == 0  # type: ignore[union-attr]
    finally:
        dispatcher.stop()
    # It said "dead fleet: no dispatcher worker has ever recorded a heartbeat" right after a clean stop.
    document = status(config)
    assert document["workers"] == [] and document["silent_processes"] == 0
    stop = document["last_stop"]
    assert stop["how"] == how and stop["pid"] == dispatcher.process.pid  # type: ignore[union-attr]
    assert document["health"]["status"] == "OK"
    assert document["health"]["problems"][0].startswith("fleet stopped ") and how in document["health"]["problems"][0]
    human = cli("-c", str(config), "status").stdout
    assert f"last stop {stop['stopped_at'].replace('T', ' ')}, {how}" in human, human
    # Rows waiting make it an alert again.
    kit.seed_workspace(db.dsn, "ws", ["http://127.0.0.1:9/x"])
    kit.produce(config, db.dsn, "ws", 1)
    code, verdict = check(config)
    assert code == 2 and "fleet stopped" in verdict["problems"][0] and "pending rows wait" in verdict["problems"][0]


def test_heartbeat_failures_never_touch_delivery(db, write_config, tmp_path: Path, receiver_url: str) -> None:
    kit.seed_workspace(db.dsn, "ws", [receiver_url])
    config = write_config(db, **FAST)
    with kit.Dispatcher(config, tmp_path / "d.log") as dispatcher:
        kit.wait_until(lambda: len(status(config)["workers"]) == 2, message="two live workers")
        kit.query(db.dsn, "DROP TABLE dispatcher_processes")
        kit.wait_until(lambda: "status heartbeat not recorded" in dispatcher.log(), message="the heartbeat failure")
        kit.produce(config, db.dsn, "ws", 20)
        kit.wait_until(lambda: kit.status_counts(db.dsn).get("delivered") == 20, message="20 deliveries regardless")
        assert dispatcher.process.poll() is None  # type: ignore[union-attr]
    assert "Traceback" not in dispatcher.log()


def test_check_is_unknown_without_a_database_and_never_a_traceback(write_config, db, tmp_path: Path) -> None:
    unreachable = write_config(db, database={"dsn": UNREACHABLE_DSN})
    for args in (["check"], ["check", "--json"]):
        result = cli("-c", str(unreachable), *args)
        assert result.returncode == 3, (result.stdout, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr
        assert len(result.stdout.strip().splitlines()) == 1
        assert "cannot connect to the database" in result.stdout
    assert result.stdout.startswith("{") and json.loads(result.stdout)["status"] == "UNKNOWN"

    bad = tmp_path / "bad.yaml"
    bad.write_text("alerts: {heartbeat_age: soon}\n")
    result = cli("-c", str(bad), "check")
    assert result.returncode == 3 and result.stdout.startswith("UNKNOWN - ") and "alerts.heartbeat_age" in result.stdout

    result = cli("-c", str(unreachable), "status")
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_check_exit_codes_follow_nagios(db, write_config) -> None:
    """WARNING (1): workers alive, but no upkeep leader ran a round lately."""
    # Ages of a minute: the CLI's start alone can take seconds on a loaded machine, and a
    # heartbeat that aged past FAST's 2 s meanwhile made the fleet read as dead (CRITICAL).
    config = write_config(db, workers=FAST["workers"],
                          alerts={"check_interval": "200ms", "heartbeat_age": "60s", "leader_age": "60s"})
    kit.query(db.dsn, "INSERT INTO dispatcher_processes (owner, region, host, pid, started_at, leader_at) "
                  "VALUES ('h:1:w1', 'test', 'h', 1, now(), now() - interval '1 hour')")
    code, verdict = check(config)
    assert code == 1 and verdict["status"] == "WARNING" and "no upkeep leader" in verdict["problems"][0]
    kit.query(db.dsn, "UPDATE dispatcher_processes SET leader_at = now()")
    assert check(config)[0] == 0
    # Another region's processes are not this region's fleet.
    kit.query(db.dsn, "UPDATE dispatcher_processes SET region = 'elsewhere'")
    code, verdict = check(config)  # never run here, and nothing waits: said, not an alert
    assert code == 0 and verdict["problems"][0].startswith("fleet never run")
