"""A worker frozen past its lease: the claim-token fence rejects its late results.

SIGKILL of a worker holding 200 rows, stuck workers and TERM/INT are in
``tests/e2e/test_supervisor.py``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import settle, unread_answers

pytestmark = pytest.mark.timeout(90)

HELD = ("SELECT id, claim_token FROM webhook_deliveries "
        "WHERE status = 'pending' AND locked_by = %s AND locked_until > now()")


def _answered_while_stopped(pid: int, port: int) -> bool:
    """Whether the stopped ``pid`` gets an answer it cannot read within the receiver's 700 ms."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if unread_answers(pid, port):
            return True
        time.sleep(0.05)
    return False


def _owner(pid: int) -> str:
    cmdline = psutil.Process(pid).cmdline()
    return cmdline[cmdline.index("--owner") + 1]


def _ready(dispatcher: Dispatcher, n: int) -> dict[str, int] | None:
    """owner -> pid once ``n`` workers have logged that they serve."""
    try:
        owners = {_owner(pid): pid for pid in dispatcher.worker_pids()}
    except (psutil.NoSuchProcess, ValueError):
        return None
    log = dispatcher.log()
    if len(owners) == n and all(f"worker {owner} started" in log for owner in owners):
        return owners
    return None


def test_a_worker_stopped_past_its_lease_has_its_late_results_rejected_by_the_fence(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("latency", f"e{n}", ms=700) for n in range(8)])
    config = write_config(db, http={"timeout": "1s"},
                          workers={"processes": 2, "lease": "4s", "poll_interval": "50ms",
                                   "heartbeat_timeout": "120s", "graceful_timeout": "2s"})
    rows = 8 * 8
    port = urlsplit(receiver.base_url).port or 80
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        owners = settle(dispatcher, db.dsn, lambda: _ready(dispatcher, 2), "2 serving workers")
        pids = sorted(owners.values())
        event_ids = produce(config, db.dsn, "ws", 8)

        # Freeze whichever worker holds claimed rows at that instant, with a request in flight:
        # one frozen holding only queued rows hands them back unsent when it wakes, and then has
        # no late result for the fence to reject.
        stale: dict[int, int] = {}
        frozen = ""
        deadline = time.monotonic() + 20
        while not stale and time.monotonic() < deadline:
            held = query(db.dsn, "SELECT locked_by FROM webhook_deliveries WHERE locked_by IS NOT NULL "
                                 "GROUP BY locked_by ORDER BY count(*) DESC LIMIT 1")
            if not held:
                time.sleep(0.01)
                continue
            frozen = held[0][0]
            psutil.Process(owners[frozen]).send_signal(signal.SIGSTOP)
            stale = dict(query(db.dsn, HELD, (frozen,)))
            if stale and not _answered_while_stopped(owners[frozen], port):
                stale = {}  # it had nothing in flight
            if not stale:  # it had just written them, or sent none: try again
                psutil.Process(owners[frozen]).send_signal(signal.SIGCONT)
        assert stale, "a worker was frozen while holding claimed rows"
        (other,) = set(owners) - {frozen}

        try:
            # Its lease lapses; the other worker claims every one of the rows (sending or
            # already done: their token is no longer the frozen one's)...  Per-endpoint
            # concurrency is region-wide, so it takes them over a few at a time: waking the
            # frozen worker after the first would let it record results for the rest.
            taken = settle(dispatcher, db.dsn, lambda: query(
                db.dsn, "SELECT count(*) = %s FROM webhook_deliveries d JOIN unnest(%s::bigint[], %s::bigint[]) "
                        "AS s(id, token) ON s.id = d.id WHERE d.claim_token IS DISTINCT FROM s.token",
                (len(stale), list(stale), list(stale.values())))[0][0],
                "the other worker to take every frozen row over")
        finally:
            # ...when the frozen one wakes up and writes what it had in flight or queued.
            psutil.Process(owners[frozen]).send_signal(signal.SIGCONT)
        assert taken
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn) == {"delivered": rows}, f"{rows} delivered")
        settle(dispatcher, db.dsn, lambda: "stale results rejected by the claim-token fence" in dispatcher.log(),
               "the fence to reject the late results")
        assert sorted(dispatcher.worker_pids()) == pids, "nobody was killed: the fence alone protects the rows"
        log = dispatcher.log()

    history = query(db.dsn, "SELECT delivery_id, claim_token, result FROM webhook_delivery_attempts "
                            "WHERE delivery_id = ANY(%s)", (list(stale),))
    assert sorted(d for d, _, _ in history) == sorted(stale), "one recorded attempt per taken-over row"
    assert all(result == "delivered" for _, _, result in history)
    assert not {token for _, token, _ in history} & set(stale.values()), "no attempt under the stale token"
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE id = ANY(%s) AND status = 'delivered'",
                 (list(stale),)) == [(len(stale),)]
    assert f"[{frozen}]" in log.split("stale results rejected")[0].rsplit("\n", 1)[-1], "the frozen one's log line"
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE locked_by IS NOT NULL") == [(0,)]
    seen = {d.webhook_id for d in receiver.deliveries() if d.ok}
    assert seen == set(event_ids), "duplicates, if any, carry the same webhook-id"
