"""The receiver's own HTTP/1.1 wire code: a lean request parser and cached
response bytes.  It is hand-written (not http.server) because the benchmarks
need the receiver to outrun the dispatcher by a wide margin."""

from __future__ import annotations

import socket
from collections.abc import Callable
from functools import lru_cache
from http import HTTPStatus
from typing import Final

from dispatcher_devtools.receiver.profiles import Profile

MAX_HEAD: Final = 64 * 1024
MAX_BODY: Final = 16 * 1024 * 1024
RECV_SIZE: Final = 64 * 1024

class HttpError(Exception):
    def __init__(self, status: int, close: bool = False) -> None:
        super().__init__(status)
        self.status = status
        self.close = close


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


@lru_cache(maxsize=4096)
def response(status: int, profile: Profile | None, close: bool) -> bytes:
    """The full answer bytes; cached because a run uses only a handful of shapes."""
    lines = [f"HTTP/1.1 {status} {_reason(status)}"]
    body = b""
    if profile is not None:
        if profile.retry_after is not None and not 200 <= status < 300:
            lines.append(f"Retry-After: {profile.retry_after}")
        if profile.location is not None:
            lines.append(f"Location: {profile.location}")
        body = b"x" * profile.body_bytes
    lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def payload_response(status: int, body: bytes, content_type: str, close: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode("latin-1") + body


Request = tuple[bytes, bytes, dict[bytes, bytes], bytes, bool]


def _read_head(sock: socket.socket, buf: bytearray) -> bytes | None:
    """The next request head (without the blank line), or None at a clean EOF."""
    start = 0
    while True:
        while buf[:2] == b"\r\n":  # stray CRLFs between requests are allowed (RFC 9112 2.2)
            del buf[:2]
        end = buf.find(b"\r\n\r\n", start)
        if end >= 0:
            head = bytes(buf[:end])
            del buf[:end + 4]
            return head
        if len(buf) > MAX_HEAD:
            raise HttpError(431, close=True)
        start = max(0, len(buf) - 3)
        chunk = sock.recv(RECV_SIZE)
        if not chunk:
            return None
        buf += chunk


def _read_body(sock: socket.socket, buf: bytearray, length: int) -> bytes | None:
    while len(buf) < length:
        chunk = sock.recv(max(RECV_SIZE, length - len(buf)))
        if not chunk:
            return None
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return body


def read_request(sock: socket.socket, buf: bytearray) -> Request | None:
    """One request as (method, target, headers, body, keep_alive); None at EOF."""
    head = _read_head(sock, buf)
    if head is None:
        return None
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise HttpError(400, close=True)
    method, target, version = parts
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError(400, close=True)
        headers[name.lower()] = value.strip()
    if b"transfer-encoding" in headers:
        raise HttpError(411, close=True)  # only Content-Length bodies are supported
    try:
        length = int(headers.get(b"content-length", b"0"))
    except ValueError:
        raise HttpError(400, close=True) from None
    if not 0 <= length <= MAX_BODY:
        raise HttpError(413 if length > 0 else 400, close=True)
    if length and headers.get(b"expect", b"").lower() == b"100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = _read_body(sock, buf, length) if length else b""
    if body is None:
        return None
    keep = version == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != b"close"
    return method, target, headers, body, keep


def send_fast(sock: socket.socket, data: bytes) -> None:
    """``sendall`` for the hot path: gevent's sendall costs an extra getsockopt
    syscall per call, and a small answer nearly always goes out in one send."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def drip(sock: socket.socket, data: bytes, interval: float, sleep: Callable[[float], None]) -> None:
    """Send ``data`` one byte per ``interval`` seconds: a receiver that answers, but slowly
    enough that only the client's deadline for the whole answer ends the wait."""
    for index in range(len(data)):
        if index:
            sleep(interval)
        sock.sendall(data[index:index + 1])


def hold_until_closed(sock: socket.socket) -> None:
    """Swallow input until the client gives up: what a hung endpoint looks like."""
    try:
        while sock.recv(RECV_SIZE):
            pass
    except OSError:
        pass

