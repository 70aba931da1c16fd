"""The ``ceiling`` scenario's bare loop, one process: claim, POST, mark done.

``python -m benchmarks.bare_loop --dsn DSN`` (gevent-patched first).  No
signing (only the ``webhook-id`` header the receiver needs), no attempt
history, no metrics, no breaker, no fairness walk, no logging per attempt:
what this machine and stack allow for the outbox round trip, with the same
fast transport as the engine.  It exits when a claim finds nothing and
nothing is in flight.

``python -m benchmarks.bare_loop --probe URL --client KIND --seconds S``
instead measures one HTTP client alone: 32 greenlets (``--concurrency``) POSTing a
1 KiB body to ``URL`` for ``S`` seconds over as many keep-alive connections, and
prints ``{"requests": n, "seconds": s}`` (n: the 2xx answers).
"""

import dispatcher_devtools.green  # noqa: F401, I001  -- first: the dev tools' one patch preamble

import argparse
import json
import sys
import time

import gevent
import gevent.event
import gevent.pool
import psycopg2

from dispatcher.outbound.netguard import OutboundPolicy
from dispatcher.outbound.transport import make_transport

CLAIM = """
WITH c AS (
    SELECT id FROM webhook_deliveries
     WHERE status = 'pending' AND next_attempt_at <= now()
     ORDER BY next_attempt_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE webhook_deliveries d
   SET next_attempt_at = now() + interval '60 seconds'
  FROM c
 WHERE d.id = c.id
RETURNING d.id, d.event_id, (SELECT url FROM webhook_endpoints e WHERE e.id = d.endpoint_id),
          (SELECT payload::text FROM events ev
            WHERE ev.workspace_id = d.workspace_id AND ev.id = d.event_id AND ev.day = d.event_day)
"""

DONE = """
UPDATE webhook_deliveries SET status = 'delivered', attempt = attempt + 1, delivered_at = now(),
       finished_at = now(), last_status_code = 200
 WHERE id = ANY (%(ids)s::bigint[])
"""

POLICY = OutboundPolicy(require_https=False, allow_private_networks=True, allow_networks=())


def _transport(kind: str, maxsize: int):  # type: ignore[no-untyped-def]
    return make_transport(kind, timeout=10.0, max_response_bytes=65536, policy=POLICY, maxsize=maxsize)  # type: ignore[arg-type]


def bare_loop(dsn: str, kind: str, batch: int, in_flight: int) -> dict[str, float]:
    claims = psycopg2.connect(dsn, application_name="dispatcher bare loop claim")
    claims.autocommit = True
    results = psycopg2.connect(dsn, application_name="dispatcher bare loop done")
    results.autocommit = True
    transport = _transport(kind, in_flight)
    pool = gevent.pool.Pool(in_flight)
    done: list[int] = []
    finished = gevent.event.Event()
    counts: dict[str, float] = {"sent": 0, "ok": 0}

    def send(row_id: int, event_id: str, url: str, payload: str) -> None:
        body = f'{{"id":"{event_id}","data":{payload}}}'.encode()
        result = transport.post(url, {"webhook-id": event_id, "Content-Type": "application/json"}, body)
        counts["sent"] += 1
        if result.status is not None and 200 <= result.status < 300:
            counts["ok"] += 1
            done.append(row_id)

    def flusher() -> None:
        with results.cursor() as cur:
            while True:
                stopping = finished.wait(0.05)
                if done:
                    batch_ids = done[:]
                    del done[:len(batch_ids)]
                    cur.execute(DONE, {"ids": batch_ids})
                elif stopping:
                    return

    flush = gevent.spawn(flusher)
    with claims.cursor() as cur:
        while True:
            room = pool.free_count()
            if room < batch // 4:
                gevent.sleep(0.001)
                continue
            cur.execute(CLAIM, {"limit": min(batch, room)})
            rows = cur.fetchall()
            if rows and "first_claim" not in counts:
                counts["first_claim"] = time.time()
            if not rows:
                if pool.free_count() == in_flight:
                    break
                gevent.sleep(0.01)
                continue
            for row in rows:
                pool.spawn(send, *row)
    pool.join()
    finished.set()
    flush.join()
    transport.close()
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    counts["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    return counts


def probe(url: str, kind: str, seconds: float, concurrency: int = 32, secret: str | None = None) -> dict[str, float]:
    import resource

    transport = _transport(kind, concurrency)
    body = b'{"pad":"' + b"x" * 1000 + b'"}'
    headers = {"webhook-id": "probe", "Content-Type": "application/json"}
    if secret:  # one signed header set: the receiver verifies every request all the same
        from dispatcher_devtools.receiver import signed_headers

        headers = signed_headers(secret, "probe", body)
    count = [0]
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            result = transport.post(url, headers, body)
            if result.status is not None and 200 <= result.status < 300:  # nginx answers 204
                count[0] += 1

    started = time.monotonic()
    gevent.joinall([gevent.spawn(client) for _ in range(concurrency)])
    elapsed = time.monotonic() - started
    transport.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"requests": count[0], "seconds": round(elapsed, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn")
    parser.add_argument("--client", default="geventhttpclient")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument("--probe")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--secret")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe, args.client, args.seconds, args.concurrency, args.secret)))
    else:
        print(json.dumps(bare_loop(args.dsn, args.client, args.batch, args.in_flight)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
