"""Rows to work on: workspaces with endpoints, and events sent the way producers send them."""

from __future__ import annotations

import json
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
