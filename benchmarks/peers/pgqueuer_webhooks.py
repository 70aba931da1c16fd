"""Webhook delivery the way a PgQueuer user would build it: PgQueuer + aiohttp.

One job per (event, endpoint).  A job's payload holds the endpoint URL and the
event's fields; the entrypoint builds the JSON body the project sends
(``id, type, workspace_id, sequence, occurred_at, data``), signs it with
HMAC-SHA256 the Standard Webhooks way (``{id}.{timestamp}.{body}``, header
``webhook-signature: v1,<base64>``), and POSTs it with ``Idempotency-Key:
<event id>`` through one shared aiohttp ClientSession (keep-alive).  A non-2xx
answer raises, which PgQueuer records as an ``exception`` in its log.

Each worker process runs ``--queuers`` PgQueuer instances, each on its own
asyncpg connection (the docs' advice: a dedicated connection per
QueueManager), on uvloop as ``pgq run`` does, with PgQueuer's recommended
autovacuum settings installed (``pgq autovac``) and the default durability
(every table logged, as the project's outbox is).

    python -m benchmarks.peers.pgqueuer_webhooks install --dsn DSN
    python -m benchmarks.peers.pgqueuer_webhooks worker --dsn DSN --secret S [--batch-size N]
        [--max-concurrent-tasks M] [--queuers K] [--connections C] [--ready-file PATH]

The ``peer`` scenario (benchmarks/peer.py) enqueues the jobs with :func:`enqueue`
and starts the workers.  The secret is given to the workers (a PgQueuer user
would keep per-endpoint secrets in config or a table; W1 has one).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.errors import FailingListenerError
from pgqueuer.models import Job
from pgqueuer.queries import Queries

ENTRYPOINT = "webhook"
APPLICATION_NAME = "pgqueuer peer"  # how its Postgres backends are told apart
USER_AGENT = "pgqueuer-webhooks/1"
BODY_FIELDS = ("id", "type", "workspace_id", "sequence", "occurred_at", "data")

# Defaults: the best of the settings tried on the 2-core machine (docs/benchmarks.md, "peer"):
# PgQueuer's own defaults (batch 10, no task cap) cost 3x the CPU per job, almost all of it
# Postgres running the dequeue.  Larger batches cost less: at 30,000 jobs up to about 200, at
# W1's 100,000 up to 500 (Postgres' CPU per job grows with the backlog, so fewer dequeues
# matter more; why it grows was not looked into); 1,000 was no cheaper.  A second PgQueuer per
# process, no task cap, or an unbounded aiohttp pool (a connection per task in flight) cost more.
BATCH_SIZE = 500
MAX_CONCURRENT_TASKS = 1000
QUEUERS = 1
CONNECTIONS = 100


def job_payload(url: str, event: dict[str, Any]) -> bytes:
    """A job's payload: the endpoint URL and the event's fields."""
    return json.dumps({"url": url, **{key: event[key] for key in BODY_FIELDS}}, separators=(",", ":")).encode()


def secret_key(secret: str) -> bytes:
    """Standard Webhooks: a ``whsec_`` secret's key is its base64-decoded rest."""
    return base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()


def sign(key: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    content = b"%s.%d.%s" % (event_id.encode(), timestamp, body)
    return "v1," + base64.b64encode(hmac.digest(key, content, hashlib.sha256)).decode("ascii")


def connect(dsn: str) -> Any:
    """An asyncpg connection named so the benchmark can tell its backends apart."""
    return asyncpg.connect(dsn, server_settings={"application_name": APPLICATION_NAME})


# --------------------------------------------------------------------------- setup and producer


async def install(dsn: str) -> None:
    """``pgq install`` then ``pgq autovac`` (the docs' checklist)."""
    conn = await connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.optimize_autovacuum()
    finally:
        await conn.close()


async def enqueue(dsn: str, payloads: Sequence[bytes], before_commit: Callable[[], None] = lambda: None) -> float:
    """Enqueue one job per payload in one batch and one transaction; returns time.time() at COMMIT.

    ``before_commit`` runs after the insert, just before the COMMIT (the caller starts its meters).
    """
    conn = await connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        transaction = conn.transaction()
        await transaction.start()
        try:
            await queries.enqueue([ENTRYPOINT] * len(payloads), list(payloads), [0] * len(payloads))
        except BaseException:
            await transaction.rollback()
            raise
        before_commit()
        await transaction.commit()
        return time.time()
    finally:
        await conn.close()


# --------------------------------------------------------------------------- the worker


def deliverer(http: aiohttp.ClientSession, key: bytes) -> Callable[[Job], Any]:
    """The entrypoint: build the body, sign it, POST it; a non-2xx answer raises."""

    async def deliver(job: Job) -> None:
        assert job.payload is not None
        message = json.loads(job.payload)
        event_id = message["id"]
        body = json.dumps({key_: message[key_] for key_ in BODY_FIELDS}, separators=(",", ":")).encode()
        timestamp = int(time.time())
        signature = sign(key, event_id, timestamp, body)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Idempotency-Key": event_id,
                   "webhook-id": event_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}
        async with http.post(message["url"], data=body, headers=headers) as response:
            if response.status >= 300:
                raise RuntimeError(f"{message['url']} answered {response.status}")

    return deliver


