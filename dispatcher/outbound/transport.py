"""The one small interface between the sender and an HTTP client, and its two implementations.

``Transport.post(url, headers, body)`` makes one attempt and never raises for a
network, TLS, DNS, policy or protocol problem: the outcome is a
:class:`TransportResult` whose ``error`` names the class of failure.

How an attempt runs (both implementations):

1. **Parse** the URL with :func:`dispatcher.outbound.netguard.parse_target` (cached per
   URL string: endpoint URLs repeat and the parse is a pure function).
2. **Resolve and check.**  The name is resolved once and every address must
   pass the outbound policy (:func:`dispatcher.outbound.netguard.resolve_checked`).
3. **Dial the checked address.**  The TCP connection goes to the IP we checked,
   never to the name, so nothing re-resolves between check and connect (DNS
   rebinding).  TLS SNI and certificate verification use the original host name
   and the Host header is ``host[:port]``.  If the connect itself fails (refused,
   unreachable) the next checked address is tried -- nothing was sent yet, so
   this is safe for a POST.
4. **Bounded read.**  No redirects are followed (a 3xx is a result), no
   content is decoded (``Accept-Encoding: identity``; a gzip bomb is just
   bytes), and at most ``max_response_bytes`` of the body are read.  A longer
   body is not drained: that connection is closed, not returned to the pool
   (geventhttpclient may keep it when the whole message had already arrived in
   one read: nothing is left unread on it then).

**Deadline.**  ``timeout`` is a total deadline from DNS through the last body
byte, enforced with one ``gevent.Timeout`` around the attempt, so a receiver
trickling one byte a second is cut off on time (per-socket timeouts would let it
live forever).  This requires the gevent-monkey-patched process the workers run
in; socket timeouts are set to the same value only as a backstop (the
geventhttpclient transport clears a cooperative socket's timeout once it is
connected: the deadline bounds every wait, and a socket timeout would arm a
timer of its own for each one).  A connection whose attempt timed out or failed
is closed, never reused.

**Address cache (the rebinding choice).**  Resolving on every attempt costs a
trip to the resolver's thread pool, so checked answers are cached per host for
``dns_cache_ttl`` seconds (default 5; 0 disables).  This is still rebinding
safe: what is cached is the list of addresses that *passed* the policy, and we
only ever dial addresses from it.  If the name later flips to 127.0.0.1 the next
resolution is refused.  Failures (DNS errors, refused names) are not cached.
In the workers a ``dns`` resolver (``dispatcher/outbound/resolver.py``: bounded,
TTL-cached, one lookup per name, a per-workspace cap) answers names instead
of getaddrinfo; its answers are checked on every attempt, so this cache is
not used then.

**Pools.**  Keep-alive pools are keyed by ``(scheme, host, port, ip)``, so a
connection is only reused for the same name *and* the same checked address.
Each pool keeps up to ``maxsize`` idle connections; it does not block when more
requests are in flight (many endpoints can share one host), the extra
connections are simply closed afterwards.  At most ``max_hosts`` pools are kept
(least recently used evicted) and a pool unused for ``pool_idle_timeout``
seconds is closed, which bounds open file descriptors to roughly
``max_hosts * maxsize``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import socket
import ssl
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from http.client import BadStatusLine, HTTPException, IncompleteRead, LineTooLong, RemoteDisconnected
from typing import Any, Generic, Literal, Protocol, TypeVar

import gevent
import gevent.socket
import urllib3
from gevent import monkey
from geventhttpclient.connectionpool import ConnectionPool as _GhcConnectionPool
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError, HTTPSocketPoolResponse
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import InvalidChunkLength
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from dispatcher.outbound.netguard import (
    BlockedURL,
    DnsError,
    InvalidURL,
    OutboundError,
    OutboundPolicy,
    Resolver,
    Target,
    check_addresses,
    parse_target,
    resolve_checked,
)
from dispatcher.redact import scrub
from dispatcher.rules.attempt import ErrorClass, TransportResult

__all__ = [
    "Dialer",
    "ErrorClass",
    "GeventHttpClientTransport",
    "Transport",
    "TransportResult",
    "Urllib3Transport",
    "make_transport",
    "tcp_dial",
]

log = logging.getLogger(__name__)

class Transport(Protocol):
    def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> TransportResult:
        ...

    def close(self) -> None: ...


class NameResolver(Protocol):
    """Addresses of a host name, or DnsError (``dispatcher.outbound.resolver.DnsResolver``)."""

    def resolve(self, host: str, workspace: str | None = None) -> list[str]: ...


#: Connects a TCP socket to ``(ip, port)`` within ``timeout`` seconds.
Dialer = Callable[[str, int, float], socket.socket]


def tcp_dial(ip: str, port: int, timeout: float, socket_class: type[socket.socket] | None = None) -> socket.socket:
    """The default dialer: a plain TCP connect to an address (never a name).

    ``socket`` is looked up at call time so the monkey-patched cooperative socket
    is used in the workers.  No ``create_connection``: under gevent it would send
    even a numeric address through the resolver thread pool.  ``socket_class``
    lets the flag-off producer path (``dispatcher.outbound.legacy``) dial a socket that
    enforces its deadline.
    """
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = (socket_class or socket.socket)(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((ip, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


# --------------------------------------------------------------------------- internals shared by both
class _ConnectFailed(Exception):
    """The TCP connect to one checked address failed (nothing was sent)."""

    def __init__(self, ip: str, cause: OSError) -> None:
        super().__init__(ip, cause)
        self.ip = ip
        self.cause = cause


class _BadRequestHeader(Exception):
    """A caller header that would corrupt the request (CR/LF, bad name)."""


# Headers the transport owns: framing and identity must match what we actually send.
_OWNED_HEADERS = frozenset({"host", "accept-encoding", "content-length", "transfer-encoding", "connection"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# Bound on status line + headers for the geventhttpclient parser (http.client
# already limits lines to 64 KiB and headers to 100).
_MAX_HEAD_BYTES = 64 * 1024


def _values_ok(values: Iterable[str]) -> bool:
    """True when every value passes ``_FIELD_VALUE``: checked in one go."""
    joined = " ".join(values)  # a space is valid in a value: the values pass iff the joined text does
    # Printable ASCII (the usual case) passes; anything else gets the full rule.
    return (joined.isascii() and joined.isprintable()) or _FIELD_VALUE.fullmatch(joined) is not None


def _check_headers(headers: dict[str, str]) -> frozenset[str]:
    """Check each caller header in order; the names to keep (those the transport does not own)."""
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise _BadRequestHeader("invalid request header name")
        if not _FIELD_VALUE.fullmatch(value):
            raise _BadRequestHeader(f"invalid value for request header {name}")
    return frozenset(name for name in headers if name.lower() not in _OWNED_HEADERS)


def _dial(dialer: Dialer, ip: str, port: int, timeout: float) -> socket.socket:
    try:
        return dialer(ip, port, timeout)
    except TimeoutError:
        raise
    except OSError as exc:
        raise _ConnectFailed(ip, exc) from exc


def _read_capped(read: Callable[[int], bytes], cap: int) -> tuple[bytes, bool]:
    """Read at most ``cap`` body bytes; True if the body ended within the cap."""
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = read(cap + 1 - got)  # one byte past the cap tells "longer" from "exactly cap"
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)[:cap], False


def _close_quietly(sock: Any) -> None:
    # Closing a broken socket may fail; it is gone either way.
    with contextlib.suppress(Exception):
        sock.close()


def _original_lock() -> threading.Lock:
    lock_class: Callable[[], threading.Lock] = monkey.get_original("threading", "Lock")
    return lock_class()


# select.poll as the interpreter has it: gevent's patched select module has a cooperative
# (and ten times dearer) stand-in, and an idle socket is checked without waiting anyway.
_poll: Callable[[], Any] = monkey.get_original("select", "poll")


def _idle_socket_alive(sock: Any) -> bool:
    """True if a pooled keep-alive socket still looks usable: open, and nothing to read.

    An idle HTTP/1.1 connection has nothing to say; readable means the peer closed it
    (EOF), reset it, or sent bytes we did not ask for -- none of which may be reused.
    One poll(2) with a zero timeout on its descriptor (TLS sockets included), where
    geventhttpclient's own check runs gevent's cooperative ``select()`` per reuse.
    """
    try:
        fd = sock.fileno()
        if fd < 0:
            return False
        poller = _poll()
        poller.register(fd, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


_P = TypeVar("_P")
_PoolKey = tuple[str, str, int, str]  # scheme, host, port, ip


class _PoolCache(Generic[_P]):
    """LRU of connection pools with an idle timeout; see the module docstring."""

    def __init__(self, max_pools: int, idle_timeout: float, close: Callable[[_P], None]) -> None:
        self._max = max_pools
        self._idle = idle_timeout
        self._close = close
        self._pools: OrderedDict[_PoolKey, tuple[_P, float]] = OrderedDict()
        # The interpreter's own lock, also in a patched worker: it is held without I/O, so
        # no greenlet ever switches while holding it, and it costs half of gevent's lock
        # (taken once per request).  In a threaded process it is threading.Lock itself.
        self._lock = _original_lock()
        # Until then no pool can be idle for too long: the oldest one's last use plus the
        # idle timeout, as of the last sweep (pools used since are younger still).
        self._sweep_at = float("-inf")

    def get(self, key: _PoolKey, factory: Callable[[], _P]) -> _P:
        now = time.monotonic()
        with self._lock:
            entry = self._pools.get(key)
            if entry is None:
                pool = factory()
            else:
                pool = entry[0]
                self._pools.move_to_end(key)
            self._pools[key] = (pool, now)
            if now <= self._sweep_at and len(self._pools) <= self._max:
                return pool
            evicted = self._sweep(now)
        for old in evicted:  # closing may touch sockets: outside the lock
            self._close(old)
        return pool

    def _sweep(self, now: float) -> list[_P]:
        """Take out pools past the size or the idle limit; the caller holds the lock."""
        evicted: list[_P] = []
        # Least recently used first: stop at the first pool we may keep.
        while self._pools:
            oldest_key, (oldest, used) = next(iter(self._pools.items()))
            if len(self._pools) <= self._max and now - used <= self._idle:
                self._sweep_at = used + self._idle
                break
            del self._pools[oldest_key]
            evicted.append(oldest)
        return evicted

    def __len__(self) -> int:
        return len(self._pools)

    def close_all(self) -> None:
        with self._lock:
            pools = [p for p, _ in self._pools.values()]
            self._pools.clear()
        for pool in pools:
            self._close(pool)


class _AddressCache:
    """host -> addresses that passed the policy, for a short TTL (see module docstring)."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._entries: dict[str, tuple[float, list[str]]] = {}

    def get(self, host: str) -> list[str] | None:
        entry = self._entries.get(host)
        if entry is not None and entry[0] > time.monotonic():
            return entry[1]
        return None

    def put(self, host: str, addresses: list[str]) -> None:
        if self._ttl <= 0:
            return
        self._entries.pop(host, None)  # re-insert so dict order stays oldest-first
        while len(self._entries) >= self._max:
            self._entries.pop(next(iter(self._entries)), None)
        self._entries[host] = (time.monotonic() + self._ttl, addresses)


