"""Loopback tests of the mock webhook receiver (``dispatcher_devtools.receiver``).

Every test talks to a real ``python -m dispatcher_devtools.receiver`` subprocess over
127.0.0.1.  Tests use their own endpoint keys, so they can share one receiver.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme

from dispatcher.signing import as_standard_secret
from dispatcher_devtools.kit import REPO, wait_until
from dispatcher_devtools.receiver import ReceiverProcess, build_profile, closed_port_url, signed_headers

pytestmark = pytest.mark.timeout(60)

SECRET = "plain-workspace-secret"
ROTATED = "whsec_" + base64.b64encode(b"the-new-key-after-rotation").decode()
BODY = b'{"type":"job.completed","data":{"job_id":"j_1"}}'


@pytest.fixture(scope="module")
def receiver() -> Iterator[ReceiverProcess]:
    with ReceiverProcess([SECRET, ROTATED], seed=7) as running:
        yield running


def new_key() -> str:
    return f"ep-{uuid.uuid4().hex[:12]}"


def post(
    url: str, headers: Mapping[str, str], body: bytes = BODY,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, str]]:
    """POST and read the whole answer; returns (status, lower-cased headers)."""
    parts = urlsplit(url)
    conn = connection or http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", target, body=body, headers=dict(headers))
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        if connection is None:
            conn.close()


def deliver(url: str, webhook_id: str | None = None, **kwargs: Any) -> tuple[int, dict[str, str]]:
    """A correctly signed delivery."""
    wid = webhook_id or f"msg_{uuid.uuid4().hex}"
    return post(url, signed_headers(SECRET, wid, BODY, **kwargs))


def raw_request(path: str, host: str, headers: Mapping[str, str] | None = None, body: bytes = BODY) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_response(stream: Any) -> tuple[int, dict[str, str]]:
    """One Content-Length response from a socket file (no http.client buffering)."""
    status = int(stream.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    stream.read(int(headers.get("content-length", "0")))
    return status, headers


# --------------------------------------------------------------------------- signatures


def test_signed_delivery_is_counted(receiver: ReceiverProcess) -> None:
    key = new_key()
    status, _ = deliver(receiver.url("ok", key), "msg_counted", attempt=1)
    assert status == 200
    ep = receiver.endpoint(key)
    assert (ep["count"], ep["unique"], ep["duplicates"], ep["bad_signatures"]) == (1, 1, 0, 0)
    assert ep["statuses"] == {"200": 1}
    assert ep["attempts"] == {"1": 1}
    [row] = [d for d in receiver.deliveries() if d.endpoint == key]
    assert (row.webhook_id, row.count, row.ok) == ("msg_counted", 1, 1)
    assert row.first_2xx_ts is not None
    assert row.attempts == ("1",)
    assert row.idempotency_keys == ("msg_counted",)


def test_whsec_secrets_and_rotation_verify(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("ok", key)
    assert post(url, signed_headers(ROTATED, "msg_a", BODY))[0] == 200
    # The whsec_ form of the plain secret is the same key.
    assert post(url, signed_headers(as_standard_secret(SECRET), "msg_b", BODY))[0] == 200
    # During a rotation the sender signs with both keys; one matching is enough.
    assert post(url, signed_headers(["unknown-old-secret", SECRET], "msg_c", BODY))[0] == 200
    assert receiver.endpoint(key)["count"] == 3


def test_bad_signature_is_refused_with_401(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("ok", key)
    assert post(url, signed_headers("wrong-secret", "msg_1", BODY))[0] == 401
    assert post(url, signed_headers(SECRET, "msg_2", BODY), body=BODY + b" ")[0] == 401  # tampered
    stale = signed_headers(SECRET, "msg_3", BODY)
    stale["webhook-id"] = "msg_other"  # the id is part of the signed content
    assert post(url, stale)[0] == 401
    assert post(url, {"webhook-id": "msg_4"})[0] == 401  # unsigned
    ep = receiver.endpoint(key)
    assert (ep["bad_signatures"], ep["count"], ep["requests"]) == (4, 0, 4)
    assert ep["statuses"] == {"401": 4}
    assert not [d for d in receiver.deliveries() if d.endpoint == key]


# --------------------------------------------------------------------------- counting


def test_duplicates_are_counted_by_webhook_id(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("ok", key)
    for attempt in (1, 2, 3):
        assert deliver(url, "msg_dup", attempt=attempt)[0] == 200
    assert deliver(url, "msg_single")[0] == 200
    ep = receiver.endpoint(key)
    assert (ep["count"], ep["unique"], ep["duplicates"], ep["duplicates_2xx"]) == (4, 2, 2, 2)
    rows = {d.webhook_id: d for d in receiver.deliveries() if d.endpoint == key}
    assert (rows["msg_dup"].count, rows["msg_dup"].attempts) == (3, ("1", "2", "3"))
    assert rows["msg_single"].count == 1


def test_retries_after_errors_are_duplicates_but_not_2xx_duplicates(receiver: ReceiverProcess) -> None:
    key = new_key()
    receiver.set_profile(key, {"profile": "error", "error_status": 503})
    url = receiver.url("ok", key)
    assert deliver(url, "msg_retry", attempt=1)[0] == 503
    receiver.set_profile(key, None)
    assert deliver(url, "msg_retry", attempt=2)[0] == 200
    ep = receiver.endpoint(key)
    assert (ep["duplicates"], ep["duplicates_2xx"], ep["ok"]) == (1, 0, 1)
    assert ep["statuses"] == {"200": 1, "503": 1}


def test_idempotency_keys_are_recorded(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("ok", key)
    deliver(url, "msg_idem", idempotency_key="msg_idem")
    deliver(url, "msg_idem", idempotency_key="something-else", attempt=2)
    headers = signed_headers(SECRET, "msg_nokey", BODY)
    del headers["Idempotency-Key"]
    post(url, headers)
    ep = receiver.endpoint(key)
    assert (ep["idempotency_key_mismatch"], ep["idempotency_key_missing"]) == (1, 1)
    rows = {d.webhook_id: d for d in receiver.deliveries() if d.endpoint == key}
    assert rows["msg_idem"].idempotency_keys == ("msg_idem", "something-else")
    assert rows["msg_nokey"].idempotency_keys == ()


# --------------------------------------------------------------------------- concurrency


def hold_requests(receiver: ReceiverProcess, key: str, n: int) -> list[socket.socket]:
    """n connections, each with one request the /hang profile never answers."""
    held = []
    for i in range(n):
        sock = socket.create_connection((receiver.host, receiver.port), timeout=30)
        sock.sendall(raw_request(f"/hang/{key}", receiver.host, signed_headers(SECRET, f"msg_{i}", BODY)))
        held.append(sock)
    return held


def test_max_concurrency_is_exact_while_requests_are_held(receiver: ReceiverProcess) -> None:
    key, n = new_key(), 6
    held = hold_requests(receiver, key, n)
    try:
        # Nothing leaves a hung endpoint until its client does, so all n overlap.
        stats = receiver.wait_until(lambda s: s["endpoints"].get(key, {}).get("in_flight") == n)
        assert stats["endpoints"][key]["max_concurrency"] == n
    finally:
        for sock in held:
            sock.close()
    ep = receiver.wait_until(lambda s: s["endpoints"][key]["in_flight"] == 0)["endpoints"][key]
    assert ep["max_concurrency"] == n
    assert ep["statuses"] == {"0": n}  # never answered
    assert ep["ok"] == 0


def test_overlapping_slow_requests_raise_max_concurrency(receiver: ReceiverProcess) -> None:
    key, n = new_key(), 8
    url = receiver.url("latency", key, ms=400)
    barrier = threading.Barrier(n)
    statuses: list[int] = []

    def one(i: int) -> None:
        headers = signed_headers(SECRET, f"msg_{i}", BODY)
        barrier.wait()
        statuses.append(post(url, headers)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * n
    assert 2 <= receiver.endpoint(key)["max_concurrency"] <= n


# --------------------------------------------------------------------------- profiles


def test_error_profile_answers_its_status(receiver: ReceiverProcess) -> None:
    key = new_key()
    assert deliver(receiver.url("error", key, rate=1, status=500))[0] == 500
    assert deliver(receiver.url("error", key, rate=1, status=502, ms=5))[0] == 502
    assert deliver(receiver.url("error", key, rate=0))[0] == 200
    assert receiver.endpoint(key)["statuses"] == {"200": 1, "500": 1, "502": 1}


def test_error_rate_mixes_statuses(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("error", key, rate=0.5, status=500)
    statuses = {deliver(url)[0] for _ in range(100)}
    assert statuses == {200, 500}  # all 100 alike has probability 2**-99
    assert sum(receiver.endpoint(key)["statuses"].values()) == 100


def test_ratelimit_and_unavailable_send_retry_after(receiver: ReceiverProcess) -> None:
    status, headers = deliver(receiver.url("ratelimit", new_key(), retry_after=2))
    assert (status, headers["retry-after"]) == (429, "2")
    status, headers = deliver(receiver.url("unavailable", new_key(), retry_after=5))
    assert (status, headers["retry-after"]) == (503, "5")


def test_redirect_status_and_slow_profiles(receiver: ReceiverProcess) -> None:
    status, headers = deliver(receiver.url("redirect", new_key(), to="http://example.invalid/x", code=307))
    assert (status, headers["location"]) == (307, "http://example.invalid/x")
    assert deliver(receiver.url("status", new_key(), code=410))[0] == 410
    assert deliver(receiver.url("slow", new_key(), ms=50))[0] == 200
    assert deliver(receiver.url("latency", new_key(), median_ms=5, sigma=0.5))[0] == 200
    status, _ = deliver(receiver.url("ok", new_key(), body=100))
    assert status == 200


def test_lognormal_delay_given_by_median_and_p99() -> None:
    profile = build_profile("latency", {"median_ms": "120", "p99_ms": "2000"})
    rng = random.Random(3)
    draws = sorted(profile.delay(rng) for _ in range(40_000))
    assert draws[len(draws) // 2] == pytest.approx(0.120, rel=0.05)
    assert draws[int(len(draws) * 0.99)] == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError, match="p99_ms"):
        build_profile("latency", {"median_ms": "120", "p99_ms": "100"})
    with pytest.raises(ValueError, match="p99_ms"):
        build_profile("latency", {"p99_ms": "100"})


def test_the_url_names_the_p99(receiver: ReceiverProcess) -> None:
    key = new_key()
    assert deliver(receiver.url("latency", key, median_ms=2, p99=5))[0] == 200
    assert receiver.endpoint(key)["statuses"] == {"200": 1}


def test_drip_sends_the_answer_a_byte_at_a_time(receiver: ReceiverProcess) -> None:
    key = new_key()
    assert deliver(receiver.url("drip", key, drip=1))[0] == 200  # a fast drip still ends in a whole answer
    url = urlsplit(receiver.url("drip", key, drip=400))
    wid = f"msg_{uuid.uuid4().hex}"
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(raw_request(f"{url.path}?{url.query}", "x", signed_headers(SECRET, wid, BODY)))
        first = sock.recv(1024)
        got = bytearray(first)
        sock.settimeout(0.2)
        deadline = time.monotonic() + 1.0  # the whole answer would take ~15 s at 400 ms a byte
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got += sock.recv(1024)
    assert first == b"H"  # the first byte came alone
    assert b"HTTP/1.1 200 OK\r\n".startswith(bytes(got)) and b"\r\n\r\n" not in got  # a beginning, no more
    # The client left before the end: an answer never finished is counted as status 0, as for a hang.
    wait_until(lambda: receiver.endpoint(key)["statuses"].get("0") == 1, 15, message="the drip to notice")


def test_runtime_profile_flip(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("error", key, rate=1, status=500)
    assert deliver(url)[0] == 500
    receiver.set_profile(key, "ok")  # the endpoint comes back
    assert deliver(url)[0] == 200
    receiver.set_profile(key, {"profile": "error", "error_status": 503, "retry_after": "60"})
    status, headers = deliver(url)
    assert (status, headers["retry-after"]) == (503, "60")
    receiver.set_profile(key, None)  # back to what the URL says
    assert deliver(url)[0] == 500
    assert receiver.endpoint(key)["statuses"] == {"200": 1, "500": 2, "503": 1}


def test_invalid_runtime_profile_is_refused(receiver: ReceiverProcess) -> None:
    with pytest.raises(RuntimeError, match="400"):
        receiver.set_profile(new_key(), {"error_rate": 7})
    with pytest.raises(RuntimeError, match="400"):
        receiver.set_profile(new_key(), {"no_such_field": 1})
    with pytest.raises(RuntimeError, match="400"):  # header injection
        receiver.set_profile(new_key(), {"profile": "redirect", "location": "/x\r\nSet-Cookie: a=b"})


def test_profiles_file_and_unverified_mode() -> None:
    profiles = {"flaky": {"error_rate": 1, "error_status": 502, "retry_after": "9"}}
    with ReceiverProcess(profiles=profiles) as receiver:  # no secrets: nothing is verified
        status, headers = post(receiver.url("ok", "flaky"), {"webhook-id": "msg_1"})
        assert (status, headers["retry-after"]) == (502, "9")
        assert post(receiver.url("ok", "other"), {"webhook-id": "msg_1"})[0] == 200
        assert post(receiver.url("ok", "other"), {})[0] == 400  # still needs a webhook-id
        ep = receiver.endpoint("other")
        assert (ep["count"], ep["bad_requests"], ep["bad_signatures"]) == (1, 1, 0)


def test_a_bad_profiles_file_fails_the_start() -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        ReceiverProcess(profiles={"k": {"no_such_field": 1}}, startup_timeout=10).start()


# --------------------------------------------------------------------------- HTTP


def test_keep_alive_serves_many_requests_on_one_connection(receiver: ReceiverProcess) -> None:
    key = new_key()
    url = receiver.url("ok", key)
    connection = http.client.HTTPConnection(receiver.host, receiver.port, timeout=30)
    try:
        post(url, signed_headers(SECRET, "msg_0", BODY), connection=connection)
        first_socket = connection.sock
        for i in range(1, 5):
            assert post(url, signed_headers(SECRET, f"msg_{i}", BODY), connection=connection)[0] == 200
            assert connection.sock is first_socket  # not reconnected
    finally:
        connection.close()
    assert receiver.endpoint(key)["count"] == 5


def test_pipelined_requests_and_connection_close(receiver: ReceiverProcess) -> None:
    key = new_key()
    batch = b"".join(
        raw_request(f"/ok/{key}", receiver.host, signed_headers(SECRET, f"msg_{i}", BODY)) for i in range(3)
    )
    closing = raw_request(f"/ok/{key}", receiver.host, {**signed_headers(SECRET, "msg_3", BODY), "Connection": "close"})
    with socket.create_connection((receiver.host, receiver.port), timeout=30) as sock:
        sock.sendall(batch + b"\r\n" + closing)  # one write, and a stray CRLF (RFC 9112 2.2)
        stream = sock.makefile("rb")
        assert [read_response(stream)[0] for _ in range(3)] == [200, 200, 200]
        status, headers = read_response(stream)
        assert (status, headers.get("connection")) == (200, "close")
        assert stream.read() == b""  # and it did close
    assert receiver.endpoint(key)["count"] == 4


def test_bad_requests_and_unknown_routes_are_not_counted(receiver: ReceiverProcess) -> None:
    key = new_key()
    connection = http.client.HTTPConnection(receiver.host, receiver.port, timeout=30)
    try:
        cases = [("GET", f"/ok/{key}", 405), ("POST", f"/nope/{key}", 404), ("POST", f"/down/{key}", 404),
                 ("POST", "/ok", 404), ("POST", f"/latency/{key}?ms=abc", 400), ("GET", "/_nope", 404)]
        for method, path, expected in cases:
            connection.request(method, path, body=BODY if method == "POST" else None)
            response = connection.getresponse()
            response.read()
            assert (path, response.status) == (path, expected)
        connection.request("GET", "/_healthz")
        assert connection.getresponse().read() == b"ok\n"
    finally:
        connection.close()
    with socket.create_connection((receiver.host, receiver.port), timeout=30) as sock:
        sock.sendall(f"POST /ok/{key} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode())
        assert read_response(sock.makefile("rb"))[0] == 411
    assert key not in receiver.stats()["endpoints"]


def test_closed_port_url_refuses_connections() -> None:
    parts = urlsplit(closed_port_url("gone"))
    assert parts.path == "/down/gone"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((parts.hostname, parts.port), timeout=5)


# --------------------------------------------------------------------------- processes


def test_several_processes_merge_their_counts() -> None:
    with ReceiverProcess([SECRET], processes=2) as receiver:
        key = new_key()
        url = receiver.url("ok", key)
        for i in range(40):  # a fresh connection each time, so both processes serve
            assert deliver(url, f"msg_{i % 10}", attempt=i // 10 + 1)[0] == 200
        stats = receiver.stats()
        assert (stats["processes"], stats["total"]) == (2, 40)
        ep = stats["endpoints"][key]
        assert (ep["count"], ep["unique"], ep["duplicates"], ep["duplicates_2xx"]) == (40, 10, 30, 30)
        rows = [d for d in receiver.deliveries() if d.endpoint == key]
        assert sorted(d.webhook_id for d in rows) == sorted(f"msg_{i}" for i in range(10))
        assert {d.attempts for d in rows} == {("1", "2", "3", "4")}
        assert receiver.stats(fast=True)["endpoints"][key]["unique"] is None  # skipped merge


def test_several_processes_share_concurrency_profiles_and_reset() -> None:
    with ReceiverProcess([SECRET], processes=2) as receiver:
        key, n = new_key(), 6
        held = hold_requests(receiver, key, n)
        try:
            stats = receiver.wait_until(lambda s: s["endpoints"].get(key, {}).get("in_flight") == n)
            assert stats["endpoints"][key]["max_concurrency"] == n  # global, not per process
        finally:
            for sock in held:
                sock.close()
        flip = new_key()
        receiver.set_profile(flip, {"profile": "status", "status": 418})
        assert {deliver(receiver.url("ok", flip))[0] for _ in range(20)} == {418}
        receiver.reset()
        assert receiver.stats()["total"] == 0


def test_receiver_leaves_no_processes_behind() -> None:
    receiver = ReceiverProcess(processes=2)
    with pytest.raises(ZeroDivisionError), receiver:
        pids = [*receiver.stats()["pids"], receiver.pid]
        assert len(pids) == 3
        1 / 0  # noqa: B018 -- a failing test body
    assert not receiver.running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_importing_the_library_does_not_monkey_patch() -> None:
    from gevent import monkey

    assert not monkey.is_module_patched("socket")


# --------------------------------------------------------------------------- exporting the received ids


def test_received_ids_are_exported_on_request_and_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "ids.txt"
    with ReceiverProcess([SECRET], export_ids=path) as receiver:
        for wid in ("evt_2", "evt_1", "evt_2"):  # a duplicate is one id
            deliver(receiver.url("ok", "a"), wid)
        deliver(receiver.url("error", "b", rate=1), "evt_3")  # received, even if answered 500
        post(receiver.url("ok", "a"), {"webhook-id": "evt_forged"})  # no valid signature: not received
        assert receiver.export_ids() == 3
        assert path.read_text().splitlines() == ["evt_1", "evt_2", "evt_3"]
        deliver(receiver.url("ok", "c"), "evt_4")
    assert path.read_text().splitlines() == ["evt_1", "evt_2", "evt_3", "evt_4"]


def test_export_ids_needs_the_option() -> None:
    with ReceiverProcess([SECRET]) as receiver:
        with pytest.raises(RuntimeError, match="without export_ids"):
            receiver.export_ids()
        status, _ = post(f"{receiver.base_url}/_export_ids", {})
        assert status == 404


@pytest.mark.parametrize("processes", [1, 2])
def test_the_command_line_exports_ids_when_terminated(tmp_path: Path, processes: int) -> None:
    """``--export-ids`` as a user runs it: SIGTERM to the receiver (the supervisor
    with --processes 2, which then asks its children) writes the file."""
    ready, path = tmp_path / "ready.json", tmp_path / "ids.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "dispatcher_devtools.receiver", "--listen", "127.0.0.1:0", "--secret", SECRET,
               "--processes", str(processes), "--ready-file", str(ready), "--export-ids", str(path)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(ready.exists, timeout=20, message="the receiver to start")
        port = json.loads(ready.read_text())["port"]
        for n in range(6):  # several connections, so with two processes both may get some
            deliver(f"http://127.0.0.1:{port}/ok/k{n % 2}", f"evt_{n}")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert path.read_text().splitlines() == [f"evt_{n}" for n in range(6)]


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    """A throw-away CA and a receiver certificate for 127.0.0.1 and localhost."""
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / "receiver.pem", directory / "receiver.key"
    for blob in issued.cert_chain_pems:
        blob.write_to_path(str(cert), append=True)
    issued.private_key_pem.write_to_path(str(key))
    return ca, cert, key


@pytest.mark.parametrize("processes", [1, 2])
def test_tls_receiver_counts_a_delivery_from_a_client_trusting_its_ca(
        tls_files: tuple[trustme.CA, Path, Path], processes: int) -> None:
    ca, cert, key = tls_files
    with ReceiverProcess([SECRET], tls_cert=cert, tls_key=key, processes=processes) as receiver:
        url = receiver.url("ok", "tls")
        assert url.startswith("https://127.0.0.1:")
        trusting = ssl.create_default_context()
        ca.configure_trust(trusting)
        connection = http.client.HTTPSConnection(receiver.host, receiver.port, timeout=30, context=trusting)
        try:
            status, _ = post(url, signed_headers(SECRET, "evt_tls", BODY), connection=connection)
            assert connection.sock is not None and connection.sock.version() is not None  # really TLS
        finally:
            connection.close()
        assert status == 200
        assert receiver.endpoint("tls")["count"] == 1

        untrusting = ssl.create_default_context()  # the system's CAs only: ours is not among them
        refused = http.client.HTTPSConnection(receiver.host, receiver.port, timeout=30, context=untrusting)
        with pytest.raises(ssl.SSLCertVerificationError):
            post(url, signed_headers(SECRET, "evt_untrusted", BODY), connection=refused)
        refused.close()
        assert receiver.healthy()  # a failed handshake costs the receiver nothing
        assert receiver.stats()["total"] == 1


def test_tls_needs_both_the_certificate_and_the_key(tls_files: tuple[trustme.CA, Path, Path]) -> None:
    _, cert, _ = tls_files
    with pytest.raises(ValueError, match="go together"):
        ReceiverProcess(tls_cert=cert)


def test_tls_handshakes_are_counted_once_per_connection(tls_files: tuple[trustme.CA, Path, Path]) -> None:
    ca, cert, key = tls_files
    with ReceiverProcess([SECRET], tls_cert=cert, tls_key=key) as receiver:
        before = receiver.stats()["tls_handshakes"]  # control requests are TLS connections too
        trusting = ssl.create_default_context()
        ca.configure_trust(trusting)
        connection = http.client.HTTPSConnection(receiver.host, receiver.port, timeout=30, context=trusting)
        try:
            for n in range(3):  # one keep-alive connection, three requests
                status, _ = post(receiver.url("ok", "tls"), signed_headers(SECRET, f"evt_{n}", BODY),
                                 connection=connection)
                assert status == 200
        finally:
            connection.close()
        stats = receiver.stats()
    # The delivery connection and this stats request's own connection.
    assert stats["tls_handshakes"] - before == 2 and stats["tls_resumed"] == 0
    assert stats["total"] == 3


def test_help_shows_usage_and_options_before_the_package_notes() -> None:
    result = subprocess.run([sys.executable, "-m", "dispatcher_devtools.receiver", "--help"], capture_output=True,
                            text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("usage: python -m dispatcher_devtools.receiver")
    options = next(n for n, line in enumerate(lines) if line.strip().startswith("--listen"))
    # The notes (about 70 lines of the package docstring) used to come between the usage and the options.
    assert options < 25, result.stdout
    assert len(lines) > options + 40, "the package notes still follow the options"
