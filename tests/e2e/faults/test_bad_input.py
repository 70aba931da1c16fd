"""Bad data: endpoint URLs that cannot be sent to, and a row whose processing raises.

URLs are inserted straight into ``webhook_endpoints``, as outside tools may
(the CLI refuses them up front: ``tests/e2e/test_cli.py``), and so are event ids
that cannot be a header (rows written before the producer refused them:
``tests/integration/test_producer.py::TestLimits``).  The missing-event
case is ``tests/e2e/test_engine.py::test_rows_that_can_never_be_sent_end_failed``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts, wait_until
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support import run_green
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(60)

UNSENDABLE = {  # URL -> last_error
    "not-a-url": "invalid_url: URL has no scheme",
    "ftp://files.example.com/hook": "invalid_url: unsupported scheme 'ftp': only http and https",
    "http://": "invalid_url: URL has no host",
    "http://exa mple.com/": "invalid_url: URL contains whitespace, control characters or a backslash",
    "http://user:hunter2@example.com/hook": "invalid_url: credentials in the URL (user:password@) are not allowed",
    "http://999.1.1.1/": "invalid_url: malformed IPv4 address",
    "https://example.com:99999/": "invalid_url: invalid port",
}
NO_SUCH_HOST = "http://no-such-host.invalid/hook"


def test_unsendable_urls_fail_and_unresolvable_hosts_retry_without_hurting_the_worker(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    urls = [*UNSENDABLE, NO_SUCH_HOST, receiver.url("ok", "fine")]
    *_, unresolvable, fine = seed_workspace(db.dsn, "ws", urls)
    config = write_config(db, retry={"base": "200ms", "jitter": 0}, breaker={"failure_threshold": 100})
    produce(config, db.dsn, "ws", 2)
    rows = "SELECT e.url, d.status, d.attempt, d.last_error FROM webhook_deliveries d " \
           "JOIN webhook_endpoints e ON e.id = d.endpoint_id"

    def dns_retried() -> bool:
        return query(db.dsn, "SELECT min(attempt) FROM webhook_deliveries WHERE endpoint_id = %s",
                     (unresolvable,))[0][0] >= 3

    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        pids = sorted(settle(dispatcher, db.dsn, dispatcher.worker_pids, "a worker"))
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("failed") == 2 * len(UNSENDABLE)
               and dns_retried(), "unsendable rows failed and the unresolvable host retried")
        assert sorted(dispatcher.worker_pids()) == pids, "the worker was never replaced"
        log = dispatcher.log()
    for url, status, attempt, last_error in query(db.dsn, rows):
        if url in UNSENDABLE:
            assert (status, attempt, last_error) == ("failed", 1, UNSENDABLE[url]), url
        elif url == NO_SUCH_HOST:
            assert status == "pending" and attempt >= 3
            # Generic for the customer; the name and the resolver's reason stay in the operators' log.
            assert last_error == "dns: name did not resolve", last_error
        else:
            assert status == "delivered"
    results = dict(query(db.dsn, "SELECT endpoint_id, array_agg(DISTINCT result) FROM webhook_delivery_attempts "
                                 "GROUP BY endpoint_id"))
    assert results[unresolvable] == ["dns"] and results[fine] == ["delivered"]
    assert {tuple(v) for k, v in results.items() if k not in (unresolvable, fine)} == {("invalid_url",)}
    assert "hunter2" not in log and "Traceback" not in log and "exited with" not in log
    assert "no-such-host.invalid does not resolve" in log


def test_a_poison_row_ends_dead_and_the_worker_delivers_the_rest(db, write_config) -> None:
    """Processing raises for one row, inside a real worker loop (claim, lanes,
    flusher) in a gevent-patched process: the row uses up its attempt and ends
    ``dead``; its batch, and the next one, are delivered by the same worker."""
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url("ok", f"e{n}") for n in range(3)])
        config = write_config(db, workers={"poll_interval": "50ms"})
        event_ids = produce(config, db.dsn, "ws", 10)  # 30 rows: the poison ones share claims with healthy ones
        poison = event_ids[4]
        out = run_green("tests.support.faults:run_poison_worker", {
            "config": str(config), "dsn": db.dsn, "poison_event_id": poison, "secret": SECRET,
            "expect_finished": 30, "more_events": 5, "workspace": "ws"}, timeout=60)
        assert out["first_done"] and out["second_done"], out["log"][-3000:]
        assert out["alive_after_poison"] and out["alive_at_end"], "the worker kept running"
        assert out["raised"] == 3, "each poison row was processed exactly once"
        unique = sum(ep["unique"] for ep in receiver.stats()["endpoints"].values())
    poisoned = query(db.dsn, "SELECT d.status, d.attempt, d.last_error, a.result FROM webhook_deliveries d "
                             "JOIN webhook_delivery_attempts a ON a.delivery_id = d.id WHERE d.event_id = %s",
                     (poison,))
    assert len(poisoned) == 3
    for status, attempt, last_error, result in poisoned:
        assert (status, attempt, result) == ("dead", 1, "failed")
        assert last_error.startswith("internal error: KeyError: 'cannot process this row (signing key ")
        assert SECRET not in last_error and "[REDACTED]" in last_error
    assert status_counts(db.dsn) == {"dead": 3, "delivered": 42}
    assert unique == 42
    assert "attempt raised for delivery" in out["log"] and "Traceback" in out["log"]
    assert SECRET not in out["log"] and SECRET.removeprefix("whsec_") not in out["log"]


BAD_EVENT_IDS = {  # id -> the reason the row ends with
    "evt\r\nX-Injected: 1":
        "event id contains a control character ('\\r' at position 3); ids are 1-200 visible ASCII characters",
    "x" * 300: "event id is 300 characters, over 200",
    "évt-\U0001f600":
        "event id contains a non-ASCII character ('\\xe9' at position 0); ids are 1-200 visible ASCII characters",
}


def test_an_event_id_that_cannot_be_a_header_fails_the_row_without_touching_the_breaker(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    """Such an id goes into Idempotency-Key and webhook-id: the request can never be
    made, so the row ends ``failed`` at its first claim with the id rule's reason --
    not retried for 24 h as a protocol error counted against the customer's endpoint."""
    endpoint, = seed_workspace(db.dsn, "ws", [receiver.url("ok", "hook")])
    config = write_config(db, retry={"base": "200ms", "jitter": 0}, breaker={"failure_threshold": 2})
    for event_id in BAD_EVENT_IDS:
        query(db.dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload) "
                      "VALUES (%s, 'ws', 'job.created', nextval('event_sequence'), '{}')", (event_id,))
        query(db.dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, event_day) "
                      "SELECT 'ws', %s, id, 'x', day FROM events WHERE workspace_id = 'ws' AND id = %s",
              (endpoint, event_id))
    good, = produce(config, db.dsn, "ws", 1)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("pending", 0) == 0, message="every row finished")
    rows = dict(query(db.dsn, "SELECT event_id, array[status, attempt::text, last_error] FROM webhook_deliveries"))
    assert rows == {**{event_id: ["failed", "1", reason] for event_id, reason in BAD_EVENT_IDS.items()},
                    good: ["delivered", "1", None]}
    assert query(db.dsn, "SELECT state, consecutive_failures FROM endpoint_state") in ([], [("closed", 0)])
    assert receiver.stats()["total"] == 1