# --------------------------------------------------------------------------- error classification
def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: explicit causes, urllib3's ``reason``/args, implicit context."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        inner = [current.__cause__, getattr(current, "reason", None), *current.args]
        if current.__cause__ is None and not current.__suppress_context__:
            inner.append(current.__context__)
        todo.extend(e for e in inner if isinstance(e, BaseException))


_CONNECTION_DETAILS: tuple[tuple[type[BaseException], str], ...] = (
    (ConnectionRefusedError, "connection refused"),
    (RemoteDisconnected, "connection closed before the response"),
    (HTTPConnectionClosed, "connection closed before the response"),
    (ConnectionResetError, "connection reset by peer"),
    (BrokenPipeError, "connection closed while sending"),
    (ConnectionAbortedError, "connection aborted"),
)


def _find(chain: list[BaseException], kind: type[BaseException] | tuple[type[BaseException], ...]) -> Any:
    return next((e for e in chain if isinstance(e, kind)), None)


def _classify(exc: BaseException) -> tuple[ErrorClass, str]:
    """Map whatever an HTTP library raised to (error class, short detail).

    Details are fixed phrases or library reason codes: never the peer's bytes
    (a BadStatusLine carries the line it choked on) and never the URL.
    """
    chain = list(_causes(exc))
    if (cert := _find(chain, ssl.SSLCertVerificationError)) is not None:
        return "tls", f"certificate verify failed: {cert.verify_message or cert.reason}"
    if _find(chain, (TimeoutError, Urllib3TimeoutError)) is not None:
        return "timeout", "socket timed out"
    if (failed := _find(chain, _ConnectFailed)) is not None:
        return "connection", f"connect to {failed.ip} failed: {_os_reason(failed.cause)}"
    for kind, detail in _CONNECTION_DETAILS:
        if _find(chain, kind) is not None:
            return "connection", detail
    if _find(chain, InvalidChunkLength) is not None:
        return "protocol", "malformed chunked body"
    if _find(chain, IncompleteRead) is not None:
        return "connection", "connection closed mid-response"
    if (tls := _find(chain, ssl.SSLError)) is not None:
        return "tls", f"TLS error: {tls.reason or type(tls).__name__}"
    return _classify_protocol(chain)


