"""The API's HTTP server: gevent's WSGIServer with the bounds a hostile client needs.

gevent's server on its own waits forever for a request that never finishes
(slowloris) and, with a fixed greenlet pool, 1,000 such connections stopped
every other caller, ``/healthz`` included.  Here:

* a new connection must send its first byte within ``api.idle_timeout``, and a
  kept-alive one within ``api.keepalive_timeout`` of its last answer;
* once a request has started, its whole head (request line and headers) must
  arrive within ``api.read_timeout`` -- one deadline, so trickling a byte at a
  time does not extend it;
* its body must arrive within ``api.read_timeout`` of the head's end -- one
  deadline again; past it the body's read fails as a timeout (408);
* a body the application left unread is never read after the answer (a
  client could trickle it for ever): the connection is closed instead;
* every socket write waits at most ``api.read_timeout`` per operation;
* a connection serves no new request once it is ``api.connection_lifetime``
  old, so no client keeps one slot for good;
* at most ``api.max_connections`` connections are served at once; past that,
  new ones wait in the listen backlog, and the timeouts above free slots.

A held connection costs a greenlet and a descriptor, never a database
connection: resources take one only for their queries (``api/resources/``).

Why not gunicorn's gevent worker: it has no deadline for a request head either
(its documentation asks for a buffering proxy in front), so it would not close
a slowloris connection; it would add a second process model beside the
supervisor's for no gain here.

This module imports gevent: only ``dispatcher.runtime.api_main`` imports it, after its patch.
"""

from __future__ import annotations

import logging
import resource
import socket
import time
from dataclasses import dataclass
from typing import Any

import gevent
from gevent.pool import Pool
from gevent.pywsgi import Input, WSGIHandler, WSGIServer

from dispatcher.config import ApiConfig

log = logging.getLogger("dispatcher.api")
# Descriptors the process needs beside its client connections (database pool, logs, listener).
_SPARE_DESCRIPTORS = 256


@dataclass(frozen=True, slots=True)
class ClientLimits:
    idle_timeout: float
    read_timeout: float
    keepalive_timeout: float
    max_connections: int
    connection_lifetime: float

    @classmethod
    def from_config(cls, api: ApiConfig) -> ClientLimits:
        return cls(api.idle_timeout, api.read_timeout, api.keepalive_timeout, api.max_connections,
                   api.connection_lifetime)


class _SlowHead(Exception):
    """The request head did not arrive within its deadline."""


class BoundedInput(Input):
    """A request body whose reads all end by one deadline (monotonic clock), and which is never
    drained after the answer: the handler closes the connection instead."""

    __slots__ = ("deadline",)

    def __init__(self, unbounded: Input, deadline: float) -> None:
        super().__init__(unbounded.rfile, unbounded.content_length, socket=unbounded.socket,
                         chunked_input=unbounded.chunked_input)
        self.deadline = deadline

    def read(self, length: int | None = None) -> bytes:
        with self._bounded():
            data: bytes = super().read(length)
        return data

    def readline(self, size: int | None = None) -> bytes:
        with self._bounded():
            data: bytes = super().readline(size)
        return data

    def _bounded(self) -> gevent.Timeout:
        # A TimeoutError, as a per-read socket timeout raises: the application answers 408.
        return gevent.Timeout(max(0.0, self.deadline - time.monotonic()),
                              TimeoutError("the request body did not arrive in time"))

    def _discard(self) -> None:
        """Reading what the application left could take as long as the client likes: never."""

    def unread(self) -> bool:
        """True while some of the body may still be on the wire (a chunked body: always)."""
        return bool(self.chunked_input) or self.position < (self.content_length or 0)


class BoundedHandler(WSGIHandler):
    """A WSGIHandler whose waits on the client are all bounded (see the module docstring)."""

    server: BoundedServer
    _served = 0
    _born = 0.0
    _head_deadline: gevent.Timeout | None = None
    wsgi_input: Input | None

    def handle_one_request(self) -> Any:
        limits = self.server.limits
        if not self._served:
            self._born = time.monotonic()
        elif time.monotonic() - self._born >= limits.connection_lifetime:
            return None
        if not self._wait_for_first_byte(limits.keepalive_timeout if self._served else limits.idle_timeout):
            return None
        self._head_deadline = gevent.Timeout(limits.read_timeout, _SlowHead)
        self._head_deadline.start()
        try:
            return super().handle_one_request()
        except _SlowHead:
            log.debug("closing a connection whose request head took longer than %gs", limits.read_timeout)
            return None
        finally:
            self._head_deadline.close()
            self._served += 1

    def _wait_for_first_byte(self, wait: float) -> bool:
        """True once a byte of the next request is here; False (close) on silence, EOF or error."""
        try:
            self.socket.settimeout(wait)
            ready = bool(self.rfile.peek(1))  # returns at once if a pipelined request is buffered
            self.socket.settimeout(self.server.limits.read_timeout)
            return ready
        except OSError:  # includes the timeout: the client stayed silent
            return False

    def read_request(self, raw_requestline: str) -> Any:
        try:
            return super().read_request(raw_requestline)
        finally:
            # The head is in: the application (and the body it reads) runs
            # under the per-read socket timeout, not under the head deadline.
            if self._head_deadline is not None:
                self._head_deadline.close()

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environ()
        # An upgrade's wsgi.input is the raw socket file, which is left as it is.
        if self.wsgi_input is not None and environ.get("wsgi.input") is self.wsgi_input:
            self.wsgi_input = BoundedInput(self.wsgi_input, time.monotonic() + self.server.limits.read_timeout)
            environ["wsgi.input"] = self.wsgi_input
        return environ

    def handle_one_response(self) -> Any:
        try:
            return super().handle_one_response()
        finally:
            if isinstance(self.wsgi_input, BoundedInput) and self.wsgi_input.unread():
                self.close_connection = True


class BoundedServer(WSGIServer):
    handler_class = BoundedHandler

    def __init__(self, listener: tuple[str, int], application: Any, limits: ClientLimits, **kwargs: Any) -> None:
        self.limits = limits
        super().__init__(listener, application, spawn=Pool(limits.max_connections), **kwargs)

    def handle(self, sock: socket.socket, address: Any) -> None:
        sock.settimeout(self.limits.read_timeout)
        super().handle(sock, address)


def ensure_descriptors(max_connections: int) -> int:
    """Raise the soft descriptor limit so ``max_connections`` fit; returns the connections that do fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + _SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitting = max(1, soft - _SPARE_DESCRIPTORS)
        log.warning("api.max_connections %d does not fit the descriptor limit %d; serving at most %d",
                    max_connections, soft, fitting)
        return fitting
    return max_connections
