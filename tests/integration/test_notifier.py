"""Breaker notices to endpoint owners (issue 12 item 4, docs/decisions.md, Q3), engine-level:
the real store, real breaker writes (EngineStore.update_breakers) and a real SMTP
server in the test process (aiosmtpd).  tests/e2e/test_notifier_dispatcher.py runs
the same through the dispatcher itself."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from dispatcher.config import Config, ConfigError, config_from_mapping
from dispatcher.contacts import InvalidContact, check_email
from dispatcher.engine.notifier import MailRetry, OwnerNotices, recipient, same_target
from dispatcher.rules.backoff import Backoff
from dispatcher.rules.breaker import BreakerBatch, BreakerPolicy, BreakerSignal, Signal
from dispatcher.store.engine import EngineStore, ManagedConnection
from dispatcher.store.notices import NoticeStore
from dispatcher_devtools.kit import config_for_test, produce, seed_workspace, write_config
from tests.support import TestCA, self_signed, server_tls
from tests.support.smtp import free_port, smtp_server

POLICY = BreakerPolicy(failure_threshold=3, open_for=60.0)
OPERATOR = "ops@example.com"

pytestmark = pytest.mark.timeout(60)


def _config(dsn: str, port: int, endpoints: dict[str, str] | None = None, **notifier: Any) -> Config:
    raw = config_for_test(dsn, notifier={"kind": "smtp", "smtp_host": "127.0.0.1", "smtp_port": port,
                                         "smtp_security": "none", "smtp_to": OPERATOR, "smtp_timeout": "5s",
                                         **notifier}, endpoints=endpoints or {"flap_window": "1ms"})
    return config_from_mapping(raw, env={})


def _notices(config: Config, dsn: str) -> OwnerNotices:
    return OwnerNotices(config, NoticeStore(ManagedConnection(dsn, "test notify")))


def _breaker(dsn: str, endpoint_id: int, signal: BreakerSignal, times: int = 1) -> None:
    """Record ``times`` attempt results of ``endpoint_id`` as the worker's flush does."""
    engine = EngineStore(ManagedConnection(dsn, "test flush"))
    batch = BreakerBatch(POLICY, [Signal(endpoint_id, signal, "HTTP 500") for _ in range(times)])
    engine.update_breakers([endpoint_id], batch)


def _open(dsn: str, endpoint_id: int) -> None:
    _breaker(dsn, endpoint_id, BreakerSignal.FAILURE, POLICY.failure_threshold)


def _close(dsn: str, endpoint_id: int) -> None:
    _breaker(dsn, endpoint_id, BreakerSignal.SUCCESS)


def _confirmed(db: Any, workspace_id: str, address: str) -> None:
    """``address`` confirmed as an owner contact of the workspace, as its mailed link would leave it."""
    db.query("INSERT INTO contact_confirmations (workspace_id, address, sent_at, confirmed_at)"
             " VALUES (%s, %s, now(), now())", (workspace_id, address))


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize(("endpoint", "workspace", "expected"), [
    ("e@example.com", "w@example.com", ("e@example.com", "endpoint")),
    (None, "w@example.com", ("w@example.com", "workspace")),
    (None, None, (OPERATOR, "operator")),
    ("", "", (OPERATOR, "operator")),
    # Written around the CLI (raw SQL): passed over, never put in a header.
    ("e@example.com\r\nBcc: x@evil.example", "w@example.com", ("w@example.com", "workspace")),
    ("nobody", "localhost", (OPERATOR, "operator")),
])
def test_recipient_falls_back_from_endpoint_to_workspace_to_operator(endpoint: str | None, workspace: str | None,
                                                                     expected: tuple[str, str]) -> None:
    everyone = {contact for contact in (endpoint, workspace) if contact}
    assert recipient(endpoint, workspace, OPERATOR, everyone) == expected


