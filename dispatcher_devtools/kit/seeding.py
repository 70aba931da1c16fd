"""Rows to work on: workspaces with endpoints, and events sent the way producers send them."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

from dispatcher import Event, WebhookSender, load_config

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def seed_workspaces(conn: psycopg2.extensions.connection, workspaces: Mapping[str, Sequence[str]], *,
                    secret: str = SECRET, outbox: bool = True,
                    event_types: Iterable[str] = ()) -> dict[str, list[int]]:
    """One workspace per key with one endpoint per URL, in one transaction; endpoint ids by workspace."""
    flags = json.dumps({"webhook_outbox": outbox})
    types = list(event_types)  # [] is the column's default: every event type
    ids: dict[str, list[int]] = {}
    with conn, conn.cursor() as cur:
        for workspace, urls in workspaces.items():
            cur.execute("INSERT INTO workspaces (id, secret, flags) VALUES (%s, %s, %s)", (workspace, secret, flags))
            ids[workspace] = []
            for url in urls:
                cur.execute("INSERT INTO webhook_endpoints (workspace_id, url, event_types) "
                            "VALUES (%s, %s, %s) RETURNING id", (workspace, url, types))
                row = cur.fetchone()
                assert row is not None
                ids[workspace].append(int(row[0]))
    return ids


def seed_workspace(dsn: str, workspace: str, urls: Iterable[str], *, outbox: bool = True,
                   secret: str = SECRET, event_types: Iterable[str] = ()) -> list[int]:
    """A workspace with one endpoint per URL; returns the endpoint ids."""
    conn = psycopg2.connect(dsn)
    try:
        return seed_workspaces(conn, {workspace: list(urls)}, secret=secret, outbox=outbox,
                               event_types=event_types)[workspace]
    finally:
        conn.close()


def seed_endpoints(conn: psycopg2.extensions.connection, urls: Sequence[Sequence[str]],
                   secret: str = SECRET) -> list[list[int]]:
    """One workspace ``ws<i>`` per entry of ``urls`` (at most 10 URLs each); returns endpoint ids."""
    ids = seed_workspaces(conn, {f"ws{index}": list(row) for index, row in enumerate(urls)}, secret=secret)
    return list(ids.values())


def produce(config_path: Path | str, dsn: str, workspace: str, count: int, event_type: str = "job.created",
            payload: dict[str, Any] | None = None) -> list[str]:
    """Send ``count`` events through WebhookSender, one transaction; returns their ids."""
    sender = WebhookSender(load_config(config_path, env={}))
    conn = psycopg2.connect(dsn)
    try:
        with sender.transaction(conn) as tx:
            return [tx.send(Event(workspace, event_type, payload or {"n": n})).id for n in range(count)]
    finally:
        conn.close()


class SteadyProducer:
    """A thread that commits one event per transaction until stopped, as a busy
    producer would through a database outage: a failed send or COMMIT (or any
    other exception from the library) is counted and the connection reopened
    after ``pause``.

    ``committed`` holds (event id, monotonic time the COMMIT returned) of every
    event whose COMMIT succeeded -- the events that must never be lost.  An
    event whose COMMIT raised is in doubt (it may or may not have been written)
    and is not counted.
    """

    def __init__(self, config_path: Path | str, dsn: str, workspace: str, interval: float = 0.01,
                 pause: float = 0.1) -> None:
        self._sender = WebhookSender(load_config(config_path, env={}))
        self._dsn = dsn
        self._workspace = workspace
        self._interval = interval
        self._pause = pause
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)
        self.committed: list[tuple[str, float]] = []
        self.failures: list[str] = []

    def __enter__(self) -> SteadyProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def ids(self, before: float = math.inf) -> set[str]:
        """Ids of the events committed before monotonic time ``before``."""
        return {event_id for event_id, at in list(self.committed) if at < before}

    def _run(self) -> None:
        conn: psycopg2.extensions.connection | None = None
        n = 0
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg2.connect(self._dsn, connect_timeout=2)
                with self._sender.transaction(conn) as tx:
                    stored = tx.send(Event(self._workspace, "job.created", {"n": n}))
                self.committed.append((stored.id, time.monotonic()))
                n += 1
                self._stop.wait(self._interval)
            except Exception as exc:  # a database error, or the library refusing the event: counted, never fatal
                text = str(exc).strip()
                self.failures.append(text.splitlines()[0] if text else type(exc).__name__)
                if conn is not None:
                    conn.close()
                self._stop.wait(self._pause)
        if conn is not None:
            conn.close()