def _classify_protocol(chain: list[BaseException]) -> tuple[ErrorClass, str]:
    if (parse := _find(chain, HTTPParseError)) is not None:
        # llhttp errors are (static reason, code); geventhttpclient's own are plain messages.
        reason = parse.args[0] if parse.args and isinstance(parse.args[0], str) else type(parse).__name__
        if reason.startswith(("connection closed", "Incomplete response")):  # early EOF
            return "connection", "connection closed mid-response"
        return "protocol", f"malformed response: {reason[:80]}"
    if _find(chain, LineTooLong) is not None:
        return "protocol", "response line or header too long"
    if _find(chain, BadStatusLine) is not None:
        return "protocol", "malformed status line"
    if (http_error := _find(chain, HTTPException)) is not None:
        if "more than" in str(http_error):  # http.client: "got more than 100 headers"
            return "protocol", "too many response headers"
        return "protocol", f"malformed response ({type(http_error).__name__})"
    if (os_error := _find(chain, OSError)) is not None:
        return "connection", _os_reason(os_error)
    if _find(chain, urllib3.exceptions.ProtocolError) is not None:
        return "connection", "connection broken"
    # The traceback is scrubbed: an HTTP library's message may quote the URL
    # (webhook URLs carry tokens) or bytes the receiver sent.
    trace = "".join(traceback.format_exception(chain[0]))
    log.warning("unclassified transport error\n%s", scrub(trace).rstrip())
    return "connection", f"unexpected error ({type(chain[0]).__name__})"


