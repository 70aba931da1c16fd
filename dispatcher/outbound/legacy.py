"""The flag-off (legacy) path's transport: the engine's own urllib3 transport, for ordinary threads.

``WebhookSender.send`` runs in the producer's process, which is usually *not*
gevent-patched (API threads, background jobs).  The engine's transports bound
an attempt with one ``gevent.Timeout``, which only fires when the gevent hub
runs, i.e. never in blocking thread code.  So this module keeps everything
else the engine does -- the same ``Urllib3Transport`` (URL parsing, the
outbound policy checked on every resolved address, the pinned dial to the
checked IP, no redirects, no environment proxies, the capped read, the same
error classes) -- and swaps only the deadline mechanism:

* the attempt's deadline is kept per thread (a greenlet, once patched);
* every blocking socket call (connect, TLS handshake, send, recv) first sets
  the socket's timeout to the time *left*, and fails with ``TimeoutError`` once
  none is left.  A receiver trickling one byte a second is therefore cut off at
  the deadline, not after ``timeout`` per read.

geventhttpclient needs the gevent hub, so the legacy path always uses urllib3
whatever ``http.client`` says.

Names are not sent to ``getaddrinfo``, whose wait only the system resolver
bounds (10 s per name with two nameservers that never answer).
:class:`ThreadResolver` asks DNS the way the workers do (dnspython, pointed at
``http.dns_servers`` or the system's nameservers, ``/etc/hosts`` first), each
query bounded by the time left before the POST's deadline, so a POST fits its
deadline lookup included.  Answers are cached for their TTL and a failed lookup
(a timeout, SERVFAIL) for 10 s, so a black-holed name costs one deadline per
interval, not one per endpoint or per ``send()``.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any

from dispatcher.config import Config
from dispatcher.outbound.netguard import DnsError, OutboundPolicy
from dispatcher.outbound.resolver import DnsLookups
from dispatcher.outbound.transport import Transport, Urllib3Transport, tcp_dial

_state = threading.local()


def _time_left() -> float | None:
    """Seconds left before this thread's deadline (None outside an attempt); raises once it passed."""
    deadline: float | None = getattr(_state, "deadline", None)
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        # settimeout(0) would make the socket non-blocking instead of failing.
        raise TimeoutError("the legacy POST's total deadline passed")
    return left


class _Deadline:
    """Quacks like the ``gevent.Timeout`` the transport starts and closes around an attempt."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def start(self) -> None:
        _state.deadline = time.monotonic() + self._seconds

    def close(self) -> None:
        _state.deadline = None


class _DeadlineIO:
    """Arms the socket with the time left before each blocking call."""

    def _arm(self) -> None:
        left = _time_left()
        if left is not None:
            self.settimeout(left)  # type: ignore[attr-defined]

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def recv_into(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args: Any, **kwargs: Any) -> Any:
        # Plain sockets send in C without calling send(): arm once, and sendall
        # itself fails when the (armed) timeout passes.
        self._arm()
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _DeadlineSocket(_DeadlineIO, socket.socket):
    """A TCP socket whose blocking calls obey the thread's deadline."""


class _DeadlineSSLSocket(_DeadlineIO, ssl.SSLSocket):
    """The TLS counterpart; ``sendall`` loops over ``send``, which re-arms each time."""

    def do_handshake(self, *args: Any, **kwargs: Any) -> Any:
        self._arm()
        return super().do_handshake(*args, **kwargs)


def deadline_dial(ip: str, port: int, timeout: float) -> socket.socket:
    """The transport's dialer (a checked IP, never a name), bounded by the time left."""
    left = _time_left()
    return tcp_dial(ip, port, min(timeout, left) if left is not None else timeout, socket_class=_DeadlineSocket)


class ThreadResolver(DnsLookups):
    """Addresses of a name for ordinary threads, by this thread's deadline (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()

    def resolve(self, host: str, workspace: str | None = None) -> list[str]:
        name = host.lower().rstrip(".")
        if name in self._hosts:
            return list(self._hosts[name])
        with self._lock:
            entry = self._cached(name)
        if entry is None:
            _time_left()  # raises once the deadline has passed
            entry = self._lookup(name, until=getattr(_state, "deadline", None))
            with self._lock:
                self._remember(name, entry)
        if not entry.addresses:
            raise DnsError(f"{host} does not resolve ({entry.failure})")
        return list(entry.addresses)


class ThreadTransport(Urllib3Transport):
    """``Urllib3Transport`` with a per-thread total deadline instead of ``gevent.Timeout``."""

    def _new_deadline(self) -> Any:
        return _Deadline(self._timeout)

    @staticmethod
    def _make_ssl_context(ca_certs: str | None) -> ssl.SSLContext:
        context = Urllib3Transport._make_ssl_context(ca_certs)  # the engine's trust: system store + http.ca_file
        context.sslsocket_class = _DeadlineSSLSocket
        return context


def legacy_transport(config: Config) -> Transport:
    """The synchronous path's transport: the engine's outbound policy, read cap and nameservers,
    ``producer.legacy_timeout``."""
    http = config.http
    dns = ThreadResolver(http.dns_servers, timeout=http.dns_timeout, max_ttl=http.dns_max_ttl)
    return ThreadTransport(timeout=config.producer.legacy_timeout, policy=OutboundPolicy.from_config(http),
                           max_response_bytes=http.max_response_bytes, dialer=deadline_dial, maxsize=4,
                           ca_certs=http.ca_file, dns=dns)
