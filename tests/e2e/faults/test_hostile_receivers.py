"""Receivers that misbehave on purpose, against both transports.

Each test starts a loopback server in this (unpatched) process and runs the
transport in a gevent-patched child, as the workers do.  Timing assertions are
safety bounds only (the deadline plus three seconds), never benchmarks.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    KINDS,
    LOOPBACK_POLICY,
    LoopbackServer,
    Peer,
    Request,
    TestCA,
    post_green,
    responder,
    response,
    self_signed,
    server_tls,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("kind", KINDS)]

DEADLINE = 1.0  # seconds; short so the suite stays fast
SAFETY_BOUND = DEADLINE + 3.0
CAP = 65536
GIB = 1 << 30


def _assert_cut_at_deadline(run_result: dict[str, object]) -> None:
    assert run_result["error"] == "timeout", run_result
    assert run_result["status"] is None
    assert float(run_result["duration"]) < SAFETY_BOUND  # type: ignore[arg-type]


# --------------------------------------------------------------------------- slow receivers
def test_accepts_and_never_answers(kind: str) -> None:
    def silent(peer: Peer) -> None:
        peer.read_request()
        peer.wait_closed()

    with LoopbackServer(silent) as server:
        run = post_green(kind, [server.url()], timeout=DEADLINE)
    _assert_cut_at_deadline(run.only)
    assert len(server.requests) == 1


def test_trickles_headers(kind: str) -> None:
    """A byte every half second: a per-read timeout of DEADLINE would never fire; the total deadline must."""

    def trickle_headers(peer: Peer) -> None:
        if peer.read_request():
            peer.trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 100, interval=0.5)

    with LoopbackServer(trickle_headers) as server:
        run = post_green(kind, [server.url()], timeout=DEADLINE)
    _assert_cut_at_deadline(run.only)


def test_trickles_body(kind: str) -> None:
    def trickle_body(peer: Peer) -> None:
        if peer.read_request() and peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"):
            peer.trickle(b"b" * 100, interval=0.5)

    with LoopbackServer(trickle_body) as server:
        run = post_green(kind, [server.url()], timeout=DEADLINE)
    _assert_cut_at_deadline(run.only)


def test_the_deadline_holds_for_each_attempt_of_one_sender(kind: str) -> None:
    """One greenlet, attempts one after another (as a sender makes them): each gets the whole
    deadline.  A deadline that passed does not reach the next attempt, and time spent in
    earlier attempts is not taken from later ones (a gevent timer stopped and started again
    keeps only what was left of it)."""

    def silent(peer: Peer) -> None:
        peer.read_request()
        peer.wait_closed()

    def answer_late(request: Request) -> bytes:
        time.sleep(DEADLINE * 0.4)  # well within one deadline; three of them are not
        return response(200, b"ok")

    with LoopbackServer(silent) as hanging, LoopbackServer(responder(answer_late)) as late:
        posts = [hanging.url()] + [late.url()] * 4 + [hanging.url()] + [late.url()] * 2
        run = post_green(kind, posts, timeout=DEADLINE)
    for index in (0, 5):
        _assert_cut_at_deadline(run.results[index])
    answered = [r for i, r in enumerate(run.results) if i not in (0, 5)]
    assert [(r["status"], r["error"]) for r in answered] == [(200, None)] * 6


# --------------------------------------------------------------------------- big bodies
def test_one_gib_body_is_cut_at_the_cap(kind: str) -> None:
    """The server streams zeros for a declared 1 GiB, lazily; the client must stop
    at the cap and close, so the server can only push what fits in socket buffers."""
    chunk = bytes(65536)

    def huge(peer: Peer) -> None:
        if peer.read_request() and peer.send(f"HTTP/1.1 200 OK\r\nContent-Length: {GIB}\r\n\r\n".encode()):
            for _ in range(GIB // len(chunk)):
                if not peer.send(chunk):
                    return

    with LoopbackServer(huge) as server:
        run = post_green(kind, [server.url()], timeout=5.0)
    assert run.only["status"] == 200 and run.only["error"] is None
    assert run.body() == bytes(CAP)
    assert run.max_rss_mb < 300
    assert server.bytes_sent < 128 << 20  # the client stopped reading long before 1 GiB


def _gzip_bomb(total: int) -> Iterator[bytes]:
    """A gzip stream of ``total`` zero bytes, compressed on demand (~1000:1)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    for _ in range(total // len(block)):
        if out := compressor.compress(block):
            yield out
    yield compressor.flush()


def test_gzip_bomb_is_not_decompressed(kind: str) -> None:
    def bomb(peer: Peer) -> None:
        request = peer.read_request()
        if request is None or not peer.send(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        ):
            return
        for piece in _gzip_bomb(GIB):
            if not peer.send(b"%x\r\n%s\r\n" % (len(piece), piece)):
                return
        peer.send(b"0\r\n\r\n")

    with LoopbackServer(bomb) as server:
        run = post_green(kind, [server.url()], timeout=5.0)
    assert run.only["status"] == 200 and run.only["error"] is None
    body = run.body()
    assert len(body) == CAP
    assert body[:2] == b"\x1f\x8b"  # still gzip: we returned the raw bytes
    assert run.max_rss_mb < 300
    assert server.requests[0].headers["accept-encoding"] == "identity"


# --------------------------------------------------------------------------- broken connections
def test_reset_mid_response(kind: str) -> None:
    def reset(peer: Peer) -> None:
        if peer.read_request() and peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10):
            peer.server.stop.wait(0.2)
            peer.reset()

    with LoopbackServer(reset) as server:
        run = post_green(kind, [server.url()], timeout=DEADLINE)
    assert run.only["error"] == "connection", run.only
    assert run.only["status"] is None