def _os_reason(exc: OSError) -> str:
    for kind, detail in _CONNECTION_DETAILS:
        if isinstance(exc, kind):
            return detail
    return exc.strerror or type(exc).__name__


# --------------------------------------------------------------------------- the common driver
class _BaseTransport:
    """Parse, resolve, check, dial, deadline and error mapping; subclasses do one exchange."""

    def __init__(
        self,
        *,
        timeout: float,
        policy: OutboundPolicy,
        max_response_bytes: int = 65536,
        resolver: Resolver | None = None,
        dialer: Dialer | None = None,
        ca_certs: str | None = None,
        max_hosts: int = 1000,
        maxsize: int = 8,
        dns_cache_ttl: float = 5.0,
        pool_idle_timeout: float = 60.0,
        dns: NameResolver | None = None,
    ) -> None:
        if timeout <= 0 or max_response_bytes < 0 or max_hosts < 1 or maxsize < 1:
            raise ValueError("timeout, max_hosts and maxsize must be positive, max_response_bytes >= 0")
        self._timeout = float(timeout)
        self._policy = policy
        self._cap = max_response_bytes
        self._resolver = resolver  # None: socket.getaddrinfo, looked up per call (patched)
        # The bounded, caching resolver of the workers (dispatcher/outbound/resolver.py); when set,
        # it answers names instead of getaddrinfo and keeps its own TTL cache.
        self._dns = dns
        self._dialer: Dialer = dialer or tcp_dial
        self._maxsize = maxsize
        self._ssl_context = self._make_ssl_context(ca_certs)
        self._addresses = _AddressCache(dns_cache_ttl, max_entries=max(4 * max_hosts, 1024))
        self._targets: dict[str, Target] = {}
        # Sets of request header names already checked -> the names to keep (_wire_headers).
        self._checked_names: dict[tuple[str, ...], frozenset[str]] = {}
        self._pools: _PoolCache[Any] = _PoolCache(max_hosts, pool_idle_timeout, self._close_pool)

    @staticmethod
    def _make_ssl_context(ca_certs: str | None) -> ssl.SSLContext:
        # One context for all pools: loading the CA bundle costs milliseconds.
        # Default verification: CERT_REQUIRED, check_hostname, system CA store.
        context = ssl.create_default_context()
        if ca_certs is not None:
            # In addition to the system store (``http.ca_file``): create_default_context(cafile=...)
            # would load the bundle *instead* of it, and every public endpoint would then fail.
            context.load_verify_locations(cafile=ca_certs)
        return context

    def post(self, url: str, headers: dict[str, str], body: bytes, workspace: str | None = None) -> TransportResult:
        """One attempt; ``workspace`` is whose name lookups this one counts against."""
        started = time.monotonic()
        # A BaseException, so no library's "except Exception" can swallow it; a
        # timeout that is not ours (the caller's own deadline) propagates.
        deadline = self._new_deadline()
        deadline.start()
        try:
            status, retry_after, data = self._attempt(url, headers, body, workspace)
        except gevent.Timeout as exc:
            if exc is not deadline:
                raise
            return self._failed("timeout", f"no complete response within {self._timeout:g}s", started)
        except BlockedURL as exc:
            return self._refused("blocked", exc, started)
        except InvalidURL as exc:
            return self._failed("invalid_url", exc.public, started)
        except DnsError as exc:
            return self._refused("dns", exc, started)
        except _BadRequestHeader as exc:
            return self._failed("protocol", str(exc), started)
        except Exception as exc:  # post() reports, it never raises
            return self._failed(*_classify(exc), started)
        finally:
            deadline.close()
            # A deadline that fired holds its traceback, which holds this frame, which holds the
            # deadline: a cycle of every frame down to the socket wait, with what they held, left
            # for the collector.  Dropping the name frees it all now (runtime/heap.py).
            del deadline
        return TransportResult(status, data, None, "", retry_after, time.monotonic() - started)

    def _new_deadline(self) -> Any:
        """The attempt's total deadline: a ``gevent.Timeout`` (start/close); threads: outbound/legacy.py."""
        return gevent.Timeout(self._timeout)

    @classmethod
    def _refused(cls, error: ErrorClass, exc: OutboundError, started: float) -> TransportResult:
        """The customer's generic reason in the result; the operator's detail (name, address) in the log."""
        log.info("outbound %s: %s", error, exc)
        return cls._failed(error, exc.public, started)

    @staticmethod
    def _failed(error: ErrorClass, detail: str, started: float) -> TransportResult:
        return TransportResult(None, b"", error, detail, None, time.monotonic() - started)

    def _attempt(self, url: str, headers: dict[str, str], body: bytes,
                 workspace: str | None) -> tuple[int, str | None, bytes]:
        target = self._target(url)
        wire_headers = self._wire_headers(target, headers, len(body))
        addresses = self._checked_addresses(target, workspace)
        for i, ip in enumerate(addresses):
            try:
                return self._exchange(target, ip, wire_headers, body)
            except _ConnectFailed:
                if i == len(addresses) - 1:
                    raise
        raise AssertionError("unreachable: resolve_checked never returns an empty list")

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            target = parse_target(url, self._policy)  # raises: failures are not cached
            if len(self._targets) >= 16384:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _checked_addresses(self, target: Target, workspace: str | None) -> list[str]:
        if target.literal:
            return [target.host]  # checked by parse_target
        if self._dns is not None and self._resolver is None:
            return check_addresses(target.host, self._dns.resolve(target.host, workspace), self._policy)
        addresses = self._addresses.get(target.host)
        if addresses is None:
            addresses = resolve_checked(target.host, target.port, self._policy, self._resolver)
            self._addresses.put(target.host, addresses)
        return addresses

    def _wire_headers(self, target: Target, headers: dict[str, str], length: int) -> dict[str, str]:
        """The caller's headers, checked, less the ones we own; then ours.

        The names repeat from request to request (the engine sends the same set every
        time), so a set of names is checked once and remembered; the values, which
        change, are checked together in one pass.  Anything that does not pass
        goes through the header-by-header check, which names the first culprit.
        """
        names = tuple(headers)
        kept = self._checked_names.get(names)
        values = headers.values()
        if kept is None or not _values_ok(values):
            kept = _check_headers(headers)  # raises for a bad header
            if len(self._checked_names) >= 1024:
                self._checked_names.clear()
            self._checked_names[names] = kept
        # Header names are unique, so as many kept as given means all of them.
        out = dict(headers) if len(kept) == len(headers) else {n: v for n, v in headers.items() if n in kept}
        out["Host"] = target.authority
        out["Accept-Encoding"] = "identity"
        out["Content-Length"] = str(length)
        return out

    def _exchange(self, target: Target, ip: str, headers: dict[str, str], body: bytes) -> tuple[int, str | None, bytes]:
        raise NotImplementedError

    def _close_pool(self, pool: Any) -> None:
        pool.close()

    def close(self) -> None:
        self._pools.close_all()