async def _listening(pgq: PgQueuer) -> None:
    """Until this PgQueuer's LISTEN is in place (a NOTIFY round trip answers)."""
    while True:
        try:
            await pgq.qm.listener_healthy(timeout=timedelta(seconds=1))
            return
        except FailingListenerError:
            continue


async def serve(options: argparse.Namespace) -> None:
    key = secret_key(options.secret)
    connector = aiohttp.TCPConnector(limit=options.connections, keepalive_timeout=300)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=5)) as http:
        connections = [await connect(options.dsn) for _ in range(options.queuers)]
        queuers = []
        for conn in connections:
            pgq = PgQueuer(AsyncpgDriver(conn), resources={"http": http})
            pgq.entrypoint(ENTRYPOINT)(deliverer(http, key))
            queuers.append(pgq)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, lambda: [pgq.shutdown.set() for pgq in queuers])
        runs = [asyncio.create_task(pgq.run(batch_size=options.batch_size,
                                            max_concurrent_tasks=options.max_concurrent_tasks or None,
                                            dequeue_timeout=timedelta(seconds=options.dequeue_timeout)))
                for pgq in queuers]
        await asyncio.wait_for(asyncio.gather(*(_listening(pgq) for pgq in queuers)), timeout=30)
        if options.ready_file:
            Path(options.ready_file).write_text(json.dumps({"queuers": len(queuers)}), encoding="utf-8")
        try:
            await asyncio.gather(*runs)
        finally:
            for conn in connections:
                await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.pgqueuer_webhooks",
                                     description="Webhook delivery with PgQueuer + aiohttp (a benchmark peer)")
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("install", help="install PgQueuer's schema and its autovacuum settings")
    setup.add_argument("--dsn", required=True)
    worker = sub.add_parser("worker", help="deliver jobs until SIGTERM")
    worker.add_argument("--dsn", required=True)
    worker.add_argument("--secret", required=True, help="the signing secret (whsec_... or plain)")
    worker.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="jobs per dequeue")
    worker.add_argument("--max-concurrent-tasks", type=int, default=MAX_CONCURRENT_TASKS,
                        help="jobs in flight per PgQueuer (>= 2 x batch size; 0: unlimited)")
    worker.add_argument("--queuers", type=int, default=QUEUERS, help="PgQueuer instances (connections) per process")
    worker.add_argument("--connections", type=int, default=CONNECTIONS,
                        help="aiohttp connection pool size (0: unlimited)")
    worker.add_argument("--dequeue-timeout", type=float, default=30.0, help="seconds between polls without NOTIFY")
    worker.add_argument("--ready-file", help="written once every PgQueuer listens")
    options = parser.parse_args(argv)
    import uvloop  # a dependency of pgqueuer, whose own `pgq run` uses it

    if options.command == "install":
        uvloop.run(install(options.dsn))
        return 0
    if options.batch_size < 1 or options.queuers < 1 or options.connections < 0:
        parser.error("--batch-size and --queuers must be positive, --connections at least 0")
    if options.max_concurrent_tasks and options.max_concurrent_tasks < 2 * options.batch_size:
        parser.error("--max-concurrent-tasks must be at least twice --batch-size (PgQueuer's rule), or 0")
    uvloop.run(serve(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