def test_closed_before_response(kind: str) -> None:
    def hang_up(peer: Peer) -> None:
        peer.read_request()  # then close without a word

    with LoopbackServer(hang_up) as server:
        run = post_green(kind, [server.url()], timeout=DEADLINE)
    assert run.only["error"] == "connection", run.only
    assert float(run.only["duration"]) < DEADLINE  # a clean failure, not a timeout


def test_connection_refused(kind: str) -> None:
    with LoopbackServer(responder(b"")) as server:
        url = server.url()
    run = post_green(kind, [url], timeout=DEADLINE)  # the listener is closed now
    assert run.only["error"] == "connection" and "refused" in run.only["detail"]


MALFORMED_STATUS_LINES = [
    b"HTTP/1.1 2OO OK",
    b"HTTX/1.1 200 OK",
    b"HTTP/1.1 200OK",
    b"HTTP/1.1 99999 OK",
    b"200 OK",
    b"hello world",
]


def test_malformed_status_line(kind: str) -> None:
    # One server and one child process for all the variants: /0, /1, ... pick the line.
    def malformed(peer: Peer) -> None:
        request = peer.read_request()
        if request is not None:
            line = MALFORMED_STATUS_LINES[int(request.path.lstrip("/"))]
            if peer.send(line + b"\r\nContent-Length: 2\r\n\r\nok"):
                peer.wait_closed()

    with LoopbackServer(malformed) as server:
        urls = [server.url(f"/{i}") for i in range(len(MALFORMED_STATUS_LINES))]
        run = post_green(kind, urls, timeout=DEADLINE)
    for line, result in zip(MALFORMED_STATUS_LINES, run.results, strict=True):
        assert (result["error"], result["status"]) == ("protocol", None), (line, result)
        assert "hello" not in result["detail"]  # the peer's bytes are not echoed


def test_endless_headers(kind: str) -> None:
    """Headers streamed as fast as possible: refused on size, not at the deadline."""

    def endless(peer: Peer) -> None:
        if peer.read_request() and peer.send(b"HTTP/1.1 200 OK\r\n"):
            for i in range(1_000_000):
                if not peer.send(b"X-Filler-%d: %s\r\n" % (i, b"f" * 100)):
                    return

    with LoopbackServer(endless) as server:
        run = post_green(kind, [server.url()], timeout=5.0)
    assert run.only["error"] == "protocol", run.only
    assert float(run.only["duration"]) < 5.0
    assert run.max_rss_mb < 300


# --------------------------------------------------------------------------- TLS
HOST = "hooks.example.test"
TLS_POLICY = {**LOOPBACK_POLICY, "require_https": True}
TLS_DNS = {HOST: [["127.0.0.1"]]}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("tls"))


def test_tls_uses_the_host_name_while_dialing_the_checked_ip(kind: str, ca: TestCA) -> None:
    sni: list[str | None] = []
    tls = server_tls(ca.issue([HOST], stem="good"), sni)
    with LoopbackServer(responder(response(200, b"ok")), tls=tls) as server:
        url = server.url("/hook", host=HOST)
        run = post_green(kind, [url] * 3, policy=TLS_POLICY, dns=TLS_DNS, ca_certs=str(ca.cert_path))
    assert [r["status"] for r in run.results] == [200] * 3, run.results
    assert run.dials == [("127.0.0.1", server.port)]  # the checked address, once: kept alive
    assert sni == [HOST]
    assert server.connections == 1
    assert {r.headers["host"] for r in server.requests} == {f"{HOST}:{server.port}"}


def test_bad_certificates(kind: str, ca: TestCA, tmp_path: Path) -> None:
    cases = [
        ("certificate has expired", ca.issue([HOST], expired=True, stem="expired")),
        ("self-signed certificate", self_signed(tmp_path, [HOST])),
        ("Hostname mismatch", ca.issue(["other.example.test"], stem="other")),
    ]
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(LoopbackServer(responder(response(200)), server_tls(f))) for _, f in cases]
        urls = [server.url("/hook", host=HOST) for server in servers]
        run = post_green(kind, urls, policy=TLS_POLICY, dns=TLS_DNS, ca_certs=str(ca.cert_path))
    for (reason, _), result in zip(cases, run.results, strict=True):
        assert result["error"] == "tls" and reason in result["detail"], (reason, result)
    assert all(server.requests == [] for server in servers)  # nothing sent over an untrusted connection
