"""Harness for engine tests: seed rows, produce events, run a real dispatcher.

The dispatcher runs exactly as in production -- ``python -m dispatcher.cli -c
CONFIG run`` in its own process group, forking its workers -- against the
test's own database and a real loopback receiver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg2

from dispatcher import Event, WebhookSender, load_config

REPO = Path(__file__).resolve().parents[2]
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Poll until ``predicate`` is truthy; fail the test with ``message`` at the bound."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)


def seed_workspace(dsn: str, workspace: str, urls: Iterable[str], *, outbox: bool = True,
                   secret: str = SECRET, event_types: Iterable[str] = ()) -> list[int]:
    """A workspace with one endpoint per URL; returns the endpoint ids."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("INSERT INTO workspaces (id, secret, flags) VALUES (%s, %s, %s)",
                        (workspace, secret, '{"webhook_outbox": %s}' % ("true" if outbox else "false")))
            ids = []
            for url in urls:
                cur.execute("INSERT INTO webhook_endpoints (workspace_id, url, event_types) "
                            "VALUES (%s, %s, %s) RETURNING id", (workspace, url, list(event_types)))
                ids.append(cur.fetchone()[0])
        return ids
    finally:
        conn.close()


def produce(config_path: Path, dsn: str, workspace: str, count: int, event_type: str = "job.created",
            payload: dict[str, Any] | None = None) -> list[str]:
    """Send ``count`` events through WebhookSender, one transaction; returns their ids."""
    sender = WebhookSender(load_config(config_path, env={}))
    conn = psycopg2.connect(dsn)
    try:
        with sender.transaction(conn) as tx:
            return [tx.send(Event(workspace, event_type, payload or {"n": n})).id for n in range(count)]
    finally:
        conn.close()


def query(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def status_counts(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT status, count(*) FROM webhook_deliveries GROUP BY status"))  # type: ignore[arg-type]


class Dispatcher:
    """``dispatcher -c CONFIG run`` as a subprocess; logs go to a file."""

    def __init__(self, config_path: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self._env = env
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Dispatcher:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
        env.update(self._env or {})
        env["PYTHONPATH"] = str(REPO)
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "-c", str(self.config_path), "run"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=REPO,
            start_new_session=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        import psutil

        assert self.process is not None
        try:
            return [p.pid for p in psutil.Process(self.process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        # Workers live in their own sessions: make sure none outlives the test.
        for pid in _orphans(self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()


def _orphans(supervisor_pid: int) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "dispatcher.worker_main" in cmdline and any(f":{supervisor_pid}:" in part for part in cmdline):
            found.append(proc.pid)
    return found