@pytest.mark.parametrize(("confirmed", "expected"), [
    ({"e@example.com", "w@example.com"}, ("e@example.com", "endpoint")),
    ({"w@example.com"}, ("w@example.com", "workspace")),
    ({"e@example.com"}, ("e@example.com", "endpoint")),
    (set(), (OPERATOR, "operator")),
])
def test_only_confirmed_contacts_are_recipients(confirmed: set[str], expected: tuple[str, str]) -> None:
    assert recipient("e@example.com", "w@example.com", OPERATOR, confirmed) == expected


@pytest.mark.parametrize(("first", "second", "same"), [
    ("https://hooks.example.com/x", "https://hooks.example.com/x", True),
    ("HTTPS://Hooks.Example.com:443/x", "https://hooks.example.com/x", True),
    ("https://hooks.example.com/x", "https://hooks.example.com/y", False),
    ("https://hooks.example.com/x", "http://hooks.example.com/x", False),
    ("https://hooks.example.com:8443/x", "https://hooks.example.com/x", False),
    ("https://hooks.example.com/x?a=1", "https://hooks.example.com/x?a=2", False),
])
def test_same_target_compares_normalised_urls(first: str, second: str, same: bool) -> None:
    assert same_target(first, second) is same


def test_mail_retry_doubles_then_gives_up() -> None:
    retry = MailRetry(attempts=4, backoff=Backoff(base=60.0))
    assert [retry.delay_after(n) for n in (1, 2, 3, 4, 5)] == [60.0, 120.0, 240.0, None, None]


@pytest.mark.parametrize("good", ["ops@example.com", "first.last+tag@sub.example.co.uk", "a_b-c@x-y.example"])
def test_plain_email_addresses_pass(good: str) -> None:
    assert check_email(good) == good


@pytest.mark.parametrize("bad", [
    "", "ops", "ops@", "@example.com", "ops@localhost", "ops@example.com\r\nBcc: x@evil.example",
    "ops @example.com", "\"quoted\"@example.com", "ops@-bad.example", "ops@example.123", "a..b@example.com",
    "ops@exa_mple.com", "öps@example.com", "x" * 65 + "@example.com", "ops@" + "a" * 250 + ".com",
])
def test_anything_else_is_refused(bad: str) -> None:
    with pytest.raises(InvalidContact):
        check_email(bad)


def test_config_checks_the_addresses_and_keeps_the_password_out_of_its_repr(db) -> None:
    with pytest.raises(ConfigError, match="notifier.smtp_to"):
        _config(db.dsn, 25, smtp_to="not-an-address")
    config = _config(db.dsn, 25, smtp_username="mailer", smtp_password="s3cret-pass")
    assert config.notifier.smtp_password == "s3cret-pass"
    assert "s3cret-pass" not in repr(config)
    from_env = config_from_mapping(config_for_test(db.dsn), env={"DISPATCHER_SMTP_PASSWORD": "from-env"})
    assert from_env.notifier.smtp_password == "from-env"


# ---------------------------------------------------------------- mails, engine-level


def test_one_opened_and_one_recovered_mail_per_episode_to_the_endpoint_owner(db) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    db.query("UPDATE webhook_endpoints SET owner_contact = 'owner@example.com'")
    _confirmed(db, "ws", "owner@example.com")
    with smtp_server() as smtp:
        # A flap window of a millisecond: the round after the one that sees the breaker closed ends the
        # episode (the flapping test has a real one).
        notices = _notices(_config(db.dsn, smtp.port, endpoints={"flap_window": "1ms"}), db.dsn)
        notices.run_once()
        assert smtp.received() == [], "nothing to say while the breaker is closed"
        _open(db.dsn, endpoint)
        for _ in range(3):
            notices.run_once()
        _breaker(db.dsn, endpoint, BreakerSignal.FAILURE)  # more failures while open: the same episode
        notices.run_once()
        (opened,) = smtp.received()
        assert opened.recipients == ["owner@example.com"]
        assert "failing" in opened.subject and "hooks.example.com" in opened.body and "/a" not in opened.body
        _close(db.dsn, endpoint)
        notices.run_once()
        notices.run_once()
        assert [m.subject for m in smtp.received("recovered")] == [f"Webhook endpoint {endpoint} recovered"]
        assert len(smtp.received()) == 2
        # A second episode is a second pair.
        _open(db.dsn, endpoint)
        notices.run_once()
        _close(db.dsn, endpoint)
        notices.run_once()
        notices.run_once()
        assert len(smtp.received("failing")) == 2 and len(smtp.received("recovered")) == 2
    assert db.query("SELECT episode, kind, recipient, sent_at IS NOT NULL FROM breaker_notices "
                    "ORDER BY episode, kind") == [
        (1, "opened", "owner@example.com", True), (1, "recovered", "owner@example.com", True),
        (2, "opened", "owner@example.com", True), (2, "recovered", "owner@example.com", True)]


