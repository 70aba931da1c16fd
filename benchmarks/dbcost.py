"""``dbcost``: the database's side of a delivery, without HTTP.

An outbox of 50,000 pending deliveries (5,000 events x the 10 endpoints of
their workspace, 100 workspaces, 1 KiB payloads), vacuumed and analysed, is
drained by the engine's own statements in one process, as a worker runs them:
``EngineStore.claim`` (200 rows, 4 per endpoint, the rotating cursor), then
``EngineStore.record`` of the claimed rows as delivered.  What it reports is
the CPU of the Postgres backend serving those statements (read from the
process, split between claims and result writes), the WAL written, and how
many of the outbox's updates were HOT.  No HTTP, no other process: the figure
moves far less with other load on the machine than ``throughput``'s, which is
why each database change of issue 14 item 5 was measured with it
(docs/benchmarks.md).  No target: it reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from benchmarks.harness import bench_database, insert_backlog, leaves
from dispatcher.signing import ROTATION_GRACE
from dispatcher.store.engine import AttemptRecord, ClaimedRow, EngineStore, ManagedConnection, slots_of
from dispatcher_devtools.kit import Database, seed_endpoints

APPLICATION = "bench:dbcost"


def _backend_cpu(db: Database) -> Callable[[], float]:
    (pid,), = db.query("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION,))
    backend = psutil.Process(pid)
    return lambda: sum(backend.cpu_times()[:2])


def _delivered(rows: list[ClaimedRow]) -> list[AttemptRecord]:
    now = time.monotonic()
    return [AttemptRecord(r.id, r.claim_token, r.endpoint_id, "delivered", r.attempt, 0.0, None, 204, "delivered",
                          now, 3, None) for r in rows]


def _drain(store: EngineStore, cpu: Callable[[], float]) -> dict[str, float]:
    spent = {"claim": 0.0, "record": 0.0, "delivered": 0.0}
    cursor = 0
    window = store.claim_window()  # as the worker claims (docs/claim.md, "The claim's window")
    while True:
        before = cpu()
        rows = store.claim("bench:dbcost", 200, 4, [], cursor, 60.0, ROTATION_GRACE, window=window)
        spent["claim"] += cpu() - before
        if not rows:
            return spent
        wrapped = [r.endpoint_id for r in rows if r.endpoint_id <= cursor]
        cursor = max(wrapped) if wrapped else max(r.endpoint_id for r in rows)
        before = cpu()
        spent["delivered"] += len(store.record(_delivered(rows), slots_of(rows)))
        spent["record"] += cpu() - before


def _update_counts(db: Database, at_least: int) -> tuple[int, int]:
    """The outbox's (updates, HOT updates), once the backend's counters have arrived."""
    deadline = time.monotonic() + 5.0
    while True:
        (updated, hot), = db.query("SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) "
                                   f"FROM pg_stat_user_tables WHERE relid IN ({leaves('webhook_deliveries')})")
        if updated >= at_least or time.monotonic() > deadline:
            return int(updated), int(hot)
        time.sleep(0.1)


def run(tiny: bool = False) -> dict[str, Any]:
    events = 50 if tiny else 5_000
    with bench_database("dbcost") as db:
        conn = db.connect()
        seed_endpoints(conn, [[f"http://127.0.0.1:9/ep{w}-{i}" for i in range(10)] for w in range(100)])
        with conn.cursor() as cur:
            deliveries = insert_backlog(cur, 100, events, 1024)
        conn.commit()
        conn.close()
        db.execute_autocommit("VACUUM ANALYZE")
        connection = ManagedConnection(db.dsn, APPLICATION)
        store = EngineStore(connection)
        store.claim("bench:warm-up", 0, 4, [], 0, 60.0, ROTATION_GRACE)  # connects and prepares
        cpu = _backend_cpu(db)
        (wal_start,), = db.query("SELECT pg_current_wal_lsn()::text")
        started = time.perf_counter()
        spent = _drain(store, cpu)
        seconds = time.perf_counter() - started
        (wal,), = db.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (wal_start,))
        connection.close()  # a backend reports its table counters when it exits (or after a second idle)
        updated, hot = _update_counts(db, int(spent["delivered"]))
    done = int(spent["delivered"]) or 1
    result: dict[str, Any] = {
        "deliveries": deliveries, "delivered": int(spent["delivered"]), "lost": deliveries - int(spent["delivered"]),
        "seconds": round(seconds, 2),
        "postgres_cpu_ms_per_delivery": round((spent["claim"] + spent["record"]) * 1000 / done, 4),
        "claim_cpu_ms_per_delivery": round(spent["claim"] * 1000 / done, 4),
        "record_cpu_ms_per_delivery": round(spent["record"] * 1000 / done, 4),
        "wal_bytes_per_delivery": round(float(wal) / done),
        "outbox_updates": updated, "outbox_hot_updates": hot,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "met": None,  # reports only
    }
    result["table"] = [("Postgres CPU ms/delivery (claim + record)", result["postgres_cpu_ms_per_delivery"], "report"),
                       ("of which the claim", result["claim_cpu_ms_per_delivery"], "report"),
                       ("outbox updates that were HOT", hot, "report")]
    return result