# --------------------------------------------------------------------------- urllib3
class _PinnedDial:
    """Dials a fixed, already checked IP instead of resolving ``host``."""

    port: int
    timeout: Any

    def __init__(self, *args: Any, dial_ip: str, dialer: Dialer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dial_ip = dial_ip
        self._dialer = dialer

    def _new_conn(self) -> socket.socket:
        return _dial(self._dialer, self._dial_ip, self.port, _as_seconds(self.timeout))


class _PinnedHTTPConnection(_PinnedDial, HTTPConnection):
    """Plain HTTP to the checked address."""


class _PinnedHTTPSConnection(_PinnedDial, HTTPSConnection):
    """TLS to the checked address; SNI and certificate matching still use ``host``."""


def _as_seconds(timeout: Any) -> float:
    return float(timeout) if isinstance(timeout, int | float) else 10.0


class _QuietPutMixin:
    """Close surplus connections without urllib3's "pool is full" warning.

    Pools do not block (see module docstring), so more connections than
    ``maxsize`` are expected under load and logging each one would flood logs.
    """

    pool: Any

    def _put_conn(self, conn: Any) -> None:
        if conn is not None and self.pool is not None and self.pool.full():
            conn.close()
            return
        super()._put_conn(conn)  # type: ignore[misc]


class _PinnedHTTPPool(_QuietPutMixin, HTTPConnectionPool):
    ConnectionCls = _PinnedHTTPConnection


class _PinnedHTTPSPool(_QuietPutMixin, HTTPSConnectionPool):
    ConnectionCls = _PinnedHTTPSConnection


class Urllib3Transport(_BaseTransport):
    """urllib3 pools with a pinned-IP connection class (``http.client: urllib3``); the
    default client is geventhttpclient, measured faster (docs/benchmarks.md)."""

    def _new_pool(self, target: Target, ip: str) -> HTTPConnectionPool:
        common: dict[str, Any] = {
            "maxsize": self._maxsize,
            "block": False,
            "retries": False,
            # Backstop only: the gevent deadline in post() is what bounds the attempt.
            "timeout": urllib3.Timeout(connect=self._timeout, read=self._timeout),
            "dial_ip": ip,
            "dialer": self._dialer,
        }
        if target.scheme == "https":
            return _PinnedHTTPSPool(target.host, target.port, ssl_context=self._ssl_context, **common)
        return _PinnedHTTPPool(target.host, target.port, **common)

    def _exchange(self, target: Target, ip: str, headers: dict[str, str], body: bytes) -> tuple[int, str | None, bytes]:
        key = (target.scheme, target.host, target.port, ip)
        pool = self._pools.get(key, lambda: self._new_pool(target, ip))
        # On any exception urlopen closes the connection itself (its finally
        # block), including when our gevent deadline fires inside it.
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers=headers,
            retries=False,
            redirect=False,
            assert_same_host=False,
            preload_content=False,
            decode_content=False,
            release_conn=False,
            chunked=False,
        )
        complete = False
        try:
            data, complete = _read_capped(lambda n: response.read(n, decode_content=False), self._cap)
        finally:
            if not complete:  # over the cap, timed out or broken: never reuse
                response.close()
            response.release_conn()
        return response.status, response.headers.get("Retry-After"), data


