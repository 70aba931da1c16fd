"""One tenant asking for its largest answers while another works (issue 23 item 2).

Shared by ``tests/e2e/faults/test_tenant_fairness.py`` (what must hold) and the
``fairness`` benchmark (what it costs the other tenant): a workspace seeded with
as many endpoints as it may own, each with delivery history in every stats
bucket of the longest window, and a storm of clients asking for that workspace's
largest pages (stats at its largest limit, window and buckets; every list at
its largest page) in a loop against a real API process.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher_devtools.kit.database import query
from dispatcher_devtools.kit.runner import REPO

SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="
EVENT = "evt_hoard"
WEEK_BUCKETS = 96  # the largest bucket count of GET /v2/webhooks/endpoints/stats (params.MAX_STATS_BUCKETS)


def seed_hoarder(dsn: str, workspace: str, endpoints: int, attempts_per_bucket: int = 1) -> None:
    """``workspace`` with ``endpoints`` inactive endpoints and, in each of the 96 buckets of the last
    7 days, one event delivered (dead) to every endpoint after ``attempts_per_bucket`` sent attempts:
    every stats row of the longest window is filled, and every list has full pages.  Set-based SQL,
    as an outside tool would write it (the ownership trigger of migration 0018 still applies)."""
    query(dsn, "INSERT INTO workspaces (id, secret) VALUES (%s, %s)", (workspace, SECRET))
    query(dsn, "INSERT INTO webhook_endpoints (workspace_id, url, active, description)"
               " SELECT %s, 'https://hooks.example.test/hoard/' || n, false, repeat('d', 200)"
               " FROM generate_series(1, %s) n", (workspace, endpoints))
    query(dsn, "INSERT INTO events (id, workspace_id, type, sequence, payload)"
               " SELECT %s || '_' || b, %s, 'job.created', b + 1, '{}' FROM generate_series(0, %s - 1) b",
          (EVENT, workspace, WEEK_BUCKETS))
    query(dsn, "INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, attempt,"
               "                                last_error, last_status_code, finished_at, event_day)"
               " SELECT e.workspace_id, e.id, ev.id, 'h', 'dead', %s, 'http_5xx: ' || repeat('e', 190),"
               "        503, now(), ev.day"
               "   FROM webhook_endpoints e, generate_series(0, %s - 1) b"
               "   JOIN events ev ON ev.workspace_id = %s AND ev.id = %s || '_' || b"
               "  WHERE e.workspace_id = %s",
          (attempts_per_bucket, WEEK_BUCKETS, workspace, EVENT, workspace))
    # Bucket b of the 7-day window spans [b, b+1) x 105 minutes after now() - 7 days: event b's
    # attempts land in its middle, a second apart.
    query(dsn, "INSERT INTO webhook_delivery_attempts (delivery_id, endpoint_id, attempt, started_at, duration_ms,"
               "                                       result, status_code, response_excerpt)"
               " SELECT d.id, d.endpoint_id, 1 + k, now() - interval '7 days'"
               "        + make_interval(mins => b * 105 + 52, secs => k), 10 + (b * 7 + k) %% 500,"
               "        CASE WHEN b %% 3 = 0 THEN 'delivered' ELSE 'http_5xx' END,"
               "        CASE WHEN b %% 3 = 0 THEN 200 ELSE 503 END, repeat('r', 100)"
               "   FROM webhook_deliveries d"
               "   JOIN events ev ON ev.workspace_id = d.workspace_id AND ev.id = d.event_id AND ev.day = d.event_day"
               "  CROSS JOIN LATERAL (SELECT (ev.sequence - 1)::int AS b) s, generate_series(0, %s - 1) k"
               "  WHERE d.workspace_id = %s",
          (attempts_per_bucket, workspace))
    query(dsn, "ANALYZE")


def largest_paths(stats_limit: int | None) -> list[str]:
    """The largest page of every list and of the stats (``stats_limit`` None: a stats route that takes
    no limit, as before issue 23 item 2)."""
    stats = f"window=7d&buckets={WEEK_BUCKETS}" + (f"&limit={stats_limit}" if stats_limit else "")
    return [f"/v2/webhooks/endpoints/stats?{stats}", "/v2/webhooks/endpoints?limit=100",
            "/v2/webhooks/deliveries?limit=100", f"/v2/events/{EVENT}_0/deliveries?limit=100",
            "/v2/webhooks/audit?limit=100", "/v2/webhooks/tokens?limit=100"]


@dataclass(frozen=True)
class Answer:
    """One request's outcome: the status (0: no answer within the timeout, or the connection failed),
    the body's size in bytes and the seconds from sending to the whole body."""

    path: str
    status: int
    size: int
    seconds: float
    error: str | None = None


def get(port: int, path: str, token: str | None = None, timeout: float = 30.0) -> Answer:
    """One GET on a fresh connection, read to the end of its body; never raises."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        body = response.read()
        return Answer(path, response.status, len(body), time.perf_counter() - started)
    except (OSError, http.client.HTTPException) as exc:
        return Answer(path, 0, 0, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


@dataclass
class Storm:
    """``clients`` threads, each asking in turn for every one of ``paths`` with ``token``, until stopped."""

    port: int
    token: str
    paths: Sequence[str]
    clients: int = 8
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rounds: list[int] = field(default_factory=list)

    def _loop(self, index: int) -> None:
        while not self._stop.is_set():
            for path in self.paths:
                if self._stop.is_set():
                    return
                answer = get(self.port, path, self.token)
                with self._lock:
                    self.answers.append(answer)
            self._rounds[index] += 1

    def __enter__(self) -> Storm:
        self._rounds = [0] * self.clients
        for index in range(self.clients):
            thread = threading.Thread(target=self._loop, args=(index,), daemon=True, name=f"storm-{index}")
            thread.start()
            self._threads.append(thread)
        return self

    def every_client_finished(self, rounds: int) -> bool:
        """Each client has had every one of its paths answered ``rounds`` times (or failed)."""
        return min(self._rounds) >= rounds

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@contextlib.contextmanager
def api_process(config: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``python -m dispatcher.runtime.api_main -c CONFIG`` (``api.listen`` port 0): the process and its port,
    stopped on exit."""
    process = subprocess.Popen([sys.executable, "-m", "dispatcher.runtime.api_main", "-c", str(config)],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            match = re.search(r"API listening on http://[^:]+:(\d+)", line)
            if match:
                break
        else:
            raise RuntimeError("the API did not start:\n" + "".join(lines))
        # Keep reading its log, or a full pipe would stop the API.
        threading.Thread(target=lambda: [None for _ in process.stderr or ()], daemon=True).start()
        yield process, int(match.group(1))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
