"""The console page in a real headless Chromium (Debian's package), driven by Playwright.

The API runs in a wsgiref server thread: the pytest process is not
monkey-patched, so gevent's server is exercised by test_api's subprocess
test instead.  Playwright only drives the browser; it never downloads one.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

from dispatcher.api import auth
from dispatcher.api.app import create_app
from dispatcher.config import load_config
from dispatcher.redact import mask_url
from tests.integration.test_api import World

pytestmark = pytest.mark.timeout(120)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# Set to a directory to keep the screenshots (they go to tmp_path otherwise);
# .ci/run sets it to artifacts/console/ of the checkout.
SCREENSHOT_DIR = os.environ.get("DISPATCHER_SCREENSHOT_DIR")


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def console_url(db, write_config) -> Iterator[str]:
    app = create_app(load_config(write_config(db), env={}), db.dsn)
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    app.pool.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (tests/setup.sh does)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open_breaker(world: World, endpoint: int) -> None:
    """The endpoint's breaker open for four more minutes after 20 failures, its last success 3 hours ago."""
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at,"
              " last_success_at, last_failure_at, last_error) VALUES (%s, 'open', 20, now() + interval '4 minutes',"
              " now() - interval '1 minute', now() - interval '3 hours', now() - interval '1 minute', 'HTTP 503')",
              (endpoint,))


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def _seed(world: World) -> dict[str, Any]:
    ws = world.workspace("acme")
    healthy = world.endpoint(ws, "https://ops.acme.example/webhooks/dispatch")
    broken = world.endpoint(ws, "https://erp.acme.example/hooks/larkspur", types=("job.completed",))
    event = world.event(ws, "evt_01J8ZQ4M7Hq2")
    ok = world.delivery(ws, healthy, event, "delivered", attempt=1, age=timedelta(minutes=50))
    world.sql("UPDATE webhook_deliveries SET delivered_at = created_at + interval '1 second' WHERE id = %s", (ok,))
    world.attempt(ok, healthy, 1, "delivered", 200, excerpt='{"received":true}', duration_ms=142)
    dead = world.delivery(ws, broken, event, "dead", attempt=3, age=timedelta(minutes=48), last_error="HTTP 503")
    world.attempt(dead, broken, 1, "http_5xx", 503, error="HTTP 503", excerpt="<html><h1>503 Service Unavailable</h1>")
    world.attempt(dead, broken, 2, "timeout", None, error="TimeoutError: no response within 10s", duration_ms=10000)
    world.attempt(dead, broken, 3, "http_5xx", 503, error="HTTP 503", excerpt="upstream maintenance until 14:00")
    # Traced (docs/operations.md, "Tracing"): the delivery's trace, kept per attempt and on the row.
    world.sql("UPDATE webhook_delivery_attempts SET trace_id = %s WHERE delivery_id = %s", (TRACE_ID, dead))
    world.sql("UPDATE webhook_deliveries SET trace_context = jsonb_build_object('traceparent', %s::text) "
              "WHERE id = %s", (f"00-{TRACE_ID}-{'1' * 16}-01", dead))
    for n in range(3):
        world.delivery(ws, broken, world.event(ws, f"evt_backlog_{n}"), "pending", age=timedelta(minutes=20 - n))
    _open_breaker(world, broken)
    return {"token": world.token(ws), "event": event, "ok": ok, "dead": dead, "broken": broken}


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    folder = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    print(f"console screenshot: {path}")  # shown with pytest -s or -rP
    return path


