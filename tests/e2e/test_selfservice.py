"""Customer self-service (issue 12): endpoints, secrets, tokens and the audit log,
through the API (in-process, real Postgres) and the CLI, with the engine where
the change reaches it (claim secrets, unsigned sends, breaker close)."""

from __future__ import annotations

import base64
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatcher.api import auth
from dispatcher.cli.main import main
from dispatcher.redact import mask_url
from dispatcher.rules.breaker import BreakerPolicy, EndpointBreaker
from dispatcher.rules.retry import ENDPOINT_DEACTIVATED, ENDPOINT_DELETED
from dispatcher.signing import secret_key
from dispatcher.store.engine import EngineStore, ManagedConnection
from tests.integration import test_api
from tests.integration.test_api import World, assert_problem, bearer

# The history API tests' fixtures, shared rather than copied.
world = test_api.world
make_client = test_api.make_client

WS_SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="  # World.workspace's


def _url(ws: str = "acme") -> str:
    return f"https://{ws}.example.test/hooks"


def _claim(db: Any, grace: float = 86400.0) -> list[Any]:
    conn = ManagedConnection(db.dsn, "test-claim")
    try:
        return EngineStore(conn).claim("test-owner", 100, 4, [], 0, 30.0, grace)
    finally:
        conn.close()


def _cli(config: str, *args: str) -> int:
    """``dispatcher -c config ARGS``'s exit code: errors leave through SystemExit."""
    try:
        return main(["-c", config, *args])
    except SystemExit as exc:
        return int(exc.code or 0)


def _audit(world: World, ws: str = "acme") -> list[tuple[Any, ...]]:
    return world.sql("SELECT token_id, action, endpoint_id, delivery_ids, detail FROM api_audit"
                     " WHERE workspace_id = %s ORDER BY id", (ws,))


def _token_id(world: World, token: str) -> int:
    return int(world.sql("SELECT id FROM api_tokens WHERE token_sha256 = %s", (auth.hash_token(token),))[0][0])


# --- the masking rule -------------------------------------------------------------------------

MASKED = [
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/***/***/***/***"),
    ("https://user:pass@h.example:8443/in?key=abc#frag", "https://h.example:8443/***?***#***"),
    ("https://h.example", "https://h.example"),
    ("https://h.example/", "https://h.example/"),
    ("http://[2001:db8::1]:8080/x", "http://[2001:db8::1]:8080/***"),
    ("not a url", "***"),
    ("https://h.example:99999/x", "***"),
]


@pytest.mark.parametrize(("url", "shown"), MASKED)
def test_mask_url_keeps_scheme_host_port_and_masks_the_rest(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_read_tokens_see_masked_urls_and_write_tokens_whole_ones(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    url, shown = MASKED[1]
    endpoint = world.endpoint(ws, url=url)
    read, write = world.token(ws, auth.READ), world.token(ws, auth.READ, auth.WRITE)
    for path in (f"/v2/webhooks/endpoints/{endpoint}", "/v2/webhooks/endpoints"):
        as_read = client.simulate_get(path, headers=bearer(read)).json
        as_write = client.simulate_get(path, headers=bearer(write)).json
        as_read, as_write = (r["data"][0] if "data" in r else r for r in (as_read, as_write))
        assert (as_read["url"], as_read["url_masked"]) == (shown, True)
        assert "pass" not in json.dumps(as_read) and "key=abc" not in json.dumps(as_read)
        assert (as_write["url"], as_write["url_masked"]) == (url, False)


# --- list ----------------------------------------------------------------------------------------


def test_list_shows_each_endpoint_with_the_breaker_rules_state_backlog_and_24h_success_rate(world,
                                                                                            make_client) -> None:
    client = make_client()
    ws, other = world.workspace("acme"), world.workspace("globex")
    healthy, lapsed, opened = (world.endpoint(ws, url=_url()) for _ in range(3))
    world.endpoint(other, url=_url("globex"))
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until) VALUES"
              " (%s, 'open', 20, now() - interval '1 minute'), (%s, 'open', 21, now() + interval '4 minutes')",
              (lapsed, opened))
    event = world.event(ws, "evt_1")
    for _ in range(2):
        world.delivery(ws, lapsed, event, "pending")
    done = world.delivery(ws, healthy, event, "delivered")
    world.attempt(done, healthy, 1, "http_5xx", 503)
    world.attempt(done, healthy, 2, "delivered", 200)
    world.attempt(done, healthy, 3, "delivered", 200)
    world.attempt(done, healthy, 4, "failed", None, error=ENDPOINT_DELETED)  # no request made: not counted
    world.sql("INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,"
              " result) VALUES (%s, %s, 5, now() - interval '25 hours', 1, 'http_5xx')", (done, healthy))
    token = world.token(ws, auth.READ)
    page = client.simulate_get("/v2/webhooks/endpoints", headers=bearer(token)).json
    assert [e["id"] for e in page["data"]] == [opened, lapsed, healthy] and page["next_cursor"] is None
    by_id = {e["id"]: e for e in page["data"]}
    # The state is the breaker rule's, from the same stored rows.
    rule = BreakerPolicy()
    stored = {healthy: EndpointBreaker(), lapsed: EndpointBreaker("open", 20, 0.0),
              opened: EndpointBreaker("open", 21, float("inf"))}
    for ident, breaker in stored.items():
        assert by_id[ident]["breaker"]["state"] == rule.shown_state(breaker, 1.0)
    assert [by_id[i]["breaker"]["state"] for i in (healthy, lapsed, opened)] == ["closed", "half_open", "open"]
    assert by_id[lapsed]["pending"]["count"] == 2 and by_id[healthy]["pending"]["count"] == 0
    assert by_id[healthy]["success_rate_24h"] == {"attempts": 3, "delivered": 2, "rate": 0.6667}
    assert by_id[opened]["success_rate_24h"] == {"attempts": 0, "delivered": 0, "rate": None}
    assert by_id[healthy]["signing"] == {"secret": "workspace", "rotated_at": None, "previous_valid_until": None}
    first = client.simulate_get("/v2/webhooks/endpoints", params={"limit": "2"}, headers=bearer(token)).json
    rest = client.simulate_get("/v2/webhooks/endpoints", params={"cursor": first["next_cursor"]},
                               headers=bearer(token)).json
    assert [e["id"] for e in first["data"] + rest["data"]] == [opened, lapsed, healthy]
    assert_problem(client.simulate_get("/v2/webhooks/endpoints", params={"limit": "0"}, headers=bearer(token)), 400)
    assert_problem(client.simulate_get("/v2/webhooks/endpoints"), 401)


