"""Breaker notices through the dispatcher itself (issue 12 item 4): two worker
processes fail an endpoint until its breaker opens, and its owner gets exactly
one mail from a real SMTP server in the test process (aiosmtpd); the endpoint
recovers, the probe succeeds, and exactly one "recovered" mail follows.  The
workspace's operational webhook arrives signed, through the outbox.  With the
SMTP server down, delivery goes on and the failure is logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.message import signing_keys
from dispatcher.signing import verify
from dispatcher_devtools.kit import (
    SECRET,
    Dispatcher,
    capture_server,
    produce,
    query,
    seed_workspace,
    status_counts,
    wait_until,
)
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.smtp import free_port, smtp_server

pytestmark = pytest.mark.timeout(120)

OWNER = "owner@example.com"


def _fast_breaker(port: int, **notifier: object) -> dict[str, object]:
    """Config overrides: a breaker that opens after 3 failures for 1 s, rounds every 300 ms, mail to ``port``."""
    return {
        "breaker": {"failure_threshold": 3, "open_for": "1s"},
        "retry": {"base": "1h", "max_interval": "2h"},  # a failed row waits: only probes are sent
        "alerts": {"check_interval": "300ms"},
        # recovered once the breaker stayed closed this long (rules/lifecycle.py: no storm from a flap)
        "endpoints": {"flap_window": "500ms"},
        "notifier": {"kind": "smtp", "smtp_host": "127.0.0.1", "smtp_port": port, "smtp_security": "none",
                     "smtp_timeout": "3s", "smtp_to": "ops@example.com", **notifier},
    }


def _breaker_state(dsn: str, endpoint_id: int) -> str:
    rows = query(dsn, "SELECT state FROM endpoint_state WHERE endpoint_id = %s", (endpoint_id,))
    return str(rows[0][0]) if rows else "closed"


def test_owner_gets_one_opened_and_one_recovered_mail_with_two_workers(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver, smtp_server() as smtp, capture_server() as ops:
        (failing,) = seed_workspace(db.dsn, "ws", [receiver.url("status", "flaky", code=500)])
        query(db.dsn, "UPDATE webhook_endpoints SET owner_contact = %s", (OWNER,))
        # Confirmed, as its mailed link leaves it (tests/integration/test_notifier.py follows the link).
        query(db.dsn, "INSERT INTO contact_confirmations (workspace_id, address, sent_at, confirmed_at)"
                      " VALUES ('ws', %s, now(), now())", (OWNER,))
        query(db.dsn, "UPDATE workspaces SET notify_webhook_url = %s", (ops.url + "/ops",))
        config = write_config(db, workers={"processes": 2, "poll_interval": "50ms", "lease": "10s"},
                              **_fast_breaker(smtp.port))
        produce(config, db.dsn, "ws", 12)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: smtp.received("failing"), message="the opened mail")
            receiver.set_profile("flaky", {"profile": "ok"})
            wait_until(lambda: smtp.received("recovered"), timeout=30, message="the recovered mail")
            wait_until(lambda: ops.posts("/ops") == 2, message="both operational webhooks")
            # The rows held while the breaker was open flow again (those that failed wait for their 1 h retry).
            failed = query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE attempt > 0 "
                                   "AND status = 'pending'")[0][0]
            wait_until(lambda: status_counts(db.dsn).get("delivered", 0) == 12 - failed + 2,
                       message="the held rows to be delivered")
        log = dispatcher.log()
    assert query(db.dsn, "SELECT kind, recipient, sent_at IS NOT NULL FROM breaker_notices ORDER BY kind") == [
        ("opened", OWNER, True), ("recovered", OWNER, True)]
    (opened,) = smtp.received("failing")
    (recovered,) = smtp.received("recovered")
    assert len(smtp.received()) == 2
    assert opened.recipients == [OWNER] and recovered.recipients == [OWNER]
    assert f"endpoint {failing}" in opened.subject and f"endpoint {failing}" in recovered.subject
    assert "flaky" not in opened.body, "the mail names the host, not the path"
    # The operational webhook: signed with the workspace secret, one per notice, never to the failing endpoint.
    kinds = []
    for post in ops.captured:
        headers = {k.lower(): v for k, v in post.headers.items()}
        assert verify(signing_keys([SECRET]), headers["webhook-id"], int(headers["webhook-timestamp"]), post.body,
                      headers["webhook-signature"])
        kinds.append((json.loads(post.body)["type"], json.loads(post.body)["data"]["endpoint_id"]))
    assert sorted(kinds) == [("webhook.endpoint.breaker_opened", failing),
                             ("webhook.endpoint.breaker_recovered", failing)]
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s "
                         "AND event_id LIKE 'breaker%%'", (failing,)) == [(0,)]
    assert "breaker opened" in log and "breaker closed" in log


def test_smtp_down_leaves_delivery_alone_and_is_logged_without_secrets(db, write_config, tmp_path: Path) -> None:
    with ReceiverProcess(secrets=[SECRET]) as receiver:
        failing, healthy = seed_workspace(db.dsn, "ws", [receiver.url("status", "down", code=500),
                                                         receiver.url("ok", "fine")])
        config = write_config(db, **_fast_breaker(free_port(), smtp_username="mailer",
                                                  smtp_password="hunter2-never-logged"))
        produce(config, db.dsn, "ws", 10)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            wait_until(lambda: _breaker_state(db.dsn, failing) != "closed", message="the breaker to open")
            wait_until(lambda: "not sent (attempt 1" in dispatcher.log(), message="the failed mail in the log")
            produce(config, db.dsn, "ws", 10)  # delivery goes on while mail is down
            wait_until(lambda: receiver.endpoint("fine").get("count", 0) >= 20, message="the healthy endpoint's rows")
        log = dispatcher.log()
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s AND status = 'delivered'",
                 (healthy,)) == [(20,)]
    assert "hunter2" not in log
    assert query(db.dsn, "SELECT kind, sent_at, attempts >= 1 FROM breaker_notices") == [("opened", None, True)]
