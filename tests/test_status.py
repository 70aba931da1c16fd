"""``dispatcher status`` and ``dispatcher check`` against a live region, a dead
one and an unreachable database: real dispatchers, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dispatcher_devtools.kit import REPO, Dispatcher, produce, query, seed_workspace, status_counts, wait_until

pytestmark = pytest.mark.timeout(180)

UNREACHABLE_DSN = "host=127.0.0.1 port=1 dbname=nowhere user=postgres connect_timeout=3"
FAST = {"workers": {"processes": 2, "status_interval": "200ms"},
        "alerts": {"check_interval": "200ms", "heartbeat_age": "2s", "leader_age": "2s"}}
STATUS_KEYS = {"version", "region", "generated_at", "health", "pending", "backlog", "oldest_due", "statuses",
               "breakers", "top_failing", "leader", "workers", "silent_processes"}
WORKER_KEYS = {"owner", "host", "pid", "started_at", "heartbeat_at", "heartbeat_age", "in_flight", "leader"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", *args], cwd=REPO, env=env, capture_output=True,
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


class OkHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OkHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def _seed_operations_picture(dsn: str) -> tuple[int, int]:
    """An endpoint in a maintenance window (open breaker, rows behind it) and one failing."""
    held, failing = seed_workspace(dsn, "ws-ops", ["http://127.0.0.1:9/held", "http://127.0.0.1:9/failing"])
    query(dsn, "INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at) "
               "VALUES (%s, 'open', 20, now() + interval '1 hour', now() - interval '10 minutes')", (held,))
    for n in range(3):
        query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, "
                   "next_attempt_at) VALUES ('ws-ops', %s, %s, 'h', now() - interval '20 minutes')", (held, f"h{n}"))
        query(dsn, "INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, "
                   "duration_ms, result, status_code) VALUES (1, %s, 1, now() - interval '1 minute', 5, "
                   "'http_5xx', 503)", (failing,))
    return held, failing


def test_live_region_then_all_workers_killed(db, write_config, tmp_path: Path) -> None:
    held, failing = _seed_operations_picture(db.dsn)
    config = write_config(db, **FAST)
    assert check(config)[0] == 2, "no dispatcher has run yet: the fleet is dead"
    dispatcher = Dispatcher(config, tmp_path / "d.log")
    try:
        dispatcher.__enter__()
        wait_until(lambda: check(config)[0] == 0, timeout=60, message="check OK with a live fleet")
        code, verdict = check(config)
        assert verdict["backlog"]["held_rows"] == 3 and verdict["backlog"]["overdue_rows"] == 0

        document = wait_until(lambda: (d := status(config)) and len(d["workers"]) == 2 and d["leader"] and d,
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
        code, verdict = wait_until(lambda: (c := check(config))[0] == 2 and c, timeout=60,
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
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: len(status(config)["workers"]) == 2, message="two live workers")
    assert query(db.dsn, "SELECT count(*) FROM dispatcher_processes") == [(0,)]


def test_heartbeat_failures_never_touch_delivery(db, write_config, tmp_path: Path, receiver_url: str) -> None:
    seed_workspace(db.dsn, "ws", [receiver_url])
    config = write_config(db, **FAST)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        wait_until(lambda: len(status(config)["workers"]) == 2, message="two live workers")
        query(db.dsn, "DROP TABLE dispatcher_processes")
        wait_until(lambda: "status heartbeat not recorded" in dispatcher.log(), message="the heartbeat failure")
        produce(config, db.dsn, "ws", 20)
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 20, message="20 deliveries regardless")
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
    config = write_config(db, **FAST)
    query(db.dsn, "INSERT INTO dispatcher_processes (owner, region, host, pid, started_at, leader_at) "
                  "VALUES ('h:1:w1', 'test', 'h', 1, now(), now() - interval '1 hour')")
    code, verdict = check(config)
    assert code == 1 and verdict["status"] == "WARNING" and "no upkeep leader" in verdict["problems"][0]
    query(db.dsn, "UPDATE dispatcher_processes SET leader_at = now()")
    assert check(config)[0] == 0
    # Another region's processes are not this region's fleet.
    query(db.dsn, "UPDATE dispatcher_processes SET region = 'elsewhere'")
    assert check(config)[0] == 2
