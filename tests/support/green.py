"""Run one function inside a gevent-monkey-patched interpreter, the way the workers run.

    python tests/support/green.py module:function '<json object of keyword arguments>'

The pytest process itself is never monkey-patched (its trio/anyio plugins break
under gevent), so code that needs the production setup -- the transports, whose
deadline is a ``gevent.Timeout`` -- runs here, in a child process, and reports
back a JSON result on the last line of stdout.  ``tests.support.run_green`` is the
pytest-side caller.

The functions below are the targets the transport tests use.  They never touch
the real network beyond loopback: names are answered by :class:`StubResolver`
and every connection goes through :class:`LoopbackOnlyDialer`, which records
the address the transport asked for and refuses anything that is not loopback.
"""

from __future__ import annotations

if __name__ == "__main__":
    # First, before anything imports socket, ssl, threading or select: the dev
    # tools' one patch preamble, found through the checkout (run as a script,
    # only this file's directory is on sys.path; os and sys are not patched).
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import dispatcher_devtools.green  # noqa: F401

import base64  # noqa: E402
import importlib  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class StubResolver:
    """``getaddrinfo`` stand-in: ``answers`` maps a name to a list of answers, each a
    list of addresses; successive queries take successive answers and the last one
    repeats (so ``[[public], [loopback]]`` is a rebinding name).  Unknown names fail
    the way a real resolver does."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self._answers = {host: [list(a) for a in seq] for host, seq in answers.items()}
        self.queries: list[str] = []

    def __call__(self, host: str, port: int, family: int = 0, type: int = 0, *_: Any) -> list[tuple[Any, ...]]:  # noqa: A002
        self.queries.append(host)
        answers = self._answers.get(host)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addresses = answers.pop(0) if len(answers) > 1 else answers[0]
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (ip, port, 0, 0))
            if ":" in ip
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))
            for ip in addresses
        ]


class LoopbackOnlyDialer:
    """Records every (ip, port) the transport dials.  ``redirect`` maps a (fake,
    public) address to a loopback ``[host, port]`` actually connected to; any
    other non-loopback address is refused, so nothing can leave the machine."""

    def __init__(self, redirect: dict[str, list[Any]]) -> None:
        self._redirect = {ip: (str(dest[0]), int(dest[1])) for ip, dest in redirect.items()}
        self.dials: list[list[Any]] = []

    def __call__(self, ip: str, port: int, timeout: float) -> socket.socket:
        from dispatcher.outbound.transport import tcp_dial

        self.dials.append([ip, port])
        dest_ip, dest_port = self._redirect.get(ip, (ip, port))
        if not ipaddress.ip_address(dest_ip).is_loopback:
            raise ConnectionRefusedError(f"test dialer refuses non-loopback address {dest_ip}")
        return tcp_dial(dest_ip, dest_port, timeout)


def _result_json(result: Any) -> dict[str, Any]:
    return {
        "status": result.status,
        "error": result.error,
        "detail": result.detail,
        "retry_after": result.retry_after,
        "duration": result.duration,
        "body_b64": base64.b64encode(result.body).decode("ascii"),
    }


def post_scenario(
    kind: str,
    transport: dict[str, Any],
    posts: list[dict[str, Any]],
    dns: dict[str, list[list[str]]] | None = None,
    redirect: dict[str, list[Any]] | None = None,
    concurrency: int = 1,
) -> dict[str, Any]:
    """Build a transport (``transport`` holds its keyword arguments, ``policy`` as a
    dict) and make the given posts (``url``, optional ``headers`` and ``body_b64``)."""
    import gevent.pool

    from dispatcher.outbound.netguard import OutboundPolicy
    from dispatcher.outbound.transport import make_transport

    resolver = StubResolver(dns or {})
    dialer = LoopbackOnlyDialer(redirect or {})
    options = dict(transport)
    policy = OutboundPolicy(**options.pop("policy"))
    client = make_transport(kind, policy=policy, resolver=resolver, dialer=dialer, **options)  # type: ignore[arg-type]

    def one(post: dict[str, Any]) -> Any:
        return client.post(post["url"], post.get("headers", {}), base64.b64decode(post.get("body_b64", "")))

    started = time.monotonic()
    if concurrency > 1:
        results = gevent.pool.Pool(concurrency).map(one, posts)
    else:
        results = [one(post) for post in posts]
    elapsed = time.monotonic() - started
    client.close()
    return {
        "results": [_result_json(r) for r in results],
        "dials": dialer.dials,
        "dns_queries": resolver.queries,
        "elapsed": elapsed,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def cycles_after_posts(kind: str, transport: dict[str, Any], urls: list[str]) -> dict[str, Any]:
    """Post to each of ``urls`` and report the errors and the frames of ``dispatcher.outbound``
    that only the cyclic garbage collector would free (found with ``gc.DEBUG_SAVEALL``)."""
    import gc
    import types

    from dispatcher.outbound.netguard import OutboundPolicy
    from dispatcher.outbound.transport import make_transport

    options = dict(transport)
    policy = OutboundPolicy(**options.pop("policy"))
    client = make_transport(kind, policy=policy, **options)  # type: ignore[arg-type]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        errors = [client.post(url, {"Content-Type": "application/json"}, b"{}").error for url in urls]
        gc.collect()
        frames = sorted({f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)})"
                         for frame in gc.garbage if isinstance(frame, types.FrameType)
                         and "dispatcher" + os.sep + "outbound" in frame.f_code.co_filename})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        client.close()
    return {"errors": errors, "frames_in_cycles": frames}


def bench(kind: str, url: str, seconds: float = 3.0, concurrency: int = 32, body_size: int = 1024) -> dict[str, Any]:
    """Micro-benchmark (not a test): ``concurrency`` greenlets posting to ``url`` for ``seconds``."""
    import gevent

    from dispatcher.outbound.netguard import OutboundPolicy
    from dispatcher.outbound.transport import make_transport

    loopback = (ipaddress.ip_network("127.0.0.0/8"),)
    policy = OutboundPolicy(require_https=False, allow_private_networks=False, allow_networks=loopback)
    client = make_transport(kind, timeout=10.0, policy=policy, maxsize=concurrency)  # type: ignore[arg-type]
    body = b"x" * body_size
    headers = {"Content-Type": "application/json", "webhook-id": "msg_1"}
    counts = {"ok": 0, "failed": 0}
    stop_at = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < stop_at:
            result = client.post(url, headers, body)
            counts["ok" if result.status == 200 else "failed"] += 1

    started = time.monotonic()
    gevent.joinall([gevent.spawn(loop) for _ in range(concurrency)])
    elapsed = time.monotonic() - started
    client.close()
    return {"kind": kind, "requests_per_s": counts["ok"] / elapsed, **counts, "seconds": elapsed}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or ":" not in argv[0]:
        print("usage: green.py module:function '<json kwargs>'", file=sys.stderr)
        return 2
    module_name, function_name = argv[0].split(":", 1)
    function = getattr(importlib.import_module(module_name), function_name)
    print(json.dumps(function(**json.loads(argv[1]))))
    return 0


if __name__ == "__main__":
    # The repository root, for ``dispatcher`` and ``tests.support``.
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