def test_the_operational_endpoint_is_not_the_customers_to_list_or_change(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    mine = world.endpoint(ws)
    (operational,) = world.sql("INSERT INTO webhook_endpoints (workspace_id, url, purpose)"
                               " VALUES (%s, 'https://ops.example.test/n', 'operational') RETURNING id", (ws,))[0]
    token = world.token(ws)
    listed = client.simulate_get("/v2/webhooks/endpoints", headers=bearer(token)).json
    assert [e["id"] for e in listed["data"]] == [mine]
    path = f"/v2/webhooks/endpoints/{operational}"
    for result in (client.simulate_get(path, headers=bearer(token)),
                   client.simulate_patch(path, headers=bearer(token), json={"active": False}),
                   client.simulate_delete(path, headers=bearer(token)),
                   client.simulate_post(path + "/breaker/close", headers=bearer(token)),
                   client.simulate_post(path + "/secret/rotate", headers=bearer(token))):
        assert_problem(result, 404)
    assert world.sql("SELECT active, secret FROM webhook_endpoints WHERE id = %s", (operational,)) == [(True, None)]


# --- create --------------------------------------------------------------------------------------


def test_create_returns_the_endpoints_own_secret_once_and_signs_with_it(world, make_client, db, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    created = client.simulate_post("/v2/webhooks/endpoints", headers=bearer(token), json={
        "url": _url(), "event_types": ["job.completed"], "description": "billing"})
    assert created.status_code == 201, created.text
    body = created.json
    secret = body["secret"]
    assert secret.startswith("whsec_") and len(secret_key(secret)) == 32
    assert created.headers["location"] == f"/v2/webhooks/endpoints/{body['id']}"
    assert (body["url"], body["event_types"], body["description"], body["active"]) == (
        _url(), ["job.completed"], "billing", True)
    assert body["signing"]["secret"] == "endpoint"
    # Never again: not in a read, a list, the audit log, nor any log line.
    seen = [client.simulate_get(path, headers=bearer(token)).text for path in (
        f"/v2/webhooks/endpoints/{body['id']}", "/v2/webhooks/endpoints", "/v2/webhooks/audit")]
    refused = client.simulate_patch(f"/v2/webhooks/endpoints/{body['id']}", headers=bearer(token),
                                    json={"url": "ftp://acme.example.test/"})
    seen.append(assert_problem(refused, 422)["detail"])
    assert all(secret not in text and secret[6:] not in text for text in seen)
    assert secret[6:] not in caplog.text
    # The engine signs this endpoint's rows with it (and with nothing else: no rotation yet).
    world.delivery(ws, body["id"], world.event(ws, "evt_1"))
    (row,) = _claim(db)
    assert (row.secret, row.previous_secret) == (secret, None)
    (entry,) = _audit(world)
    assert entry[:3] == (_token_id(world, token), "endpoint.create", body["id"])


def test_create_applies_the_cli_url_policy_and_the_ten_active_limit(world, make_client) -> None:
    strict = make_client(http={"require_https": True, "allow_private_networks": False})
    ws = world.workspace("acme")
    token = world.token(ws)

    def create(url: str, **fields: Any) -> Any:
        return strict.simulate_post("/v2/webhooks/endpoints", headers=bearer(token), json={"url": url, **fields})

    assert "https" in assert_problem(create("http://acme.example.test/in"), 422)["detail"]
    assert "address not allowed" in assert_problem(create("https://127.0.0.1/in"), 422)["detail"]
    assert "address not allowed" in assert_problem(create("https://10.1.2.3/in"), 422)["detail"]
    for n in range(10):
        assert create(f"https://acme.example.test/{n}").status_code == 201
    body = assert_problem(create("https://acme.example.test/11"), 409)
    assert body["type"].endswith("endpoint-limit") and "10 active" in body["detail"]
    assert create("https://acme.example.test/inactive", active=False).status_code == 201
    assert world.sql("SELECT count(*) FILTER (WHERE active), count(*) FROM webhook_endpoints")[0] == (10, 11)
    for bad in ({}, {"url": ""}, {"url": 7}, {"url": _url(), "secret": "x"}, {"url": _url(), "active": "yes"},
                {"url": _url(), "event_types": "job"}, {"url": _url(), "event_types": [""]},
                {"url": _url(), "description": "x" * 501}, {"url": _url(), "description": "nul\x00"},
                '{"url": "https://a.example.test/", "description": "\\ud800"}', [_url()], "{", "null"):
        sent = {"body": bad, "content_type": "application/json"} if isinstance(bad, str) else {"json": bad}
        assert_problem(strict.simulate_post("/v2/webhooks/endpoints", headers=bearer(token), **sent), 400)
    read_only = world.token(ws, auth.READ)
    assert_problem(strict.simulate_post("/v2/webhooks/endpoints", headers=bearer(read_only),
                                        json={"url": _url()}), 403)


# --- update and delete ---------------------------------------------------------------------------


def test_patch_changes_fields_and_deactivating_ends_pending_rows_for_good(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws, url=_url())
    token = world.token(ws)
    event = world.event(ws, "evt_1")
    waiting, delivered = world.delivery(ws, endpoint, event), world.delivery(ws, endpoint, event, "delivered")
    in_flight = world.delivery(ws, endpoint, event)
    world.sql("UPDATE webhook_deliveries SET locked_until = now() + interval '1 minute' WHERE id = %s", (in_flight,))
    path = f"/v2/webhooks/endpoints/{endpoint}"

    changed = client.simulate_patch(path, headers=bearer(token), json={
        "url": "https://acme.example.test/v2", "event_types": ["a.b"], "description": "new"})
    assert changed.status_code == 200, changed.text
    assert (changed.json["url"], changed.json["event_types"], changed.json["description"]) == (
        "https://acme.example.test/v2", ["a.b"], "new")
    cleared = client.simulate_patch(path, headers=bearer(token), json={"description": None, "event_types": []})
    assert (cleared.json["description"], cleared.json["event_types"], cleared.json["url"]) == (
        None, [], "https://acme.example.test/v2")

    assert client.simulate_patch(path, headers=bearer(token), json={"active": False}).json["active"] is False
    rows = dict(world.sql("SELECT id, status || ':' || coalesce(last_error, '') FROM webhook_deliveries"))
    assert rows == {waiting: f"failed:{ENDPOINT_DEACTIVATED}", delivered: "delivered:",
                    in_flight: "pending:"}, "a leased row is the engine's to end"
    assert client.simulate_patch(path, headers=bearer(token), json={"active": True}).json["active"] is True
    assert world.sql("SELECT status FROM webhook_deliveries WHERE id = %s", (waiting,)) == [("failed",)]

    actions = [(a[1], a[3], a[4].get("fields")) for a in _audit(world)]
    assert actions == [("endpoint.update", [], ["url", "event_types", "description"]),
                       ("endpoint.update", [], ["event_types", "description"]),
                       ("endpoint.update", [waiting], ["active"]), ("endpoint.update", [], ["active"])]
    for bad in ({}, {"colour": "red"}, {"active": None}, {"url": None}):
        assert_problem(client.simulate_patch(path, headers=bearer(token), json=bad), 400)
    assert_problem(client.simulate_patch(path, headers=bearer(token), json={"url": "ftp://x.example/"}), 422)
    other = world.endpoint(world.workspace("globex"))
    assert_problem(client.simulate_patch(f"/v2/webhooks/endpoints/{other}", headers=bearer(token),
                                         json={"active": False}), 404)
    assert_problem(client.simulate_patch(path, headers=bearer(world.token(ws, auth.READ)),
                                         json={"active": False}), 403)


def test_trace_headers_are_on_by_default_and_set_per_endpoint(world, make_client, db) -> None:
    """Issue 26: whether an endpoint's POSTs carry traceparent, shown, set at create and by PATCH, claimed."""
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    made = client.simulate_post("/v2/webhooks/endpoints", headers=bearer(token), json={"url": _url()})
    assert made.status_code == 201 and made.json["trace_headers"] is True
    quiet = client.simulate_post("/v2/webhooks/endpoints", headers=bearer(token),
                                 json={"url": _url(), "trace_headers": False})
    assert quiet.status_code == 201 and quiet.json["trace_headers"] is False
    path = f"/v2/webhooks/endpoints/{made.json['id']}"
    assert client.simulate_patch(path, headers=bearer(token), json={"trace_headers": False}).json[
        "trace_headers"] is False
    assert client.simulate_get(path, headers=bearer(token)).json["trace_headers"] is False
    assert_problem(client.simulate_patch(path, headers=bearer(token), json={"trace_headers": "no"}), 400)
    assert [a[4].get("fields") for a in _audit(world) if a[1] == "endpoint.update"] == [["trace_headers"]]
    event = world.event(ws, "evt_1")
    world.delivery(ws, made.json["id"], event)
    world.sql("UPDATE webhook_deliveries SET locked_until = NULL, claim_token = NULL, locked_by = NULL")
    (row,) = _claim(db)
    assert row.trace_headers is False


def test_reactivating_past_the_ten_active_limit_is_409(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    spare = world.endpoint(ws, active=False)
    for _ in range(10):
        world.endpoint(ws)
    token = world.token(ws)
    body = assert_problem(client.simulate_patch(f"/v2/webhooks/endpoints/{spare}", headers=bearer(token),
                                                json={"active": True}), 409)
    assert "10 active" in body["detail"]
    assert world.sql("SELECT active FROM webhook_endpoints WHERE id = %s", (spare,)) == [(False,)]


def test_delete_ends_pending_rows_and_the_endpoint_is_gone(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)
    token = world.token(ws)
    pending = world.delivery(ws, endpoint, world.event(ws, "evt_1"))
    deleted = client.simulate_delete(f"/v2/webhooks/endpoints/{endpoint}", headers=bearer(token))
    assert deleted.status_code == 204
    assert world.sql("SELECT status, last_error FROM webhook_deliveries WHERE id = %s", (pending,)) == [
        ("failed", ENDPOINT_DELETED)]
    assert_problem(client.simulate_get(f"/v2/webhooks/endpoints/{endpoint}", headers=bearer(token)), 404)
    assert_problem(client.simulate_delete(f"/v2/webhooks/endpoints/{endpoint}", headers=bearer(token)), 404)
    assert [(a[1], a[2], a[3]) for a in _audit(world)] == [("endpoint.delete", endpoint, [pending])]


# --- breaker close -------------------------------------------------------------------------------


def test_breaker_close_lets_pending_rows_flow_at_once(world, make_client, db) -> None:
    client = make_client()
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)
    token = world.token(ws)
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at)"
              " VALUES (%s, 'open', 20, now() + interval '5 minutes', now())", (endpoint,))
    event = world.event(ws, "evt_1")
    due = world.delivery(ws, endpoint, event)
    backing_off = world.delivery(ws, endpoint, event)
    world.sql("UPDATE webhook_deliveries SET next_attempt_at = now() + interval '1 hour', locked_until = NULL"
              " WHERE id = %s", (backing_off,))
    assert _claim(db) == [], "the open breaker holds both rows"
    closed = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/breaker/close", headers=bearer(token))
    assert closed.status_code == 200, closed.text
    assert closed.json["breaker"] == {"state": "closed", "consecutive_failures": 0, "open_until": None,
                                      "opened_at": closed.json["breaker"]["opened_at"]}
    assert sorted(row.id for row in _claim(db)) == [due, backing_off]
    (entry,) = _audit(world)
    assert entry[1:3] == ("endpoint.breaker_close", endpoint)
    assert entry[4] == {"stored_state": "open", "consecutive_failures": 20, "made_due": 1}
    # An endpoint the engine never failed has no breaker row: closing it is a no-op, not an error.
    fresh = world.endpoint(ws)
    assert client.simulate_post(f"/v2/webhooks/endpoints/{fresh}/breaker/close",
                                headers=bearer(token)).status_code == 200
    assert_problem(client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/breaker/close",
                                        headers=bearer(world.token(ws, auth.READ))), 403)


