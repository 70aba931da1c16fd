"""The SSRF guard as the engine records it: a real dispatcher, real rows.

The transport-level matrix, the rebinding and mixed-answer names and the
redirect recording server are in ``test_ssrf.py``.  Here endpoint URLs are
inserted straight into ``webhook_endpoints`` (as outside tools may, skipping
the CLI's registration check) and the question is what the engine does with
them: the row ends ``failed``, the attempt is ``blocked`` with a reason, the
breaker learns nothing, and no request leaves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(60)

ATTEMPTS = ("SELECT e.url, a.result, a.status_code, d.status, d.last_error, d.attempt "
            "FROM webhook_delivery_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id "
            "JOIN webhook_endpoints e ON e.id = d.endpoint_id ORDER BY e.id, a.id")


def test_private_targets_end_failed_as_blocked_without_touching_the_breaker(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess) -> None:
    port = receiver.port
    targets = {  # URL -> the reason the guard must give
        receiver.url("ok", "loopback"): "127.0.0.1 is a loopback address",
        f"http://localhost:{port}/ok/name": "localhost resolves to",
        f"http://2130706433:{port}/ok/decimal": "127.0.0.1 is a loopback address",
        f"http://0x7f.1:{port}/ok/hex": "127.0.0.1 is a loopback address",
        f"http://0.0.0.0:{port}/ok/unspecified": "0.0.0.0 is a unspecified address",
        f"http://[::1]:{port}/ok/v6": "::1 is a loopback address",
        f"http://[::ffff:127.0.0.1]:{port}/ok/mapped": "IPv4-mapped 127.0.0.1",
        "http://169.254.169.254/latest/meta-data/": "link-local (cloud metadata)",
        "http://10.0.0.1/hook": "10.0.0.1 is a private address",
        "http://100.64.0.1/hook": "carrier-grade NAT",
    }
    seed_workspace(db.dsn, "ws", list(targets))
    # A breaker that opens after two failures: had a refusal counted, it would be open.
    config = write_config(db, http={"allow_private_networks": False, "require_https": False},
                          breaker={"failure_threshold": 2})
    produce(config, db.dsn, "ws", 3)
    rows = 3 * len(targets)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("failed") == rows, f"{rows} rows failed")
        log = dispatcher.log()
    attempts = query(db.dsn, ATTEMPTS)
    assert len(attempts) == rows, "each row made exactly one (refused) attempt"
    for url, result, status_code, status, last_error, attempt in attempts:
        assert (result, status_code, status, attempt) == ("blocked", None, "failed", 1), (url, result, last_error)
        # The customer sees a generic reason; the address and its kind stay in the operators' log.
        assert last_error == "blocked: address not allowed", (url, last_error)
        assert targets[url] in log, (url, targets[url])
    errors = query(db.dsn, "SELECT string_agg(coalesce(error, ''), ' ') FROM webhook_delivery_attempts")[0][0]
    assert not any(word in errors for word in ("127.0.0.1", "loopback", "private", "resolves")), errors
    breakers = query(db.dsn, "SELECT endpoint_id, state, consecutive_failures, last_failure_at FROM endpoint_state")
    assert all(row[1:] == ("closed", 0, None) for row in breakers), breakers
    assert receiver.stats()["total"] == 0, "nothing reached the loopback receiver"


def test_plain_http_is_refused_when_https_is_required(db, write_config, tmp_path: Path,
                                                     receiver: ReceiverProcess) -> None:
    seed_workspace(db.dsn, "ws", [receiver.url("ok", "plain")])
    config = write_config(db, http={"allow_private_networks": True, "require_https": True})
    produce(config, db.dsn, "ws", 2)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("failed") == 2, "2 rows failed")
    for _, result, _, status, last_error, _ in query(db.dsn, ATTEMPTS):
        assert (result, status) == ("blocked", "failed")
        assert last_error == "blocked: https is required"
    assert query(db.dsn, "SELECT count(*) FROM endpoint_state WHERE consecutive_failures > 0") == [(0,)]
    assert receiver.stats()["total"] == 0


def test_redirects_are_failed_attempts_and_never_followed(db, write_config, tmp_path: Path,
                                                          receiver: ReceiverProcess) -> None:
    codes = [301, 302, 307, 308]
    target = receiver.url("ok", "target")
    metadata = "http://169.254.169.254/latest/meta-data/"  # refused as a URL, and never followed to either
    seed_workspace(db.dsn, "ws", [receiver.url("redirect", f"from{code}", code=code, to=target) for code in codes]
                   + [receiver.url("redirect", "to-metadata", code=302, to=metadata)])
    config = write_config(db, retry={"base": "60s"})  # one attempt in the test's time
    produce(config, db.dsn, "ws", 2)
    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, db.dsn, lambda: len(query(db.dsn, ATTEMPTS)) == 10, "10 attempts")
    for url, result, status_code, status, last_error, attempt in query(db.dsn, ATTEMPTS):
        code = 302 if "to-metadata" in url else int(url.split("code=")[1].split("&")[0])
        assert (result, status_code, status, last_error, attempt) == ("http_3xx", code, "pending", f"HTTP {code}", 1)
    endpoints = receiver.stats()["endpoints"]
    assert {key: ep["count"] for key, ep in endpoints.items()} == {
        **{f"from{code}": 2 for code in codes}, "to-metadata": 2}, "the redirect targets were never requested"