def test_look_up_an_event_see_attempts_and_replay(db, console_url: str, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed(world)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(console_url + "/console")
    page.fill("#token", seeded["token"])
    page.click("#save-token")
    page.select_option("#lookup-kind", "event")
    page.fill("#lookup-id", seeded["event"])
    page.click("#lookup-btn")

    rows = page.locator("#event-view tr.delivery")
    rows.first.wait_for()
    assert rows.count() == 2
    dead_attempts = page.locator(f'tr.attempts[data-for="{seeded["dead"]}"] tr.attempt')
    assert dead_attempts.count() == 3
    assert "TimeoutError" in dead_attempts.nth(1).inner_text()
    assert "upstream maintenance" in dead_attempts.nth(2).inner_text()
    assert TRACE_ID in dead_attempts.nth(0).inner_text()
    assert f"delivery trace {TRACE_ID}" in page.locator(f'tr.attempts[data-for="{seeded["dead"]}"]').inner_text()
    banner = page.locator(".breaker-open")
    banner.wait_for()
    assert f"endpoint #{seeded['broken']}" in banner.inner_text() and "20 consecutive failures" in banner.inner_text()

    page.click(f'tr.delivery[data-id="{seeded["dead"]}"] button.replay')
    fresh = page.locator("#event-view tr.delivery.fresh")
    fresh.wait_for()
    assert f"replay of #{seeded['dead']}" in fresh.inner_text() and "pending" in fresh.inner_text()
    assert rows.count() == 3
    # The message follows the refreshed view (and its breaker banners): wait for it, do not race it.
    expect(page.locator("#message")).to_contain_text("Replay queued as delivery")
    assert world.count("replay_of = %s", (seeded["dead"],)) == 1
    _shot(page, tmp_path, "console-event.png")

    page.select_option("#lookup-kind", "endpoint")
    page.fill("#lookup-id", str(seeded["broken"]))
    page.click("#lookup-btn")
    page.locator("#endpoint-view").wait_for()
    assert "open" in page.locator("#endpoint-view").inner_text()
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    assert page.locator("#endpoint-deliveries tr.delivery").count() == 5  # 3 pending, the dead one, its replay
    _shot(page, tmp_path, "console-endpoint.png")
    assert not errors, errors
    world.conn.close()


def test_a_bad_token_is_reported_not_crashed_on(db, console_url: str, browser: Any) -> None:
    page = browser.new_page()
    page.set_default_timeout(10_000)
    page.goto(console_url + "/console")
    page.fill("#token", "dsp_wrong")
    page.click("#save-token")
    page.fill("#lookup-id", "evt_anything")
    page.click("#lookup-btn")
    message = page.locator("#message.error")
    message.wait_for()
    assert "401" in message.inner_text()


def test_a_shadow_row_shows_as_shadow_not_sent(db, console_url: str, browser: Any) -> None:
    """A shadow row the dispatcher marked (rollout phase 0) is never shown as a delivery."""
    world = World(db)
    ws = world.workspace("acme")
    endpoint = world.endpoint(ws, "https://ops.acme.example/webhooks/dispatch")
    event = world.event(ws, "evt_phase0")
    shadow = world.delivery(ws, endpoint, event, "shadow", attempt=1, mode="shadow", age=timedelta(minutes=5))
    world.sql("UPDATE webhook_deliveries SET finished_at = created_at + interval '1 second' WHERE id = %s", (shadow,))
    world.attempt(shadow, endpoint, 1, "shadow", None, duration_ms=0)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    page.goto(console_url + "/console")
    page.fill("#token", world.token(ws))
    page.click("#save-token")
    page.select_option("#lookup-kind", "event")
    page.fill("#lookup-id", event)
    page.click("#lookup-btn")
    row = page.locator(f'#event-view tr.delivery[data-id="{shadow}"]')
    row.wait_for()
    assert "shadow, not sent" in row.locator(".badge").inner_text()
    assert "delivered" not in row.inner_text()
    attempt = page.locator(f'tr.attempts[data-for="{shadow}"] tr.attempt')
    attempt.wait_for()
    assert "shadow, not sent" in attempt.inner_text() and "delivered" not in attempt.inner_text()
    world.conn.close()


# --- the overview (issue 12, section 5) ----------------------------------------------------------


def _hours_ago(hours: float) -> timedelta:
    # Half past: well inside one hourly bucket of the 24 h window, whatever the minute of the run.
    return timedelta(hours=hours, minutes=30)


def _seed_overview(world: World) -> dict[str, Any]:
    ws = world.workspace("acme")
    payments = world.endpoint(ws, "https://api.acme.example/hooks/payments/T0K3N-in-path")
    broken = world.endpoint(ws, "https://erp.acme.example/hooks/larkspur", types=("job.completed",))
    quiet = world.endpoint(ws, "https://crm.acme.example/webhooks")
    disabled = world.endpoint(ws, "https://old.acme.example/hook", active=False)
    world.sql("UPDATE webhook_endpoints SET description = 'Payments service (prod)' WHERE id = %s", (payments,))
    # payments: busy all day, a 5xx in two of the hours; one row pending.
    row = world.delivery(ws, payments, world.event(ws, "evt_pay_1"), "delivered", attempt=1, age=timedelta(hours=24))
    for hour in range(24):
        for n in range(4):
            world.attempt(row, payments, 1, "delivered", 200, duration_ms=80 + 10 * n, ago=_hours_ago(hour))
    for hour in (3, 14):
        world.attempt(row, payments, 2, "http_5xx", 502, duration_ms=900, ago=_hours_ago(hour))
    world.delivery(ws, payments, world.event(ws, "evt_pay_2"), "pending", age=timedelta(minutes=2))
    # broken: fine for eight hours (one delivery an hour), then only failures; its breaker opened;
    # a backlog and two dead rows.
    old = world.delivery(ws, broken, world.event(ws, "evt_erp_0"), "delivered", attempt=1, age=timedelta(hours=10))
    for hour in range(2, 10):
        world.attempt(old, broken, 1, "delivered", 200, duration_ms=120, ago=_hours_ago(hour))
    for n in range(2):
        dead = world.delivery(ws, broken, world.event(ws, f"evt_erp_dead_{n}"), "dead", attempt=3,
                              age=timedelta(hours=2), last_error="HTTP 503")
        world.attempt(dead, broken, 1, "http_5xx", 503, error="HTTP 503", duration_ms=300, ago=_hours_ago(1))
        world.attempt(dead, broken, 2, "timeout", None, error="TimeoutError", duration_ms=10000, ago=_hours_ago(0))
    for n in range(3):
        world.delivery(ws, broken, world.event(ws, f"evt_erp_backlog_{n}"), "pending", age=timedelta(minutes=20 - n))
    _open_breaker(world, broken)
    return {"ws": ws, "payments": payments, "broken": broken, "quiet": quiet, "disabled": disabled}


def _open_overview(browser: Any, url: str, token: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    page.set_default_timeout(10_000)
    errors: list[str] = []
    # A CSP violation (say, an inline style the policy does not allow) is a console error.
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(url + "/console")
    page.fill("#token", token)
    page.click("#save-token")
    page.locator("#endpoints tr.endpoint").first.wait_for()
    return page, errors


def _row(page: Any, endpoint: int) -> Any:
    return page.locator(f'#endpoints tr.endpoint[data-id="{endpoint}"]')


def _states(page: Any) -> list[tuple[int, str]]:
    return [(int(r.get_attribute("data-id")), r.get_attribute("data-state"))
            for r in page.locator("#endpoints tr.endpoint").all()]


def test_overview_puts_open_breakers_first_and_acts_on_an_endpoint(db, console_url: str, browser: Any,
                                                                   tmp_path: Path) -> None:
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed_overview(world)
    payments, broken, quiet, disabled = (seeded[k] for k in ("payments", "broken", "quiet", "disabled"))
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"]))

    assert _states(page) == [(broken, "open"), (payments, "closed"), (quiet, "closed"), (disabled, "disabled")]
    assert "Open" in _row(page, broken).locator(".state").inner_text()
    assert "20 failures" in _row(page, broken).inner_text()
    tiles = page.locator("#overview-summary").inner_text()
    assert re.search(r"Open breakers\s+1\b", tiles, re.I) and re.search(r"Pending\s+4\b", tiles, re.I), tiles
    # Sparklines: 24 hourly buckets, a point for each hour that had attempts, red where one failed.
    spark = _row(page, payments).locator("svg.spark")
    assert spark.get_attribute("data-buckets") == "24"
    assert spark.locator("circle.spark-point").count() == 24
    assert spark.locator("circle.spark-point.bad").count() == 2
    assert len(spark.locator("polyline.spark-line").get_attribute("points").split()) == 24
    assert _row(page, payments).locator(".rate").inner_text() == "98.0 %"  # 96 of 98
    assert _row(page, payments).locator(".p95").inner_text() == "110 ms"
    broken_spark = _row(page, broken).locator("svg.spark")
    assert broken_spark.locator("circle.spark-point").count() == 10  # the last ten hours, joined by one line
    assert broken_spark.locator("circle.spark-point.bad").count() == 2
    assert broken_spark.locator("polyline.spark-line").count() == 1
    assert _row(page, quiet).locator("svg.spark circle").count() == 0
    assert _row(page, quiet).locator(".rate").inner_text() == "—"
    # Pending counts and the oldest pending row's age.
    assert _row(page, broken).locator(".pending-count").inner_text() == "3"
    assert "oldest 20 min" in _row(page, broken).locator(".pending").inner_text()
    assert _row(page, payments).locator(".pending-count").inner_text() == "1"
    _shot(page, tmp_path, "console-overview.png")

    # Close the breaker: the row says closed and moves below the open ones (there are none left).
    _row(page, broken).locator("button[data-action=close-breaker]").click()
    expect(_row(page, broken)).to_have_attribute("data-state", "closed")
    assert world.sql("SELECT state FROM endpoint_state WHERE endpoint_id = %s", (broken,)) == [("closed",)]
    expect(page.locator("#message")).to_contain_text(f"Breaker of endpoint #{broken} closed")
    assert _row(page, broken).locator("button[data-action=close-breaker]").count() == 0

    # Disable (confirmed) and enable again.
    page.once("dialog", lambda dialog: dialog.accept())
    _row(page, payments).locator("button[data-action=disable]").click()
    expect(_row(page, payments)).to_have_attribute("data-state", "disabled")
    assert world.sql("SELECT active FROM webhook_endpoints WHERE id = %s", (payments,)) == [(False,)]
    assert world.count("endpoint_id = %s AND status = 'pending'", (payments,)) == 0
    assert _states(page)[-2:] == [(payments, "disabled"), (disabled, "disabled")]
    _row(page, payments).locator("button[data-action=enable]").click()
    expect(_row(page, payments)).to_have_attribute("data-state", "closed")
    assert world.sql("SELECT active FROM webhook_endpoints WHERE id = %s", (payments,)) == [(True,)]

    # Rotate the secret: shown once, in the page only, and it is the one now stored.
    page.once("dialog", lambda dialog: dialog.accept())
    _row(page, broken).locator("button[data-action=rotate-secret]").click()
    secret = page.locator("#new-secret")
    secret.wait_for()
    shown = secret.inner_text()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]+={0,2}", shown)
    assert world.sql("SELECT secret FROM webhook_endpoints WHERE id = %s", (broken,)) == [(shown,)]
    assert shown not in page.evaluate("JSON.stringify(sessionStorage) + JSON.stringify(localStorage)")
    page.click("#secret-done")
    assert page.locator("#new-secret").count() == 0

    # Recover since a time: both dead events are queued again as replay rows.
    _row(page, broken).locator("button[data-action=recover]").click()
    page.locator(f'tr.recover-row[data-for="{broken}"] button[data-action=recover-go]').click()
    expect(page.locator("#message")).to_contain_text("Recover queued 2 deliveries")
    assert world.count("endpoint_id = %s AND replay_of IS NOT NULL AND status = 'pending'", (broken,)) == 2
    expect(_row(page, broken).locator(".pending-count")).to_have_text("5")

    # Its deliveries: the endpoint view below the overview.
    _row(page, broken).locator("button[data-action=deliveries]").click()
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    assert page.locator("#endpoint-deliveries tr.delivery").count() == 8  # 1 + 2 dead + 3 backlog + 2 replays
    _shot(page, tmp_path, "console-overview-after-actions.png")
    assert not errors, errors
    world.conn.close()


def test_a_read_only_token_sees_masked_urls_and_no_usable_write_actions(db, console_url: str,
                                                                         browser: Any) -> None:
    world = World(db)
    seeded = _seed_overview(world)
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"], auth.READ))
    url = _row(page, seeded["payments"]).locator(".ep-url").inner_text()
    assert url == mask_url("https://api.acme.example/hooks/payments/T0K3N-in-path") and "T0K3N" not in url
    assert "T0K3N" not in page.content()
    row = _row(page, seeded["broken"])
    for action in ("close-breaker", "disable", "rotate-secret", "recover"):
        assert row.locator(f"button[data-action={action}]").is_disabled(), action
    assert row.locator("button[data-action=deliveries]").is_enabled()
    # Issue 27 item 10: the payload's shape, its values redacted.
    _look_up(page, "event", "evt_erp_dead_0")
    payload = page.locator("#event-payload .payload.redacted .payload-json")
    payload.wait_for()
    assert json.loads(payload.inner_text()) == {"job": "***"}
    assert "evt_erp_dead_0" not in page.locator("#event-payload").inner_text()
    assert not errors, errors
    world.conn.close()


# --- the first hour (issue 27, items 9 to 11) -------------------------------------------------------


def _look_up(page: Any, kind: str, ident: str) -> None:
    page.select_option("#lookup-kind", kind)
    page.fill("#lookup-id", ident)
    page.click("#lookup-btn")


def test_a_refused_token_or_a_404_lookup_leaves_nothing_stale(db, console_url: str, browser: Any) -> None:
    """Item 9: what no longer applies leaves the screen with the error that says so."""
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed_overview(world)
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"]))
    _look_up(page, "endpoint", str(seeded["broken"]))
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    assert page.locator("#breakers .breaker-open").count() == 1
    # A lookup that finds nothing: the last lookup's endpoint, banner and deliveries go.
    _look_up(page, "event", "evt_nobody_sent")
    expect(page.locator("#message.error")).to_contain_text("404")
    for gone in ("#endpoint-view", "#endpoint-deliveries", "#breakers .breaker", "tr.delivery"):
        assert page.locator(gone).count() == 0, gone
    assert page.locator("#endpoints tr.endpoint").count() == 4  # the same workspace's overview still applies
    _look_up(page, "endpoint", str(seeded["broken"]))
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    _look_up(page, "endpoint", "999999")
    expect(page.locator("#message.error")).to_contain_text("404")
    assert page.locator("#endpoint-view").count() == 0 and page.locator("tr.delivery").count() == 0
    # A refused token: nothing of the workspace stays, its name included.
    page.fill("#token", "dsp_wrong")
    page.click("#save-token")
    expect(page.locator("#message.error")).to_contain_text("401")
    assert page.locator("#endpoints").count() == 0 and page.locator("#overview-summary").count() == 0
    assert "acme" not in page.locator("header").inner_text()
    assert "refused" in page.locator("#overview-body").inner_text()
    # A valid token's results, then a lookup refused with a revoked token.
    page.fill("#token", world.token(seeded["ws"]))
    page.click("#save-token")
    _look_up(page, "endpoint", str(seeded["broken"]))
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    world.sql("UPDATE api_tokens SET revoked_at = now()")
    _look_up(page, "event", "evt_erp_0")
    expect(page.locator("#message.error")).to_contain_text("401")
    assert page.locator("tr.delivery").count() == 0 and page.locator("#endpoints").count() == 0
    assert not [e for e in errors if "401" not in e and "404" not in e], errors
    world.conn.close()


def test_lookups_show_at_the_top_with_the_workspace_payload_and_a_status_filter(db, console_url: str,
                                                                                browser: Any, tmp_path: Path) -> None:
    """Item 10: results where the user looks, the workspace's name, the payload sent, a status filter."""
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed_overview(world)
    broken = seeded["broken"]
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"]))
    assert page.locator("#workspace-name").inner_text() == "workspace acme"
    _look_up(page, "event", "evt_erp_dead_0")
    view = page.locator("#event-view")
    view.wait_for()
    # Above the overview and inside the first screen (860 px), not below the whole table.
    box, overview = view.bounding_box(), page.locator("#overview").bounding_box()
    assert box["y"] < overview["y"] and 0 <= box["y"] < 860, (box, overview)
    payload = page.locator("#event-payload .payload-json")
    payload.wait_for()
    assert json.loads(payload.inner_text()) == {"job": "evt_erp_dead_0"}
    assert page.locator("#event-payload .redacted").count() == 0

    # The endpoint's deliveries from its overview row, scrolled to, filtered by status.
    page.mouse.wheel(0, 2000)
    _row(page, broken).locator("button[data-action=deliveries]").click()
    rows = page.locator("#endpoint-deliveries tr.delivery")
    rows.first.wait_for()
    assert rows.count() == 6  # 1 delivered, 2 dead, 3 pending
    assert -1 < page.locator("#endpoint-view").bounding_box()["y"] < 860  # scrolled to (sub-pixel)
    page.select_option("#delivery-status", "dead")
    expect(rows).to_have_count(2)
    assert {r.locator(".badge").inner_text() for r in rows.all()} == {"dead"}
    page.select_option("#delivery-status", "pending")
    expect(rows).to_have_count(3)
    assert page.locator("#delivery-status").input_value() == "pending"
    page.select_option("#delivery-status", "failed")
    expect(page.locator("#endpoint-deliveries .empty")).to_have_text("No failed deliveries.")
    page.select_option("#delivery-status", "")
    expect(rows).to_have_count(6)
    # A write token sees the payload with a delivery's attempts.
    first = rows.first
    first.locator("button.toggle").click()
    detail = page.locator(f'tr.attempts[data-for="{first.get_attribute("data-id")}"] .payload-json')
    detail.wait_for()
    assert "job" in json.loads(detail.inner_text())
    _shot(page, tmp_path, "console-endpoint-filtered.png")
    assert not errors, errors
    world.conn.close()


def test_small_untruths_breaker_hold_utc_recover_and_counts(db, console_url: str, browser: Any) -> None:
    """Item 11: a held row says it waits for the breaker and until when; Recover takes a UTC
    24-hour time; a sparkline of fresh data shows its counts."""
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed_overview(world)
    broken, quiet = seeded["broken"], seeded["quiet"]
    fresh = world.endpoint(seeded["ws"], "https://new.acme.example/hooks")
    row = world.delivery(seeded["ws"], fresh, world.event(seeded["ws"], "evt_new_1"), "delivered", attempt=1)
    for n in range(3):
        world.attempt(row, fresh, n + 1, "delivered", 200, ago=timedelta(minutes=5 + n))
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"]))

    # Fresh data: one bar and a count, not an empty chart.
    fresh_row = _row(page, fresh)
    assert fresh_row.locator(".attempt-count").inner_text() == "3 attempts"
    bars = fresh_row.locator("svg.spark rect.spark-bar")
    assert bars.count() == 1 and bars.get_attribute("data-attempts") == "3"
    assert _row(page, quiet).locator(".attempt-count").inner_text() == "no attempts"
    assert _row(page, seeded["payments"]).locator(".attempt-count").inner_text() == "98 attempts"

    # The breaker's backlog: due in the past, held until the window ends.
    (open_until,) = world.sql("SELECT to_char(open_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
                              "FROM endpoint_state WHERE endpoint_id = %s", (broken,))[0]
    _row(page, broken).locator("button[data-action=deliveries]").click()
    pending = page.locator("#endpoint-deliveries tr.delivery", has=page.locator(".s-pending"))
    pending.first.wait_for()
    assert pending.count() == 3
    for outcome in pending.locator("td.outcome").all():
        assert outcome.inner_text() == f"waits for the breaker: open until {open_until} UTC"
    assert "next" not in page.locator("#endpoint-deliveries").inner_text()

    # Recover: a UTC text field with a 24-hour time, checked before anything is sent.
    since = page.locator("#recover-since")
    assert since.get_attribute("type") == "text"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", since.input_value())
    for bad in ("12/01/2026 03:00 PM", "2026-12-01 25:00", "2026-02-30 10:00"):
        since.fill(bad)
        page.click("#recover-btn")
        expect(page.locator("#message.error")).to_contain_text("YYYY-MM-DD HH:MM")
        page.evaluate("document.getElementById('message').className = ''")
    assert world.count("replay_of IS NOT NULL") == 0
    (three_hours_ago,) = world.sql("SELECT to_char(now() AT TIME ZONE 'UTC' - interval '3 hours', "
                                   "'YYYY-MM-DD HH24:MI')")[0]
    since.fill(three_hours_ago)
    page.click("#recover-btn")
    expect(page.locator("#message.ok")).to_contain_text("Recover queued 2 deliveries")
    assert world.count("endpoint_id = %s AND replay_of IS NOT NULL", (broken,)) == 2
    # The overview's own Recover form is the same field.
    _row(page, quiet).locator("button[data-action=recover]").click()
    assert page.locator(f'tr.recover-row[data-for="{quiet}"] input.recover-since').get_attribute("type") == "text"
    assert not errors, errors
    world.conn.close()


# --- bulk replay (issue 24, section 3) ------------------------------------------------------------


def test_a_bulk_replay_dry_run_then_job_to_100_percent(db, console_url: str, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from dispatcher.engine.replayer import BulkReplayer
    from dispatcher.rules.bulk_replay import BulkReplayPolicy
    from dispatcher.store.engine import ManagedConnection
    from dispatcher.store.replays import ReplayJobStore
    from tests.integration.test_bulk_replay import outage, replays

    world = World(db)
    seen = outage(world)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(console_url + "/console")
    page.fill("#token", seen["headers"]["Authorization"].removeprefix("Bearer "))
    page.click("#save-token")
    # datetime-local takes minutes: the outage's bounds, rounded inward, pick the same rows.
    since, until = (datetime.fromisoformat(seen["body"][k]) for k in ("since", "until"))
    page.fill("#bulk-since", (since + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M"))
    page.fill("#bulk-until", until.strftime("%Y-%m-%dT%H:%M"))
    page.fill("#bulk-types", "job.completed")
    page.click("#bulk-dry")
    expect(page.locator("#bulk-count")).to_contain_text(f"{len(seen['want'])} deliveries match")
    assert page.locator("#bulk-result tbody tr").count() == len(seen["want"])
    assert replays(world) == []  # a dry run queues nothing
    _shot(page, tmp_path, "console-bulk-dry-run.png")

    conn = ManagedConnection(db.dsn, "test console leader")
    runner = BulkReplayer(ReplayJobStore(conn), BulkReplayPolicy(batch_rows=2, pause=0))
    stop = threading.Event()

    def leader() -> None:
        while not stop.is_set():
            if not runner.run_once():
                stop.wait(0.05)

    thread = threading.Thread(target=leader, daemon=True)
    thread.start()
    try:
        page.dblclick("#bulk-go")  # a double click makes one job
        expect(page.locator("#bulk-progress")).to_contain_text(
            f"done, {len(seen['want'])} of {len(seen['want'])} queued (100 %)", timeout=30_000)
    finally:
        stop.set()
        thread.join(30)
        conn.close()
    assert page.locator("#bulk-bar").get_attribute("value") == "100"
    assert sorted(r[0] for r in replays(world)) == sorted(seen["want"])
    assert world.sql("SELECT count(*) FROM replay_jobs") == [(1,)]
    _shot(page, tmp_path, "console-bulk-done.png")
    assert not errors, errors
    world.conn.close()


# --- pause and lifecycle (issue 24) ----------------------------------------------------------------


def test_pause_and_resume_from_the_lifecycle_section(db, console_url: str, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    world = World(db)
    seeded = _seed_overview(world)
    broken, payments = seeded["broken"], seeded["payments"]
    world.sql("INSERT INTO endpoint_lifecycle (endpoint_id, episode, failing_since, stage, next_step, next_step_at) "
              "VALUES (%s, 1, now() - interval '2 days', 'will_pause', 'paused', now() + interval '1 day')",
              (broken,))
    page, errors = _open_overview(browser, console_url, world.token(seeded["ws"]))
    row = page.locator(f'#lifecycle-table tr.lifecycle[data-id="{broken}"]')
    row.wait_for()
    assert row.get_attribute("data-stage") == "will_pause"
    assert "will be paused" in row.locator(".stage").inner_text()
    assert row.locator(".next-step").inner_text().startswith("paused: ")

    # Pause: its 3 pending rows are held, none lost; the section shows who paused it and the hold's end.
    row.locator("button[data-action=pause]").click()
    expect(row).to_have_attribute("data-stage", "paused")
    expect(row.locator(".held-count")).to_have_text("3")
    assert "by you" in row.locator(".cause").inner_text()
    expect(page.locator("#message")).to_contain_text(f"Endpoint #{broken} paused")
    assert world.sql("SELECT pause_cause FROM webhook_endpoints WHERE id = %s", (broken,)) == [("customer",)]
    assert world.count("endpoint_id = %s AND status = 'held'", (broken,)) == 3
    assert world.count("endpoint_id = %s AND status = 'pending'", (broken,)) == 0
    # The endpoint's deliveries show the held rows as held.
    _row(page, broken).locator("button[data-action=deliveries]").click()
    page.locator("#endpoint-deliveries tr.delivery").first.wait_for()
    assert page.locator("#endpoint-deliveries .badge.s-held").count() == 3
    _shot(page, tmp_path, "console-paused.png")

    # Resume: pending again, the breaker closed, the stage back to healthy once the round says so.
    row.locator("button[data-action=resume]").click()
    expect(row.locator("button[data-action=pause]")).to_be_visible()
    expect(row.locator(".held-count")).to_have_text("0")
    expect(page.locator("#message")).to_contain_text(f"Endpoint #{broken} resumed")
    assert world.count("endpoint_id = %s AND status = 'pending'", (broken,)) == 3
    assert world.sql("SELECT state FROM endpoint_state WHERE endpoint_id = %s", (broken,)) == [("closed",)]
    assert world.sql("SELECT action FROM api_audit WHERE endpoint_id = %s ORDER BY id", (broken,)) == [
        ("endpoint.pause",), ("endpoint.resume",)]
    assert page.locator(f'#lifecycle-table tr.lifecycle[data-id="{payments}"]').get_attribute("data-stage") == "healthy"
    assert not errors, errors
    world.conn.close()