# --- secrets -------------------------------------------------------------------------------------


def test_rotation_returns_the_new_secret_once_and_both_sign_during_the_grace(world, make_client, db) -> None:
    client = make_client(secrets={"rotation_grace": "1h"})
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)  # registered the old way: signs with the workspace secret
    token = world.token(ws)
    world.delivery(ws, endpoint, world.event(ws, "evt_1"))
    rotated = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/secret/rotate", headers=bearer(token))
    assert rotated.status_code == 200, rotated.text
    first = rotated.json["secret"]
    assert first.startswith("whsec_") and len(secret_key(first)) == 32
    (row,) = _claim(db, grace=3600.0)
    assert (row.secret, row.previous_secret) == (first, WS_SECRET), "the workspace secret signs during the grace"
    world.sql("UPDATE webhook_deliveries SET locked_until = NULL, claim_token = NULL")  # claimable again
    world.sql("DELETE FROM endpoint_leases")
    (row,) = _claim(db, grace=0.001)
    assert (row.secret, row.previous_secret) == (first, None), "after the grace only the new one"
    second = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/secret/rotate", headers=bearer(token)).json
    assert second["secret"] != first
    assert world.sql("SELECT previous_secret FROM webhook_endpoints WHERE id = %s", (endpoint,)) == [(first,)]
    shown = client.simulate_get(f"/v2/webhooks/endpoints/{endpoint}", headers=bearer(token))
    assert shown.json["signing"]["secret"] == "endpoint"
    assert shown.json["signing"]["previous_valid_until"] == second["previous_valid_until"]
    everything = shown.text + client.simulate_get("/v2/webhooks/audit", headers=bearer(token)).text
    assert first[6:] not in everything and second["secret"][6:] not in everything
    assert [a[1] for a in _audit(world)] == ["endpoint.secret_rotate"] * 2


