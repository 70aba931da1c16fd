"""The console page in a real headless Chromium (Debian's package), driven by Playwright.

The API runs in a wsgiref server thread: the pytest process is not
monkey-patched, so gevent's server is exercised by test_api's subprocess
test instead.  Playwright only drives the browser; it never downloads one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

from dispatcher.api.app import create_app
from dispatcher.config import load_config
from tests.test_api import World

pytestmark = pytest.mark.timeout(120)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# Set to a directory to keep the screenshots (they go to tmp_path otherwise).
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
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (.ci/run does)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


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
    for n in range(3):
        world.delivery(ws, broken, world.event(ws, f"evt_backlog_{n}"), "pending", age=timedelta(minutes=20 - n))
    world.sql("INSERT INTO endpoint_state (endpoint_id, state, consecutive_failures, open_until, opened_at,"
              " last_success_at, last_failure_at, last_error) VALUES (%s, 'open', 20, now() + interval '4 minutes',"
              " now() - interval '1 minute', now() - interval '3 hours', now() - interval '1 minute', 'HTTP 503')",
              (broken,))
    return {"token": world.token(ws), "event": event, "ok": ok, "dead": dead, "broken": broken}


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    folder = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name), full_page=True)


def test_look_up_an_event_see_attempts_and_replay(db, console_url: str, browser: Any, tmp_path: Path) -> None:
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
    banner = page.locator(".breaker-open")
    banner.wait_for()
    assert f"endpoint #{seeded['broken']}" in banner.inner_text() and "20 consecutive failures" in banner.inner_text()

    page.click(f'tr.delivery[data-id="{seeded["dead"]}"] button.replay')
    fresh = page.locator("#event-view tr.delivery.fresh")
    fresh.wait_for()
    assert f"replay of #{seeded['dead']}" in fresh.inner_text() and "pending" in fresh.inner_text()
    assert rows.count() == 3
    assert "Replay queued as delivery" in page.locator("#message").inner_text()
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
