"""The HTTP transports on the happy path and their error classification.

Sending runs in a gevent-patched child process (``tests.support.post_green``)
against loopback servers started here; see tests/e2e/faults/ for hostile receivers
and the SSRF guard.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from dispatcher.outbound import transport as transport_module
from dispatcher.outbound.transport import _PoolCache, make_transport
from tests.support import (
    KINDS,
    LOOPBACK_POLICY,
    LoopbackServer,
    Peer,
    Request,
    post,
    post_green,
    responder,
    response,
    run_green,
)

pytestmark = pytest.mark.timeout(60)

by_kind = pytest.mark.parametrize("kind", KINDS)


@by_kind
def test_headers_and_body_arrive_intact(kind: str) -> None:
    body = bytes(range(256)) * 4  # not valid UTF-8: the body must pass through as bytes
    headers = {
        "Content-Type": "application/json",
        "webhook-id": "msg_2c1b",
        "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        "X-Larkspur-Attempt": "3",
        # Owned by the transport: replaced, whatever the caller says.
        "Accept-Encoding": "gzip, br",
        "Host": "evil.example",
        "Content-Length": "1",
    }
    with LoopbackServer(responder(response(200, b"accepted"))) as server:
        run = post_green(kind, [post(server.url("/hooks/a?x=1&y=%20"), headers, body)])
    assert run.only == {**run.only, "status": 200, "error": None, "detail": "", "retry_after": None}
    assert run.body() == b"accepted"
    [request] = server.requests
    assert (request.method, request.path, request.body) == ("POST", "/hooks/a?x=1&y=%20", body)
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == "msg_2c1b"
    assert request.headers["webhook-signature"] == headers["webhook-signature"]
    assert request.headers["x-larkspur-attempt"] == "3"
    assert request.headers["host"] == f"127.0.0.1:{server.port}"
    assert request.headers["accept-encoding"] == "identity"
    assert request.headers["content-length"] == str(len(body))


@by_kind
def test_keep_alive_reuses_one_connection(kind: str) -> None:
    with LoopbackServer(responder(response(200, b"ok"))) as server:
        run = post_green(kind, [server.url()] * 5)
    assert [r["status"] for r in run.results] == [200] * 5
    assert len(server.requests) == 5
    assert server.connections == 1
    assert run.dials == [("127.0.0.1", server.port)]


@by_kind
def test_body_past_the_cap_is_truncated_and_its_connection_dropped(kind: str) -> None:
    # Far bigger than one socket read, so most of it is still unread at the cap.
    with LoopbackServer(responder(response(200, b"x" * 200_000))) as server:
        run = post_green(kind, [server.url()] * 2, max_response_bytes=10)
    assert [run.body(0), run.body(1)] == [b"x" * 10] * 2
    assert [r["status"] for r in run.results] == [200, 200]
    assert server.connections == 2  # the unread rest of the body made the first one unusable


@by_kind
def test_body_at_the_cap_keeps_the_connection(kind: str) -> None:
    with LoopbackServer(responder(response(200, b"x" * 10))) as server:
        run = post_green(kind, [server.url()] * 2, max_response_bytes=10)
    assert [run.body(0), run.body(1)] == [b"x" * 10] * 2
    assert server.connections == 1


@by_kind
def test_chunked_response_body(kind: str) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    with LoopbackServer(responder(chunked)) as server:
        run = post_green(kind, [server.url()] * 2)
    assert [run.body(0), run.body(1)] == [b"abcdefg"] * 2
    assert server.connections == 1


@by_kind
def test_redirect_is_returned_not_followed(kind: str) -> None:
    with LoopbackServer(responder(response(200, b"elsewhere"))) as elsewhere:
        moved = response(302, b"", {"Location": elsewhere.url("/landed")})
        with LoopbackServer(responder(moved)) as server:
            run = post_green(kind, [server.url()])
    assert run.only["status"] == 302 and run.only["error"] is None
    assert elsewhere.connections == 0


@by_kind
def test_retry_after_is_surfaced_raw(kind: str) -> None:
    cases = {"/429": (429, "120"), "/503": (503, "Wed, 21 Oct 2026 07:28:00 GMT")}

    def throttle(request: Request) -> bytes:
        status, retry_after = cases[request.path]
        return response(status, b"slow down", {"Retry-After": retry_after})

    with LoopbackServer(responder(throttle)) as server:
        run = post_green(kind, [server.url(path) for path in cases])
    assert [(r["status"], r["retry_after"], r["error"]) for r in run.results] == [(*c, None) for c in cases.values()]
    assert run.body(0) == b"slow down"


@by_kind
def test_unusable_urls_are_classified_not_raised(kind: str) -> None:
    run = post_green(
        kind,
        [
            "ftp://127.0.0.1/hook",
            "not a url",
            "http://user:secret@127.0.0.1/hook",
            "http://",
            "http://nowhere.example.test/hook",
        ],
    )
    assert [r["error"] for r in run.results] == ["invalid_url"] * 4 + ["dns"]
    assert all(r["status"] is None and r["detail"] for r in run.results)
    assert "secret" not in " ".join(r["detail"] for r in run.results)
    assert run.dns_queries == ["nowhere.example.test"]
    assert run.dials == []


@by_kind
def test_header_injection_is_refused_before_dialing(kind: str) -> None:
    run = post_green(kind, [post("http://127.0.0.1:9/hook", {"X-Evil": "a\r\nHost: other"})])
    assert run.only["error"] == "protocol" and "X-Evil" in run.only["detail"]
    assert run.dials == []


@by_kind
def test_header_checks_hold_for_every_request_with_the_same_names(kind: str) -> None:
    # The transport remembers a set of names it checked; the values are checked on every request.
    with LoopbackServer(responder(response(200, b"ok"))) as server:
        good = {"X-A": "1", "X-B": "two", "Host": "evil.example"}
        posts = [post(server.url(), good), post(server.url(), {**good, "X-B": "a\r\nX-Injected: 1"}),
                 post(server.url(), {**good, "X-A": "a\nb"}), post(server.url(), {**good, "X-A": "\x7f"}),
                 post(server.url(), {**good, "X-A": ""}), post(server.url(), good)]
        run = post_green(kind, posts)
    assert [r["status"] for r in run.results] == [200, None, None, None, 200, 200]
    assert [r["detail"] for r in run.results[1:4]] == [
        "invalid value for request header X-B", "invalid value for request header X-A",
        "invalid value for request header X-A"]
    assert len(server.requests) == 3
    assert all("x-injected" not in r.headers for r in server.requests)
    assert {r.headers["host"] for r in server.requests} == {f"127.0.0.1:{server.port}"}  # ours, every time
    assert [r.headers["x-a"] for r in server.requests] == ["1", "", "1"]


@by_kind
def test_idle_connection_the_peer_closed_or_wrote_to_is_not_reused(kind: str) -> None:
    # A keep-alive connection that went bad while idle in the pool is dropped and a new one
    # dialled: nothing is sent into it.  Between two posts to the first server the client
    # posts to the second, and the two servers hand off: the second one's request shows the
    # client is done reading the first one's answer (stray bytes sent earlier could be read
    # with it), then the first one closes (FIN) or writes stray bytes, and only then does the
    # second one answer, so the pooled connection is bad before it is looked at again.
    client_moved_on, misbehaved = threading.Semaphore(0), threading.Semaphore(0)
    broken: list[str] = []

    def answer_then_misbehave(peer: Peer) -> None:
        request = peer.read_request()
        if request is None or not peer.send(response(200, b"ok")) or len(first.requests) == 3:
            return  # the third post is the last: no second-server post follows it
        if not client_moved_on.acquire(timeout=30):
            broken.append(f"the client never posted to the second server after {request.path}")
            return
        if request.path == "/stray":
            peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")  # unasked for
            misbehaved.release()
            peer.wait_closed()
        else:
            peer.sock.close()  # quietly (FIN) while the client keeps the connection
            misbehaved.release()

    def after_the_first_misbehaved(request: Request) -> bytes:
        client_moved_on.release()
        if not misbehaved.acquire(timeout=30):
            broken.append("the first server never closed or wrote to its idle connection")
        return response(200, b"second")

    with LoopbackServer(answer_then_misbehave) as first, \
            LoopbackServer(responder(after_the_first_misbehaved)) as second:
        run = post_green(kind, [first.url("/closed"), second.url(), first.url("/stray"), second.url(),
                                first.url("/closed")])
    assert not broken, broken
    assert [(r["status"], r["error"]) for r in run.results] == [(200, None)] * 5
    assert first.connections == 3
    assert [r.path for r in first.requests] == ["/closed", "/stray", "/closed"]


@by_kind
def test_connect_failure_moves_on_to_the_next_checked_address(kind: str) -> None:
    # 127.0.0.2 is loopback too, but nothing listens there: refused, then 127.0.0.1 answers.
    with LoopbackServer(responder(response(200, b"ok"))) as server:
        run = post_green(
            kind,
            [f"http://multi.example.test:{server.port}/hook"],
            dns={"multi.example.test": [["127.0.0.2", "127.0.0.1"]]},
        )
    assert run.only["status"] == 200
    assert run.dials == [("127.0.0.2", server.port), ("127.0.0.1", server.port)]


@by_kind
def test_a_failed_attempt_leaves_no_cycle_for_the_collector(kind: str) -> None:
    # A worker's young collections run 10,000 allocations apart (runtime/heap.py): a cycle left
    # by each failed attempt would keep every frame down to its socket wait, and what those
    # frames held, alive that long.  One server that never answers (the deadline fires) and a
    # port that refuses.
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        closed.bind(("127.0.0.1", 0))
        urls = [f"http://127.0.0.1:{silent.getsockname()[1]}/hook"] * 3 + \
               [f"http://127.0.0.1:{closed.getsockname()[1]}/hook"] * 3
        out = run_green("tests.support.green:cycles_after_posts",
                        {"kind": kind, "transport": {"timeout": 0.2, "policy": LOOPBACK_POLICY}, "urls": urls})
    assert out["errors"] == ["timeout"] * 3 + ["connection"] * 3
    assert out["frames_in_cycles"] == []


def _has_ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


@by_kind
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
def test_ipv6_literal(kind: str) -> None:
    policy = {"require_https": False, "allow_private_networks": False, "allow_networks": ["::1/128"]}
    with LoopbackServer(responder(response(200, b"ok")), bind="::1") as server:
        run = post_green(kind, [server.url("/hook")] * 2, policy=policy)
    assert [r["status"] for r in run.results] == [200, 200]
    assert run.dials == [("::1", server.port)]
    assert server.requests[0].headers["host"] == f"[::1]:{server.port}"


@by_kind
def test_concurrent_posts_beyond_the_pool_size(kind: str) -> None:
    def echo(request: Request) -> bytes:
        return response(200, request.body)

    with LoopbackServer(responder(echo)) as server:
        posts = [post(server.url(f"/{i}"), {}, str(i).encode()) for i in range(40)]
        run = post_green(kind, posts, concurrency=16, maxsize=2)
    assert [run.body(i) for i in range(40)] == [str(i).encode() for i in range(40)]
    assert len(server.requests) == 40


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown transport kind"):
        make_transport("requests", timeout=1.0)  # type: ignore[arg-type]


class _Clock:
    """A monotonic clock that moves only when the test says: the pool cache's idle rule, untimed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(transport_module, "time", fake)
    return fake


