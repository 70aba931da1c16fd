"""Hostile receivers at the engine level: each is fenced to its own share.

The transport-level cases (deadline, read cap, gzip bomb, resets, malformed
status lines, TLS) are in ``test_hostile_receivers.py``.  Here a real
dispatcher serves hostile and healthy endpoints side by side, and the
question is what reaches the database and whether the healthy ones wait.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support import LoopbackServer, Request, responder, response
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(60)


def test_hanging_and_slow_endpoints_do_not_hold_up_healthy_ones(db, write_config, tmp_path: Path,
                                                                 receiver: ReceiverProcess) -> None:
    # The bad endpoints come first in id order, so a claim that did not cap each
    # endpoint's share would fill the process with them before any healthy row.
    # The first attempts to the bad endpoints time out after 4 s; the healthy rows must all be delivered
    # before then.  At 2 s a loaded CI machine sometimes missed that window.
    urls = [receiver.url("hang", "hang"), receiver.url("slow", "slow", ms=9600),
            *(receiver.url("ok", f"healthy{n}") for n in range(3))]
    hang, slow, *healthy = seed_workspace(db.dsn, "ws", urls)
    config = write_config(db, http={"timeout": "4s"}, retry={"base": "5s"},
                          workers={"processes": 1, "per_endpoint_concurrency": 4, "max_in_flight": 32,
                                   "claim_batch": 32, "poll_interval": "50ms", "graceful_timeout": "1s"})
    produce(config, db.dsn, "ws", 100)  # 100 rows on each endpoint

    def by_endpoint() -> dict[int, tuple[int, int, int, int]]:
        rows = query(db.dsn, "SELECT endpoint_id, count(*) FILTER (WHERE status = 'delivered'), "
                             "count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE attempt = 0), "
                             "max(attempt) FROM webhook_deliveries GROUP BY endpoint_id")
        return {row[0]: tuple(row[1:]) for row in rows}  # type: ignore[misc]

    def healthy_done() -> dict[int, tuple[int, int, int, int]] | None:
        state = by_endpoint()
        return state if all(state[e][0] == 100 for e in healthy) else None

    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        state = settle(dispatcher, db.dsn, healthy_done, "every healthy row delivered")
    for bad in (hang, slow):
        delivered, pending, untouched, max_attempt = state[bad]
        assert (delivered, pending) == (0, 100), state
        # Healthy rows were all delivered before the bad endpoint's first timed-out
        # attempts came back for a retry, and before it got through its backlog.
        assert max_attempt <= 1, state
        assert untouched >= 80, state
    assert receiver.endpoint("hang")["max_concurrency"] <= 4
    assert receiver.endpoint("slow")["max_concurrency"] <= 4


BINARY = {
    "/nul": response(200, b"\x00" * 64),
    "/bytes": response(200, bytes(range(256)) * 4),          # NULs and invalid UTF-8
    "/zeros": response(200, bytes(1 << 20)),                 # 1 MiB of zeros, past the read cap
    "/nul-error": response(500, b"error\x00detail\x00" * 8),
}


def _binary(request: Request) -> bytes:
    return BINARY[request.path]


def test_binary_response_bodies_are_recorded_and_never_stop_the_worker(db, write_config, tmp_path: Path) -> None:
    """A NUL byte cannot be stored in a Postgres text column: unless the excerpt is
    made storable, the result write fails and the worker records nothing more."""
    with LoopbackServer(responder(_binary)) as server:
        ids = seed_workspace(db.dsn, "ws", [server.url(path) for path in BINARY])
        config = write_config(db, retry={"base": "60s"})
        produce(config, db.dsn, "ws", 3)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 9, "pending": 3}
                   and query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts")[0][0] == 12, "12 attempts")
            produce(config, db.dsn, "ws", 2)  # the same worker goes on recording
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": 15, "pending": 5}
                   and query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts")[0][0] == 20, "20 attempts")
    excerpts = query(db.dsn, "SELECT endpoint_id, status_code, response_excerpt FROM webhook_delivery_attempts")
    for endpoint_id, status_code, stored in excerpts:
        assert status_code == (500 if endpoint_id == ids[-1] else 200)
        assert "\x00" not in stored and len(stored.encode()) <= 256
    assert any(stored.startswith("error\ufffddetail") for *_, stored in excerpts)
    assert "Traceback" not in dispatcher.log()
