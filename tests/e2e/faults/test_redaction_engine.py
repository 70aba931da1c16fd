"""Redaction through the engine: what receivers send back is scrubbed before it is
stored, logged or served.

A receiver echoes credentials and the workspace secret in its answer; the log,
every text column outside ``workspaces`` and the API's responses are grepped
for them.  The scrubber's own cases are in ``tests/unit/test_redaction.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import falcon.testing
import pytest

from dispatcher import load_config
from dispatcher.api.app import create_app
from dispatcher.api.auth import READ, create_token
from dispatcher.redact import MASK
from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts
from tests.support import LoopbackServer, Request, responder, response
from tests.support.faults import settle, text_dump

pytestmark = pytest.mark.timeout(60)

BARE = SECRET.removeprefix("whsec_")  # the key part alone, as a receiver's config file may hold it

# --------------------------------------------------------------------------- the engine end to end

# Today's workspaces have plain secrets that look like nothing in particular:
# only masking the row's own secret by value catches an echo of one.
LEGACY = "correct-horse-battery-staple"
ECHO = ("Authorization: Bearer abc123DEF456ghi789\n"
        "password=hunter2-is-mine&user=bob\n"
        '{"api_key": "key with spaces", "note": "sig check failed"}\n'
        f"expected {LEGACY} or {SECRET}\n"
        f"raw key {BARE}\n")
LEAKS = ("abc123DEF456ghi789", "hunter2", "key with spaces", LEGACY, SECRET, BARE)


def _echo(request: Request) -> bytes:
    return response(500 if request.path.startswith("/fail") else 200, ECHO.encode())


def test_echoed_credentials_and_the_workspace_secret_never_reach_the_database_log_or_api(
        db, write_config, tmp_path: Path) -> None:
    assert len(ECHO.encode()) < 256, "everything echoed falls inside the stored excerpt"
    with LoopbackServer(responder(_echo)) as server:
        failing, fine = seed_workspace(db.dsn, "ws", [server.url("/fail"), server.url("/ok")], secret=LEGACY)
        # Mid-rotation: the row carries both secrets, and both are echoed.
        query(db.dsn, "UPDATE workspaces SET previous_secret = %s, secret_rotated_at = now()", (SECRET,))
        # A breaker that opens at once: its notification (logged) carries last_error.
        config = write_config(db, retry={"base": "60s"}, breaker={"failure_threshold": 1})
        event_ids = produce(config, db.dsn, "ws", 2)
        with Dispatcher(config, tmp_path / "d.log") as dispatcher:
            settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("delivered") == 2
                   and query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts")[0][0] == 4, "4 attempts")
            settle(dispatcher, db.dsn, lambda: "notify endpoint owner" in dispatcher.log(), "the breaker notice")
        log = dispatcher.log()

    attempts = query(db.dsn, "SELECT endpoint_id, result, status_code, error, response_excerpt "
                             "FROM webhook_delivery_attempts ORDER BY id")
    for endpoint_id, result, status_code, error, stored in attempts:
        assert (result, status_code, error) == (("http_5xx", 500, "HTTP 500") if endpoint_id == failing
                                                else ("delivered", 200, None))
        assert MASK in stored and "user=bob" in stored and "sig check failed" in stored, stored
        assert not [leak for leak in LEAKS if leak in stored], stored
    assert {row[0] for row in attempts} == {failing, fine}

    dump = text_dump(db.dsn)  # every text/json column of every table but workspaces
    assert any(column == "response_excerpt" for _, column, _ in dump)
    found = [(table, column) for table, column, value in dump for leak in LEAKS if leak in value]
    assert not found, found
    assert not [leak for leak in LEAKS if leak in log], "the dispatcher's log holds no secret"

    app = create_app(load_config(config, env={}), db.dsn)
    try:
        client = falcon.testing.TestClient(app)
        conn = db.connect()
        try:
            token = create_token(conn, "ws", [READ])
        finally:
            conn.close()
        headers = {"Authorization": f"Bearer {token}"}
        ids = [row[0] for row in query(db.dsn, "SELECT id FROM webhook_deliveries ORDER BY id")]
        paths = ["/v2/webhooks/deliveries", f"/v2/webhooks/endpoints/{failing}", f"/v2/webhooks/endpoints/{fine}",
                 *(f"/v2/webhooks/deliveries/{i}" for i in ids), *(f"/v2/events/{e}/deliveries" for e in event_ids)]
        for path in paths:
            result = client.simulate_get(path, headers=headers)
            assert result.status_code == 200, (path, result.text)
            assert not [leak for leak in LEAKS if leak in result.text], (path, result.text)
        served = client.simulate_get(f"/v2/webhooks/deliveries/{ids[0]}", headers=headers).json
        assert any(MASK in (a["response_excerpt"] or "") for a in served["attempts"]), json.dumps(served)
    finally:
        app.pool.close()
