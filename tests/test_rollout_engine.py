"""Dry run and rollback with a real dispatcher, a real receiver and a real Postgres (issue 10)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
        kit.wait_until(lambda: kit.status_counts(db.dsn).get("delivered") == 5, message="5 rows delivered or marked")
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