def test_fallback_to_the_workspace_owner_then_the_operator(db) -> None:
    ids = seed_workspace(db.dsn, "ws", ["https://a.example.com/", "https://b.example.com/"])
    (nobody,) = seed_workspace(db.dsn, "nobody", ["https://c.example.com/"])
    db.query("UPDATE webhook_endpoints SET owner_contact = 'endpoint@example.com' WHERE id = %s", (ids[0],))
    db.query("UPDATE workspaces SET owner_contact = 'workspace@example.com' WHERE id = 'ws'")
    _confirmed(db, "ws", "endpoint@example.com")
    _confirmed(db, "ws", "workspace@example.com")
    with smtp_server() as smtp:
        notices = _notices(_config(db.dsn, smtp.port), db.dsn)
        for endpoint_id in [*ids, nobody]:
            _open(db.dsn, endpoint_id)
        notices.run_once()
        by_recipient = sorted((m.recipients[0], m.subject.split()[2]) for m in smtp.received())
    assert by_recipient == sorted([("endpoint@example.com", str(ids[0])), ("workspace@example.com", str(ids[1])),
                                   (OPERATOR, str(nobody))])


def test_two_processes_at_once_send_each_mail_once(db) -> None:
    endpoints = seed_workspace(db.dsn, "ws", [f"https://h{n}.example.com/" for n in range(6)])
    with smtp_server() as smtp:
        config = _config(db.dsn, smtp.port)
        for endpoint_id in endpoints:
            _open(db.dsn, endpoint_id)
        start = threading.Barrier(4)
        errors: list[BaseException] = []

        def run() -> None:
            notices = _notices(config, db.dsn)
            try:
                start.wait(timeout=10)
                for _ in range(3):
                    notices.run_once()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors
        subjects = sorted(m.subject for m in smtp.received())
    assert subjects == sorted(f"Webhook endpoint {e} is failing; its deliveries wait" for e in endpoints)


def test_smtp_down_logs_without_the_password_and_tries_again_later(db, caplog: pytest.LogCaptureFixture) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    port = free_port()  # nothing listens here
    config = _config(db.dsn, port, smtp_username="mailer", smtp_password="hunter2-not-logged",
                     smtp_attempts=2, retry_base="1s")
    notices = _notices(config, db.dsn)
    _open(db.dsn, endpoint)
    with caplog.at_level(logging.WARNING, logger="dispatcher.notifier"):
        notices.run_once()
    assert "not sent (attempt 1" in caplog.text and "hunter2" not in caplog.text
    assert db.query("SELECT attempts, sent_at, next_attempt_at > now(), last_error IS NOT NULL "
                    "FROM breaker_notices") == [(1, None, True, True)]
    db.query("UPDATE breaker_notices SET next_attempt_at = now()")  # the retry's time has come
    with smtp_server() as smtp:
        notices = _notices(_config(db.dsn, smtp.port), db.dsn)
        notices.run_once()
        assert len(smtp.received("failing")) == 1


def test_a_mail_is_dropped_after_its_last_attempt(db, caplog: pytest.LogCaptureFixture) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    notices = _notices(_config(db.dsn, free_port(), smtp_attempts=1), db.dsn)
    _open(db.dsn, endpoint)
    with caplog.at_level(logging.ERROR, logger="dispatcher.notifier"):
        notices.run_once()
        notices.run_once()
    assert "dropped after 1 attempts" in caplog.text
    assert db.query("SELECT attempts, sent_at, next_attempt_at FROM breaker_notices") == [(1, None, None)]