# --------------------------------------------------------------------------- geventhttpclient
class _CappedResponse(HTTPSocketPoolResponse):
    """geventhttpclient's response with a bound on status line + headers.

    Its llhttp parser has no header size limit of its own, so a receiver
    streaming headers quickly could grow memory until the deadline.
    """

    _head_bytes = 0

    def feed(self, data: str | bytes) -> None:
        if not self.headers_complete:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                raise HTTPParseError("response headers too large")
        super().feed(data)


class _PinnedSocketPool(_GhcConnectionPool):
    """A geventhttpclient pool for one (host, port, checked IP).

    Unlike the stock pool it never blocks on a semaphore (see module docstring)
    and it dials ``ip`` rather than resolving ``host``.
    """

    def __init__(
        self, target: Target, ip: str, ssl_context: ssl.SSLContext | None, idle_max: int, dial: Callable[[], Any]
    ) -> None:
        super().__init__(ip, target.port, target.host, target.port, size=idle_max)
        self._tls = ssl_context
        self._dial = dial
        self._idle: list[Any] = []

    def get_socket(self) -> Any:
        while self._idle:
            sock = self._idle.pop()
            if _idle_socket_alive(sock):  # the peer may have closed it while idle
                return sock
            _close_quietly(sock)
        return self._create_socket()

    def _create_socket(self) -> Any:
        sock = self._dial()
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=self._request_host)
            except BaseException:
                _close_quietly(sock)
                raise
        if isinstance(sock, gevent.socket.socket):
            # Connected (and handshaken) within the dial timeout; from here the attempt's
            # gevent deadline bounds every wait.  A socket timeout as well would arm a
            # timer of its own for each wait (a response's read, a full send buffer).
            sock.settimeout(None)
        return sock

    def return_socket(self, sock: Any) -> None:
        if self._closed or len(self._idle) >= self.size:
            _close_quietly(sock)
        else:
            self._idle.append(sock)

    def release_socket(self, sock: Any) -> None:
        _close_quietly(sock)

    def close(self) -> None:
        self._closed = True
        while self._idle:
            _close_quietly(self._idle.pop())