def test_during_the_grace_the_receiver_gets_both_signatures(db, world, make_client, write_config,
                                                            tmp_path: Path) -> None:
    from standardwebhooks import Webhook

    from dispatcher_devtools.kit import SECRET, Dispatcher, capture_server, produce, seed_workspace, wait_until

    with capture_server() as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url + "/hook"])
        config = write_config(db)
        (endpoint,) = [r[0] for r in world.sql("SELECT id FROM webhook_endpoints")]
        token = world.token("ws")
        new = make_client().simulate_post(f"/v2/webhooks/endpoints/{endpoint}/secret/rotate",
                                          headers=bearer(token)).json["secret"]
        produce(config, db.dsn, "ws", 1)
        with Dispatcher(config, tmp_path / "dispatcher.log"):
            wait_until(lambda: receiver.posts("/hook") == 1, message="the delivery")
        (post,) = receiver.captured
        headers = {k.lower(): v for k, v in post.headers.items()}
        assert len(headers["webhook-signature"].split()) == 2
        from dispatcher.signing import as_standard_secret

        for secret in (new, as_standard_secret(SECRET)):
            Webhook(secret).verify(post.body, headers)  # raises if no signature matches
        assert new[6:] not in (tmp_path / "dispatcher.log").read_text()


@pytest.mark.parametrize("secret", ["", "whsec_"])
def test_an_empty_secret_never_produces_an_unsigned_delivery(db, world, write_config, tmp_path: Path,
                                                             secret: str) -> None:
    from dispatcher_devtools.kit import Dispatcher, capture_server, produce, seed_workspace, wait_until

    with capture_server() as receiver:
        seed_workspace(db.dsn, "ws", [receiver.url + "/hook"])
        # An outside tool's write: the 0010 CHECK refuses '' for new rows, so
        # drop it for this row (as if it predated 0010) -- the engine must hold anyway.
        world.sql("ALTER TABLE workspaces DROP CONSTRAINT workspaces_secret_not_empty")
        world.sql("UPDATE workspaces SET secret = %s", (secret,))
        config = write_config(db)
        produce(config, db.dsn, "ws", 1)
        with Dispatcher(config, tmp_path / "dispatcher.log"):
            wait_until(lambda: world.count("status <> 'pending'") == 1, message="the row ends")
        assert receiver.captured == []
        assert world.count("status = 'failed'") == 1
        (error,) = world.sql("SELECT last_error FROM webhook_deliveries")[0]
        assert "signing secret unusable" in error and "unsigned" in error