def test_pool_cache_evicts_least_recently_used_and_idle_pools(clock: _Clock) -> None:
    closed: list[str] = []
    cache: _PoolCache[str] = _PoolCache(max_pools=2, idle_timeout=3600, close=closed.append)

    def key(name: str) -> Any:
        return ("http", name, 80, "192.0.2.1")

    assert cache.get(key("a"), lambda: "pool-a") == "pool-a"
    assert cache.get(key("b"), lambda: "pool-b") == "pool-b"
    assert cache.get(key("a"), lambda: "new-a") == "pool-a"  # reused, and now most recent
    assert cache.get(key("c"), lambda: "pool-c") == "pool-c"
    assert closed == ["pool-b"] and len(cache) == 2

    idle: _PoolCache[str] = _PoolCache(max_pools=10, idle_timeout=0, close=closed.append)
    idle.get(key("x"), lambda: "pool-x")
    clock.now += 0.001  # past the zero idle timeout
    idle.get(key("y"), lambda: "pool-y")
    assert closed[-1] == "pool-x" and len(idle) == 1


def test_pool_cache_closes_an_idle_pool_while_another_is_in_steady_use(clock: _Clock) -> None:
    closed: list[str] = []
    cache: _PoolCache[str] = _PoolCache(max_pools=10, idle_timeout=0.2, close=closed.append)

    def key(name: str) -> Any:
        return ("http", name, 80, "192.0.2.1")

    cache.get(key("quiet"), lambda: "pool-quiet")
    for _ in range(5):  # "busy" is used again and again; "quiet" is not
        assert cache.get(key("busy"), lambda: "pool-busy") == "pool-busy"
        clock.now += 0.06
    assert closed == ["pool-quiet"] and len(cache) == 1
    assert cache.get(key("quiet"), lambda: "new-quiet") == "new-quiet"


@by_kind
def test_an_extra_ca_file_is_trusted_in_addition_to_the_system_store(kind: str, tmp_path: Any) -> None:
    import ssl

    import trustme

    from dispatcher.outbound.netguard import OutboundPolicy

    bundle = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(bundle))
    system = ssl.create_default_context().cert_store_stats()["x509_ca"]
    transport = make_transport(kind, timeout=1.0, policy=OutboundPolicy(True, False), ca_certs=str(bundle))  # type: ignore[arg-type]
    try:
        # Every system CA still counts (public endpoints keep working), plus the bundle's one.
        assert transport._ssl_context.cert_store_stats()["x509_ca"] == system + 1  # type: ignore[attr-defined]
    finally:
        transport.close()
