"""A plain in-process HTTP receiver that records every POST: for tests that need
the exact headers and body of what was sent, without the mock receiver's
processes and profiles."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple


class CapturedPost(NamedTuple):
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class CaptureServer:
    url: str
    captured: list[CapturedPost] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def posts(self, path: str) -> int:
        """How many POSTs arrived at ``path``."""
        with self.lock:
            return sum(1 for post in self.captured if post.path == path)

    def by_event(self) -> collections.Counter[tuple[str, str]]:
        """POSTs per (``webhook-id``, path): an endpoint per path, so >1 is a duplicate."""
        with self.lock:
            return collections.Counter((post.headers["webhook-id"], post.path) for post in self.captured)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    capture: CaptureServer

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.capture.lock:
            self.capture.captured.append(CapturedPost(self.path, dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def capture_server() -> Iterator[CaptureServer]:
    """A receiver on 127.0.0.1 that answers 200 to every POST and records it."""
    capture = CaptureServer(url="")
    handler = type("CaptureHandler", (_Handler,), {"capture": capture})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    capture.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield capture
    finally:
        server.shutdown()
        server.server_close()