@pytest.mark.parametrize(("given", "ok"), [
    ("whsec_", False), ("", False), ("short-plain-secret", False),
    ("whsec_" + base64.b64encode(b"x" * 23).decode(), False), ("whsec_not*base64", False),
    ("whsec_" + base64.b64encode(b"x" * 24).decode(), True), ("a-plain-secret-of-24-chars", True),
])
def test_workspace_create_refuses_weak_secrets_without_echoing_them(db, world, write_config, capsys,
                                                                    given: str, ok: bool) -> None:
    config = str(write_config(db))
    code = _cli(config, "workspace", "create", "--id", "acme", "--secret", given)
    out, err = capsys.readouterr()
    assert (code == 0) is ok, err
    assert world.sql("SELECT count(*) FROM workspaces")[0][0] == (1 if ok else 0)
    if not ok:
        assert "secret" in err and "refused" in err
        assert given[6:] not in err if len(given) > 6 else True


def test_secret_strength_applies_to_stdin_too(db, world, write_config, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("whsec_\n"))
    config = str(write_config(db))
    assert _cli(config, "workspace", "create", "--id", "acme", "--secret-stdin") != 0
    assert "too weak" in capsys.readouterr().err
    assert main(["-c", config, "workspace", "create", "--id", "acme"]) == 0
    (stored,) = world.sql("SELECT secret FROM workspaces")[0]
    assert len(secret_key(stored)) >= 24