def test_starttls_and_auth_against_a_relay_we_trust_and_none_we_do_not(db, tmp_path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    ca = TestCA(tmp_path)
    login = ("mailer", "relay-password-1")
    settings = {"smtp_host": "localhost", "smtp_security": "starttls", "smtp_username": login[0],
                "smtp_password": login[1]}
    _open(db.dsn, endpoint)
    with smtp_server(tls=server_tls(self_signed(tmp_path, ["localhost"])), login=login) as untrusted, \
            caplog.at_level(logging.WARNING, logger="dispatcher.notifier"):
        config = config_from_mapping({**config_for_test(db.dsn, http={"ca_file": str(ca.cert_path)}),
                                      "notifier": {"kind": "smtp", "smtp_port": untrusted.port, **settings}}, env={})
        _notices(config, db.dsn).run_once()
        assert untrusted.received() == []
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text and login[1] not in caplog.text
    db.query("UPDATE breaker_notices SET next_attempt_at = now()")
    with smtp_server(tls=server_tls(ca.issue(["localhost"])), login=login) as trusted:
        config = config_from_mapping({**config_for_test(db.dsn, http={"ca_file": str(ca.cert_path)}),
                                      "notifier": {"kind": "smtp", "smtp_port": trusted.port, **settings}}, env={})
        _notices(config, db.dsn).run_once()
        assert len(trusted.received("failing")) == 1


# ---------------------------------------------------------------- confirmed contacts (issue 23 item 6)

CONFIRM_URL = "https://api.example.test/v2/contacts/confirm"


def test_a_notice_never_goes_to_an_unconfirmed_contact(db) -> None:
    """A customer can name any address; until it confirmed, its notices go to the workspace's confirmed
    owner, else the operator (here no confirm_url: nobody is even asked)."""
    first, second = seed_workspace(db.dsn, "ws", ["https://a.example.com/", "https://b.example.com/"])
    db.query("UPDATE webhook_endpoints SET owner_contact = 'victim@example.com'")
    with smtp_server() as smtp:
        notices = _notices(_config(db.dsn, smtp.port), db.dsn)
        _open(db.dsn, first)
        notices.run_once()
        (mail,) = smtp.received()
        assert mail.recipients == [OPERATOR] and "failing" in mail.subject
        db.query("UPDATE workspaces SET owner_contact = 'team@example.com' WHERE id = 'ws'")
        _confirmed(db, "ws", "team@example.com")
        _open(db.dsn, second)
        notices.run_once()
        assert [m.recipients for m in smtp.received()] == [[OPERATOR], ["team@example.com"]]
    assert not any("victim@example.com" in m.recipients for m in smtp.received())


def _link(mail: Any) -> str:
    (line,) = [line for line in mail.body.splitlines() if line.startswith(CONFIRM_URL)]
    return line


def test_a_contact_confirms_by_the_mailed_link_and_only_then_hears(db) -> None:
    import falcon.testing

    from dispatcher.api import auth
    from dispatcher.api.app import create_app

    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    db.query("UPDATE webhook_endpoints SET owner_contact = 'owner@example.com'")
    with smtp_server() as smtp:
        config = _config(db.dsn, smtp.port, confirm_url=CONFIRM_URL)
        notices = _notices(config, db.dsn)
        _open(db.dsn, endpoint)
        notices.run_once()
        notices.run_once()
        (ask,) = smtp.received("Confirm")
        assert ask.recipients == ["owner@example.com"] and "ws" in ask.subject
        (notice,) = smtp.received("failing")
        assert notice.recipients == [OPERATOR], "not confirmed yet: the operator hears"
        link = _link(ask)
        token = link.partition("?token=")[2]
        assert token and db.query("SELECT count(*) FROM contact_confirmations WHERE token_hash = %s",
                                  (token,)) == [(0,)], "only the token's hash is stored"
        app = create_app(config, db.dsn)
        conn = db.connect()
        conn.autocommit = True
        try:
            client = falcon.testing.TestClient(app)
            shown = f"/v2/webhooks/endpoints/{endpoint}"
            auth_header = {"Authorization": f"Bearer {auth.create_token(conn, 'ws', [auth.READ])}"}
            assert client.simulate_get(shown, headers=auth_header).json["owner_contact_confirmed"] is False
            page = client.simulate_get("/v2/contacts/confirm", params={"token": token})
            assert page.status_code == 200 and "<form method=\"post\">" in page.text
            assert "owner@example.com" in page.text
            assert page.headers["content-security-policy"].startswith("default-src 'none'")
            unconfirmed = "SELECT count(*) FROM contact_confirmations WHERE confirmed_at IS NULL"
            assert db.query(unconfirmed) == [(1,)], "a GET (a mail scanner) confirms nothing"
            assert client.simulate_post("/v2/contacts/confirm", params={"token": token + "x"}).status_code == 404
            assert client.simulate_post("/v2/contacts/confirm").status_code == 400
            assert client.simulate_post("/v2/contacts/confirm", params={"token": "é" * 500}).status_code == 404
            done = client.simulate_post("/v2/contacts/confirm", params={"token": token})
            assert done.status_code == 200 and "Confirmed" in done.text
            assert db.query(unconfirmed) == [(0,)]
            assert client.simulate_get(shown, headers=auth_header).json["owner_contact_confirmed"] is True
        finally:
            app.pool.close()
            conn.close()
        _close(db.dsn, endpoint)
        notices.run_once()
        notices.run_once()  # the flap window (1 ms) passed: the episode ends, recovered
        _open(db.dsn, endpoint)
        notices.run_once()
        assert [m.recipients for m in smtp.received("failing")] == [[OPERATOR], ["owner@example.com"]]
        assert [m.recipients for m in smtp.received("recovered")] == [["owner@example.com"]]
        # A new contact is asked in turn; the old one's confirmation goes with it.
        db.query("UPDATE webhook_endpoints SET owner_contact = 'other@example.com'")
        notices.run_once()
        assert [m.recipients for m in smtp.received("Confirm")] == [["owner@example.com"], ["other@example.com"]]
    assert db.query("SELECT address, confirmed_at IS NOT NULL FROM contact_confirmations") == [
        ("other@example.com", False)]


def test_mails_per_recipient_hour_holds_the_rest_and_drops_none(db, caplog: pytest.LogCaptureFixture) -> None:
    endpoints = seed_workspace(db.dsn, "ws", [f"https://h{n}.example.com/" for n in range(4)])
    with smtp_server() as smtp, caplog.at_level(logging.WARNING, logger="dispatcher.notifier"):
        notices = _notices(_config(db.dsn, smtp.port, mails_per_recipient_hour=2), db.dsn)
        for endpoint_id in endpoints:
            _open(db.dsn, endpoint_id)
        notices.run_once()
        notices.run_once()
        assert len(smtp.received()) == 2
    assert "mails an hour at most" in caplog.text
    held = db.query("SELECT attempts, next_attempt_at > now() + interval '50 minutes' FROM breaker_notices "
                    "WHERE sent_at IS NULL")
    assert held == [(0, True), (0, True)], "held for the hour, their attempts given back"


# ---------------------------------------------------------------- the operational webhook


def test_the_operational_webhook_is_an_outbox_row_for_the_notify_endpoint(db, tmp_path) -> None:
    failing, other = seed_workspace(db.dsn, "ws", ["https://failing.example.com/h", "https://other.example.com/"])
    db.query("UPDATE workspaces SET notify_webhook_url = 'https://ops.example.com/notify'")
    with smtp_server() as smtp:
        notices = _notices(_config(db.dsn, smtp.port), db.dsn)
        _open(db.dsn, failing)
        notices.run_once()
        notices.run_once()
        _close(db.dsn, failing)
        notices.run_once()
        notices.run_once()  # the round after the flap window ends the episode
    rows = db.query("SELECT e.url, e.purpose, v.type, d.status, v.payload->>'endpoint_id' "
                    "FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id "
                    "JOIN events v ON v.id = d.event_id AND v.day = d.event_day ORDER BY d.id")
    assert rows == [
        ("https://ops.example.com/notify", "operational", "webhook.endpoint.breaker_opened", "pending", str(failing)),
        ("https://ops.example.com/notify", "operational", "webhook.endpoint.breaker_recovered", "pending",
         str(failing))]
    # The operational endpoint takes no producer events, and the failing endpoint got no notice.
    produce(write_config(tmp_path / "c.yaml", config_for_test(db.dsn)), db.dsn, "ws", 1)
    assert db.query("SELECT e.purpose, count(*) FROM webhook_deliveries d JOIN webhook_endpoints e "
                    "ON e.id = d.endpoint_id GROUP BY 1 ORDER BY 1") == [("customer", 2), ("operational", 2)]
    assert db.query("SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = %s AND event_id LIKE 'breaker%%'",
                    (failing,)) == [(0,)]
    # Nor in legacy mode (the workspace's outbox flag off): the synchronous path's targets are customers' only.
    db.query("UPDATE workspaces SET flags = '{\"webhook_outbox\": false}'")
    assert db.query("SELECT jsonb_path_query_array(legacy_targets, '$[*].id') FROM dispatcher_send_event("
                    "'ws', 'legacy-1', 'job.created', NULL, '{}', 'h', false, 86400)") == [([failing, other],)]


def test_no_operational_webhook_to_the_failing_endpoint_itself(db, caplog: pytest.LogCaptureFixture) -> None:
    (failing,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/h"])
    db.query("UPDATE workspaces SET notify_webhook_url = 'HTTPS://Hooks.Example.com:443/h'")
    with smtp_server() as smtp, caplog.at_level(logging.WARNING, logger="dispatcher.notifier"):
        notices = _notices(_config(db.dsn, smtp.port), db.dsn)
        _open(db.dsn, failing)
        notices.run_once()
        assert len(smtp.received("failing")) == 1, "the mail still goes out"
    assert "notify URL is the failing endpoint itself" in caplog.text
    assert db.query("SELECT count(*) FROM webhook_deliveries") == [(0,)]
    assert db.query("SELECT count(*) FROM webhook_endpoints WHERE purpose = 'operational'") == [(0,)]


def test_every_lifecycle_kind_goes_to_a_confirmed_recipient_within_the_mail_rate(db) -> None:
    """The lifecycle's notices (issue 24) are mailed like the breaker's (issue 23): never to an unconfirmed
    contact, and counted against notifier.mails_per_recipient_hour with the others."""
    (endpoint,) = seed_workspace(db.dsn, "ws", ["https://hooks.example.com/a"])
    db.query("UPDATE webhook_endpoints SET owner_contact = 'victim@example.com'")
    db.query("UPDATE workspaces SET owner_contact = 'team@example.com' WHERE id = 'ws'")
    _confirmed(db, "ws", "team@example.com")
    for kind, detail in (("will_pause", '{"pause_at": "2026-09-04T00:00:00+00:00"}'),
                         ("paused", '{"cause": "lifecycle", "expires_at": "2026-09-11T00:00:00+00:00"}'),
                         ("expiring", '{"expires_at": "2026-09-11T00:00:00+00:00"}')):
        db.query("INSERT INTO breaker_notices (endpoint_id, episode, kind, workspace_id, detail)"
                 " VALUES (%s, 1, %s, 'ws', %s::jsonb)", (endpoint, kind, detail))
    with smtp_server() as smtp:
        # 3 an hour: its confirmation mail (sent now by _confirmed) and two notices.
        notices = _notices(_config(db.dsn, smtp.port, mails_per_recipient_hour=3), db.dsn)
        notices.run_once()
        notices.run_once()
        sent = smtp.received()
        assert [m.recipients for m in sent] == [["team@example.com"]] * 2, "the confirmed owner, within its rate"
    assert db.query("SELECT kind, recipient FROM breaker_notices WHERE sent_at IS NOT NULL ORDER BY kind") == [
        ("expiring", "team@example.com"), ("paused", "team@example.com")]
    assert db.query("SELECT kind, attempts FROM breaker_notices WHERE sent_at IS NULL") == [("will_pause", 0)], (
        "the third waits for the hour, its attempt given back")
