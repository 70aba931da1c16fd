"""Dry run and rollback with a real dispatcher, a real receiver and a real Postgres (issue 10)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dispatcher.supervisor import DRY_RUN_WARNING
from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts, wait_until

pytestmark = pytest.mark.timeout(120)


class Counting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    server.paths = []  # type: ignore[attr-defined]
    server.lock = threading.Lock()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: ThreadingHTTPServer, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{path}"


def posts(server: ThreadingHTTPServer, path: str) -> int:
    with server.lock:  # type: ignore[attr-defined]
        return server.paths.count(f"/{path}")  # type: ignore[attr-defined]


def test_dry_run_sends_live_rows_and_marks_only_shadow_rows(db, write_config, tmp_path: Path,
                                                           receiver: ThreadingHTTPServer) -> None:
    seed_workspace(db.dsn, "live", [url(receiver, "live")])
    seed_workspace(db.dsn, "legacy", [url(receiver, "shadow")], outbox=False)
    produce(write_config(db), db.dsn, "live", 3)
    produce(write_config(db, producer={"shadow_writes": True}), db.dsn, "legacy", 2)
    assert posts(receiver, "shadow") == 2  # the flag-off path posted inline
    with Dispatcher(write_config(db, dry_run=True), tmp_path / "d.log") as dispatcher:
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 5, message="5 rows delivered or marked")
        log = dispatcher.log()
    assert posts(receiver, "live") == 3, "a live row was marked delivered without a POST"
    assert posts(receiver, "shadow") == 2, "a shadow row was sent"
    assert query(db.dsn, "SELECT d.mode, count(a.status_code) FROM webhook_deliveries d "
                         "LEFT JOIN webhook_delivery_attempts a ON a.delivery_id = d.id "
                         "GROUP BY d.mode ORDER BY d.mode") == [("live", 3), ("shadow", 0)]
    (line,) = [line for line in log.splitlines() if DRY_RUN_WARNING in line]
    assert " WARNING " in line and "dispatcher.supervisor" in line


@pytest.mark.parametrize("switch_off", ["flag", "percent"])
def test_turning_the_outbox_off_leaves_queued_rows_draining(db, write_config, tmp_path: Path,
                                                           receiver: ThreadingHTTPServer, switch_off: str) -> None:
    seed_workspace(db.dsn, "ws", [url(receiver, "a"), url(receiver, "b")])
    if switch_off == "percent":  # in by the percentage, not by its flag
        query(db.dsn, "UPDATE workspaces SET flags = '{}'")
        query(db.dsn, "UPDATE rollout_settings SET percent = 100")
    config = write_config(db)
    event_ids = produce(config, db.dsn, "ws", 10)
    assert status_counts(db.dsn) == {"pending": 20}
    if switch_off == "flag":
        query(db.dsn, "UPDATE workspaces SET flags = flags || '{\"webhook_outbox\": false}'")
    else:
        query(db.dsn, "UPDATE rollout_settings SET percent = 0")
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 20, message="20 rows drained")
    assert (posts(receiver, "a"), posts(receiver, "b")) == (10, 10)
    assert len(event_ids) == 10