# --- tokens --------------------------------------------------------------------------------------


def test_token_create_expires_list_and_revoke_in_the_cli(db, world, make_client, write_config, capsys) -> None:
    client = make_client()
    world.workspace("acme")
    config = str(write_config(db))
    assert main(["-c", config, "token", "create", "--workspace", "acme", "--expires", "90d"]) == 0
    token = capsys.readouterr().out.strip()
    (days,) = world.sql("SELECT extract(epoch FROM expires_at - created_at) / 86400 FROM api_tokens")[0]
    assert round(float(days), 3) == 90
    assert _cli(config, "token", "create", "--workspace", "acme", "--expires", "soon") != 0
    assert "lifetime" in capsys.readouterr().err
    assert client.simulate_get("/v2/webhooks/tokens", headers=bearer(token)).status_code == 200
    assert main(["-c", config, "token", "list", "--workspace", "acme"]) == 0
    listing = capsys.readouterr().out
    assert token[:12] in listing and token[12:] not in listing
    token_id = _token_id(world, token)
    assert main(["-c", config, "token", "revoke", str(token_id)]) == 0
    capsys.readouterr()
    # The very next request of the same API process: no cache outlives the revoke.
    assert_problem(client.simulate_get("/v2/webhooks/tokens", headers=bearer(token)), 401)
    assert _cli(config, "token", "revoke", str(token_id)) != 0
    assert "already revoked" in capsys.readouterr().err
    assert _cli(config, "token", "revoke", "999999") != 0


