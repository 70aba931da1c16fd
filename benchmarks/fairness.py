"""``fairness``: what one tenant asking for its largest answers costs another (issue 23 item 2).

A real API process (``dispatcher.runtime.api_main``, default settings) serves two
workspaces: ``hoarder`` owns as many endpoints as a workspace may (100, migration
0018), each with history in every bucket of the longest stats window
(``dispatcher_devtools.kit.tenants.seed_hoarder``); ``neighbour`` owns one endpoint.
The neighbour's ordinary requests (its endpoint list, one endpoint, its deliveries,
its stats, one event's deliveries) and ``/healthz`` are timed one at a time, first
alone, then while 8 clients ask in a loop for the hoarder's largest pages (stats at
limit 25, 7 days, 96 buckets; every list at limit 100), in the same run.

Reports p50/p99 of each phase, their ratio, the storm's answers (how many refused 429; any
other non-200 is a failure) and largest body, and the API process's resident size before
and at its peak.  ``lost``: neighbour requests not answered 200 within 30 s.  Target: none lost; the latencies report.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import bench_database, summary_ms
from dispatcher.api import auth
from dispatcher_devtools.kit import config_for_test, wait_until, write_config
from dispatcher_devtools.kit.tenants import SECRET, Answer, Storm, api_process, get, largest_paths, seed_hoarder

ENDPOINTS = 100        # the most a workspace may own
STATS_LIMIT = 25       # the largest stats page
CLIENTS = 8


def _neighbour(db: Any) -> int:
    db.query("INSERT INTO workspaces (id, secret) VALUES ('neighbour', %s)", (SECRET,))
    (endpoint,), = db.query("INSERT INTO webhook_endpoints (workspace_id, url) VALUES ('neighbour',"
                            " 'https://hooks.example.test/n') RETURNING id")
    db.query("INSERT INTO events (id, workspace_id, type, sequence, payload)"
             " VALUES ('evt_n', 'neighbour', 'job.created', 1, '{}')")
    db.query("INSERT INTO webhook_deliveries (workspace_id, endpoint_id, event_id, payload_hash, status, event_day)"
             " SELECT 'neighbour', %s, 'evt_n', 'h', 'delivered', day FROM events"
             " WHERE workspace_id = 'neighbour' AND id = 'evt_n'", (endpoint,))
    return int(endpoint)


def _token(db: Any, workspace: str, *scopes: str) -> str:
    conn = db.connect()
    try:
        return auth.create_token(conn, workspace, list(scopes))  # commits
    finally:
        conn.close()


def _phase(port: int, token: str, paths: list[str], rounds: int) -> dict[str, list[Answer]]:
    """``rounds`` of /healthz then each of the neighbour's ``paths``, one request at a time."""
    answers: dict[str, list[Answer]] = {"neighbour": [], "healthz": []}
    for _ in range(rounds):
        answers["healthz"].append(get(port, "/healthz"))
        answers["neighbour"] += [get(port, path, token) for path in paths]
    return answers


def _summary(answers: dict[str, list[Answer]]) -> dict[str, Any]:
    return {kind: summary_ms([a.seconds for a in group]) for kind, group in answers.items()}


class _PeakRss:
    def __init__(self, pid: int) -> None:
        self.process, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)


def _storm_phase(port: int, pid: int, tokens: tuple[str, str], paths: list[str],
                 rounds: int) -> tuple[dict[str, list[Answer]], list[Answer], dict[str, float]]:
    rss = _PeakRss(pid)
    before = rss.process.memory_info().rss
    rss.thread.start()
    with Storm(port, tokens[0], largest_paths(STATS_LIMIT), clients=CLIENTS) as storm:
        # Under way: the hoarder's first answers are out.
        wait_until(lambda: len(storm.answers) >= CLIENTS, timeout=120, message="the storm's first answers")
        answers = _phase(port, tokens[1], paths, rounds)
    rss.stop.set()
    rss.thread.join(5)
    return answers, list(storm.answers), {"before_mb": round(before / 2**20, 1), "peak_mb": round(rss.peak / 2**20, 1)}


def run(tiny: bool = False) -> dict[str, Any]:
    rounds = 3 if tiny else 40
    with bench_database("fairness") as db, tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        seed_hoarder(db.dsn, "hoarder", ENDPOINTS)
        endpoint = _neighbour(db)
        tokens = (_token(db, "hoarder", auth.READ), _token(db, "neighbour", auth.READ))
        config = write_config(Path(tmp) / "config.yaml", config_for_test(db.dsn, api={"listen": "127.0.0.1:0"}))
        paths = ["/v2/webhooks/endpoints", f"/v2/webhooks/endpoints/{endpoint}", "/v2/webhooks/deliveries",
                 "/v2/webhooks/endpoints/stats", "/v2/events/evt_n/deliveries"]
        with api_process(config) as (process, port):
            _phase(port, tokens[1], paths, 1)  # warm-up: connections, prepared routes
            alone = _phase(port, tokens[1], paths, rounds)
            during, storm, rss = _storm_phase(port, process.pid, tokens, paths, rounds)
    lost = sum(a.status != 200 for phase in (alone, during) for group in phase.values() for a in group)
    alone_s, during_s = _summary(alone), _summary(during)

    def ratio(kind: str, key: str) -> float | None:
        a, d = alone_s[kind][key], during_s[kind][key]
        return round(d / a, 2) if a and d else None

    result: dict[str, Any] = {
        "alone": alone_s, "during_storm": during_s,
        "p50_ratio": {kind: ratio(kind, "p50_ms") for kind in alone_s},
        "p99_ratio": {kind: ratio(kind, "p99_ms") for kind in alone_s},
        "storm": {"clients": CLIENTS, "answers": len(storm),
                  "not_200_or_429": sum(a.status not in (200, 429) for a in storm),
                  "refused_429": sum(a.status == 429 for a in storm),
                  "largest_bytes": max((a.size for a in storm), default=0)},
        "api_rss": rss, "lost": lost, "load_average": [round(x, 2) for x in os.getloadavg()],
        "met": lost == 0,
    }
    result["table"] = [
        ("neighbour p50 ms alone / during storm", f"{alone_s['neighbour']['p50_ms']} / "
                                                  f"{during_s['neighbour']['p50_ms']}", "report"),
        ("neighbour p99 ms alone / during storm", f"{alone_s['neighbour']['p99_ms']} / "
                                                  f"{during_s['neighbour']['p99_ms']}", "report"),
        ("/healthz p99 ms alone / during storm", f"{alone_s['healthz']['p99_ms']} / "
                                                 f"{during_s['healthz']['p99_ms']}", "report"),
        ("storm's largest answer, bytes", result["storm"]["largest_bytes"], "report"),
        ("storm's answers / refused 429", f"{len(storm)} / {result['storm']['refused_429']}", "report"),
        ("API RSS MB before / peak", f"{rss['before_mb']} / {rss['peak_mb']}", "report"),
        ("neighbour requests not answered 200", lost, "0"),
    ]
    return result
