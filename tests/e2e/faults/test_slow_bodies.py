"""Trickled request bodies: a body has one deadline, an unread body is never
read after the answer, and a connection's lifetime is capped.

The server runs as the real API process (``dispatcher.runtime.api_main`` under gevent).
A client trickles a byte every ``TRICKLE`` seconds, well inside the per-read
timeout, so only a total deadline ends it.  Every wait is bounded by a client
socket timeout; nothing asserts on a measured duration.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dispatcher_devtools.kit import query
from tests.support.faults import ApiServer, create_token

pytestmark = pytest.mark.timeout(120)

TRICKLE = 0.3
# Far beyond every deadline the tests configure (2 s and 3 s): a server that keeps
# reading a trickled body is still reading when this wait ends.
GIVE_UP = 12.0


@pytest.fixture
def api_config(db, write_config):  # type: ignore[no-untyped-def]
    def make(**api: Any) -> Path:
        return write_config(db, api={"listen": "127.0.0.1:0", "idle_timeout": "2s", "read_timeout": "2s",
                                     "keepalive_timeout": "2s", **api})

    return make


@contextmanager
def _trickling(sock: socket.socket) -> Iterator[None]:
    """Send one body byte every TRICKLE seconds until the block ends or the server closes."""
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(TRICKLE):
            try:
                sock.send(b"x")
            except OSError:
                return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _answer_then_close(sock: socket.socket) -> tuple[int | None, bool]:
    """The status line's code (None if none came) and whether the server closed the connection,
    reading until EOF, a reset, or GIVE_UP seconds of the socket timeout."""
    sock.settimeout(GIVE_UP)
    data = b""
    closed = False
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    return status, closed


def _post_head(port: int, path: str, length: int, token: str | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())
    return sock


def test_an_unread_body_is_not_read_after_the_answer(api_config) -> None:
    """No token: the API answers 401 at once, then closes instead of reading the declared 100 MB."""
    with ApiServer(api_config()) as api, _post_head(api.port, "/v2/webhooks/endpoints", 100 * 2**20) as sock:
        with _trickling(sock):
            status, closed = _answer_then_close(sock)
        assert status == 401
        assert closed, "the server kept the connection to read a body it does not need"


def test_a_trickled_body_has_one_deadline(db, api_config) -> None:
    """A token holder whose body trickles in gets 408 once the body's deadline passes, and is closed."""
    config = api_config()
    query(db.dsn, "INSERT INTO workspaces (id, secret) VALUES ('trickle', 'whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=')")
    token = create_token(config, "trickle")
    with ApiServer(config) as api, _post_head(api.port, "/v2/webhooks/endpoints", 60000, token) as sock:
        with _trickling(sock):
            status, closed = _answer_then_close(sock)
        assert status == 408
        assert closed


def _one_answer(sock: socket.socket) -> bytes:
    """One whole answer of a kept-alive connection (its head and Content-Length bytes); b"" on EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        body += chunk
    return data


def test_a_kept_alive_connection_has_a_capped_lifetime(api_config) -> None:
    """A client that keeps one connection busy with quick requests is closed once its lifetime is over."""
    with ApiServer(api_config(connection_lifetime="3s")) as api:
        sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
        served = 0
        closed = False
        give_up = time.monotonic() + GIVE_UP
        with sock:
            while not closed and time.monotonic() < give_up:
                try:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = _one_answer(sock)
                except (ConnectionResetError, BrokenPipeError):
                    answer = b""
                if not answer:
                    closed = True
                    break
                assert answer.startswith(b"HTTP/1.1 200")
                served += 1
                time.sleep(TRICKLE)
        assert served > 0
        assert closed, f"the connection served {served} requests and was never closed"