def test_an_expired_token_is_401_at_once(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    assert client.simulate_get("/v2/webhooks/endpoints", headers=bearer(token)).status_code == 200
    world.sql("UPDATE api_tokens SET expires_at = now() - interval '1 second'")
    assert_problem(client.simulate_get("/v2/webhooks/endpoints", headers=bearer(token)), 401)


def test_token_list_shows_the_workspaces_own_tokens_and_never_a_secret(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    mine = [world.token(ws, auth.READ), world.token(ws)]
    theirs = world.token(world.workspace("globex"))
    listed = client.simulate_get("/v2/webhooks/tokens", headers=bearer(mine[0]))
    assert listed.status_code == 200
    data = listed.json["data"]
    assert [t["prefix"] for t in data] == [mine[1][:12], mine[0][:12]]
    assert data[1]["scopes"] == [auth.READ] and data[0]["expires_at"] is None and data[0]["revoked_at"] is None
    hashes = [r[0] for r in world.sql("SELECT token_sha256 FROM api_tokens")]
    for secret in [*(t[12:] for t in mine), theirs[:12], *hashes]:
        assert secret not in listed.text


def test_last_used_is_written_at_most_once_a_minute(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)

    def last_used() -> Any:
        return world.sql("SELECT last_used_at FROM api_tokens")[0][0]

    def xmin() -> int:
        return int(world.sql("SELECT xmin::text::bigint FROM api_tokens")[0][0])

    assert last_used() is None
    client.simulate_get("/v2/webhooks/tokens", headers=bearer(token))
    first, version = last_used(), xmin()
    assert first is not None
    for _ in range(5):
        client.simulate_get("/v2/webhooks/tokens", headers=bearer(token))
    assert (last_used(), xmin()) == (first, version), "no write within the minute"
    world.sql("UPDATE api_tokens SET last_used_at = now() - interval '61 seconds'")
    client.simulate_get("/v2/webhooks/tokens", headers=bearer(token))
    assert last_used() > first - timedelta(seconds=1)
    shown = client.simulate_get("/v2/webhooks/tokens", headers=bearer(token)).json["data"][0]["last_used_at"]
    assert shown is not None


# --- audit ---------------------------------------------------------------------------------------


def test_replay_and_recover_are_audited_with_their_rows_and_the_log_is_paginated(world, make_client) -> None:
    client = make_client()
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws)
    token = world.token(ws)
    dead = [world.delivery(ws, endpoint, world.event(ws, f"evt_{n}"), "dead", age=timedelta(hours=1))
            for n in range(3)]
    replay = client.simulate_post(f"/v2/webhooks/deliveries/{dead[0]}/replay", headers=bearer(token)).json
    recover = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/recover", headers=bearer(token),
                                   json={"since": "2020-01-01T00:00:00Z"})
    assert recover.status_code == 422  # beyond recover_max_age: refused, so not audited
    since = (world.sql("SELECT now() - interval '2 hours'")[0][0]).isoformat()
    recover = client.simulate_post(f"/v2/webhooks/endpoints/{endpoint}/recover", headers=bearer(token),
                                   json={"since": since})
    assert recover.json["queued"] == 2
    new_rows = sorted(r[0] for r in world.sql("SELECT id FROM webhook_deliveries WHERE replay_of IS NOT NULL"
                                              " AND id <> %s", (replay["id"],)))
    reader = world.token(ws, auth.READ)
    entries = client.simulate_get("/v2/webhooks/audit", headers=bearer(reader)).json
    assert [e["action"] for e in entries["data"]] == ["endpoint.recover", "delivery.replay"]
    recovered, replayed = entries["data"]
    assert replayed["delivery_ids"] == [replay["id"]] and replayed["detail"] == {"replay_of": dead[0]}
    assert sorted(recovered["delivery_ids"]) == new_rows and recovered["detail"]["queued"] == 2
    assert {e["token_id"] for e in entries["data"]} == {_token_id(world, token)}
    assert {e["endpoint_id"] for e in entries["data"]} == {endpoint}
    page = client.simulate_get("/v2/webhooks/audit", params={"limit": "1"}, headers=bearer(reader)).json
    rest = client.simulate_get("/v2/webhooks/audit", params={"cursor": page["next_cursor"]},
                               headers=bearer(reader)).json
    assert [e["id"] for e in page["data"] + rest["data"]] == [e["id"] for e in entries["data"]]
    other = world.token(world.workspace("globex"))
    assert client.simulate_get("/v2/webhooks/audit", headers=bearer(other)).json["data"] == []
    filtered = client.simulate_get("/v2/webhooks/audit", params={"endpoint_id": str(endpoint + 1)},
                                   headers=bearer(reader)).json
    assert filtered["data"] == []
    assert_problem(client.simulate_get("/v2/webhooks/audit", params={"endpoint_id": "x"},
                                       headers=bearer(reader)), 400)


# --- the CLI verbs -------------------------------------------------------------------------------


def test_owner_contact_is_set_shown_and_cleared_in_the_api_and_cli(world, make_client, db, write_config,
                                                                  capsys) -> None:
    """Issue 12: PATCH takes the owner contact (the breaker notices' recipient), checked as an email."""
    client = make_client()
    ws = world.workspace("acme")
    token = world.token(ws)
    created = client.simulate_post("/v2/webhooks/endpoints", headers=bearer(token),
                                   json={"url": _url(), "owner_contact": "ops@acme.example"})
    assert created.status_code == 201, created.text
    path = f"/v2/webhooks/endpoints/{created.json['id']}"
    assert client.simulate_get(path, headers=bearer(token)).json["owner_contact"] == "ops@acme.example"
    refused = client.simulate_patch(path, headers=bearer(token), json={"owner_contact": "ops@acme\r\nBcc: x@y.z"})
    assert_problem(refused, 400)
    assert "owner_contact" in refused.json["detail"]
    changed = client.simulate_patch(path, headers=bearer(token), json={"owner_contact": "oncall@acme.example"})
    assert changed.json["owner_contact"] == "oncall@acme.example"
    assert client.simulate_patch(path, headers=bearer(token), json={"owner_contact": None}).json[
        "owner_contact"] is None
    assert [a[4].get("fields") for a in _audit(world)][-2:] == [["owner_contact"], ["owner_contact"]]

    config = str(write_config(db))
    assert _cli(config, "endpoint", "update", str(created.json["id"]), "--owner", "not-an-email") != 0
    assert _cli(config, "endpoint", "update", str(created.json["id"]), "--owner", "cli@acme.example") == 0
    assert world.sql("SELECT owner_contact FROM webhook_endpoints") == [("cli@acme.example",)]
    assert _cli(config, "endpoint", "update", str(created.json["id"]), "--owner", "") == 0
    assert world.sql("SELECT owner_contact FROM webhook_endpoints") == [(None,)]
    capsys.readouterr()