class GeventHttpClientTransport(_BaseTransport):
    """geventhttpclient's C (llhttp) response parser over our own pinned-IP socket pool.

    The request head is written here (the headers are already validated) rather
    than by ``HTTPClient``, so the socket's life is ours end to end: whatever
    happens after a socket leaves the pool, it is either returned clean or closed.
    """

    def _new_pool(self, target: Target, ip: str) -> _PinnedSocketPool:
        tls = self._ssl_context if target.scheme == "https" else None
        return _PinnedSocketPool(
            target, ip, tls, self._maxsize, lambda: _dial(self._dialer, ip, target.port, self._timeout)
        )

    def _exchange(self, target: Target, ip: str, headers: dict[str, str], body: bytes) -> tuple[int, str | None, bytes]:
        key = (target.scheme, target.host, target.port, ip)
        pool = self._pools.get(key, lambda: self._new_pool(target, ip))
        head = "".join([f"POST {target.path} HTTP/1.1\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"])
        try:
            request = head.encode("latin-1") + body
        except UnicodeEncodeError:
            raise _BadRequestHeader("request header is not latin-1") from None
        sock = pool.get_socket()
        try:
            # A request fits the socket buffer nearly always: one send, and sendall only for
            # a rest (gevent's sendall asks the kernel for SO_SNDBUF on every call).
            sent = sock.send(request)
            if sent < len(request):
                sock.sendall(memoryview(request)[sent:])
            # Reads the headers; on error it closes the socket itself.
            response = _CappedResponse(sock, pool, method="POST", block_size=16384)
        except BaseException:
            pool.release_socket(sock)
            raise
        try:
            data, _ = _read_capped(response.read, self._cap)
        finally:
            # Returns the socket to the pool only if the message was read to its
            # end; a body past the cap, an error or our deadline close it.
            response.release()
        retry_after = response.get("Retry-After")
        if isinstance(retry_after, list):  # repeated header
            retry_after = ", ".join(retry_after)
        return response.status_code, retry_after, data


def make_transport(kind: Literal["urllib3", "geventhttpclient"], **kwargs: Any) -> Transport:
    """Build a transport by name; ``kwargs`` are the constructor's keyword arguments."""
    if kind == "urllib3":
        return Urllib3Transport(**kwargs)
    if kind == "geventhttpclient":
        return GeventHttpClientTransport(**kwargs)
    raise ValueError(f"unknown transport kind {kind!r}")