def test_workspace_settings_name_who_hears_of_breakers_through_the_api(world, make_client) -> None:
    """Issue 12 item 4: the workspace's owner contact and its operational webhook URL are the customer's to set."""
    client = make_client()
    ws, other = world.workspace("acme"), world.workspace("globex")
    read, write = world.token(ws, auth.READ), world.token(ws)
    assert client.simulate_get("/v2/webhooks/workspace", headers=bearer(read)).json == {
        "workspace_id": "acme", "owner_contact": None, "owner_contact_confirmed": False, "notify_webhook_url": None,
        "url_masked": True}
    assert_problem(client.simulate_patch("/v2/webhooks/workspace", headers=bearer(read),
                                         json={"owner_contact": "ops@acme.example"}), 403)
    url, shown = "https://ops.example.test/notices/k3y", "https://ops.example.test/***/***"
    changed = client.simulate_patch("/v2/webhooks/workspace", headers=bearer(write),
                                    json={"owner_contact": "ops@acme.example", "notify_webhook_url": url})
    assert changed.status_code == 200, changed.text
    assert changed.json == {"workspace_id": "acme", "owner_contact": "ops@acme.example",
                            "owner_contact_confirmed": False, "notify_webhook_url": url, "url_masked": False}
    as_read = client.simulate_get("/v2/webhooks/workspace", headers=bearer(read)).json
    assert (as_read["notify_webhook_url"], as_read["url_masked"]) == (shown, True)
    for bad, status in (({"owner_contact": "nobody"}, 400),
                        ({"notify_webhook_url": "https://user:pass@ops.example.test/x"}, 422),
                        ({"secret": "x"}, 400), ({}, 400)):
        assert_problem(client.simulate_patch("/v2/webhooks/workspace", headers=bearer(write), json=bad), status)
    cleared = client.simulate_patch("/v2/webhooks/workspace", headers=bearer(write), json={"notify_webhook_url": None})
    assert cleared.json["notify_webhook_url"] is None and cleared.json["owner_contact"] == "ops@acme.example"
    assert world.sql("SELECT id, owner_contact, notify_webhook_url FROM workspaces ORDER BY id") == [
        (ws, "ops@acme.example", None), (other, None, None)]
    assert [(a[1], a[4]["fields"]) for a in _audit(world)] == [
        ("workspace.update", ["owner_contact", "notify_webhook_url"]), ("workspace.update", ["notify_webhook_url"])]


def test_cli_endpoint_verbs_share_the_apis_rules(db, world, write_config, capsys) -> None:
    ws = world.workspace("acme")
    config = str(write_config(db, http={"require_https": True, "allow_private_networks": False}))

    def cli(*args: str) -> tuple[int, str, str]:
        code = _cli(config, "endpoint", *args)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = cli("add", "--workspace", ws, "--url", "https://hooks.example.test/a/b")
    endpoint = int(out.splitlines()[0])  # then the endpoint's own secret
    pending = world.delivery(ws, endpoint, world.event(ws, "evt_1"))
    code, out, _ = cli("list", "--workspace", ws)
    assert code == 0 and str(endpoint) in out and "https://hooks.example.test/a/b" in out and "closed" in out
    code, out, _ = cli("show", str(endpoint))
    shown = json.loads(out)
    assert shown["id"] == endpoint and shown["pending"]["count"] == 1 and shown["url_masked"] is False
    assert cli("update", str(endpoint), "--url", "http://hooks.example.test/")[0] != 0
    assert cli("update", str(endpoint))[0] != 0
    assert cli("update", str(endpoint), "--description", "ops", "--events", "a.b,c.d")[0] == 0
    assert world.sql("SELECT description, event_types FROM webhook_endpoints") == [("ops", ["a.b", "c.d"])]
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until)"
              " VALUES (%s, 'open', 20, now() + interval '5 minutes')", (endpoint,))
    code, out, _ = cli("close-breaker", str(endpoint))
    assert code == 0 and "closed" in out
    assert world.sql("SELECT state FROM endpoint_state") == [("closed",)]
    code, out, err = cli("rotate-secret", str(endpoint))
    assert code == 0 and out.strip().startswith("whsec_") and "previous secret" in err
    assert cli("update", str(endpoint), "--inactive")[0] == 0
    assert world.sql("SELECT status, last_error FROM webhook_deliveries WHERE id = %s", (pending,)) == [
        ("failed", ENDPOINT_DEACTIVATED)]
    assert cli("delete", str(endpoint))[0] == 0
    code, _, err = cli("show", str(endpoint))
    assert code != 0 and "does not exist" in err
    actions = [(a[0], a[1]) for a in _audit(world)]
    assert actions == [(None, "endpoint.create"), (None, "endpoint.update"), (None, "endpoint.breaker_close"),
                       (None, "endpoint.secret_rotate"), (None, "endpoint.update"), (None, "endpoint.delete")]
