"""The connection handler: deliveries are verified, counted and answered as
their profile says; ``/_...`` control routes run across all serving processes
through a :class:`Link`."""

from __future__ import annotations

import json
import random
import socket
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, unquote

import gevent

from dispatcher.signing import verify
from dispatcher_devtools.receiver.counters import (
    EndpointCounters,
    Row,
    Seen,
    State,
    csv_lines,
    merge_stats,
    write_ids,
)
from dispatcher_devtools.receiver.profiles import (
    BASE_PROFILES,
    QUERY_ALIASES,
    Profile,
    as_bool,
    build_profile,
    profile_from_mapping,
)
from dispatcher_devtools.receiver.wire import (
    HttpError,
    drip,
    hold_until_closed,
    payload_response,
    read_request,
    response,
    send_fast,
)

TIMESTAMP_TOLERANCE: Final = 300      # Standard Webhooks' default, seconds
ROUTE_CACHE: Final = 100_000


class Link(Protocol):
    """How a serving process runs a control operation across all serving processes."""

    def call(self, op: str, arg: Any) -> Any: ...


class LocalLink:
    """The single-process case: this process is everyone."""

    def __init__(self, state: State, started: float) -> None:
        self._state = state
        self._started = started

    def call(self, op: str, arg: Any) -> Any:
        if op == "stats":
            return merge_stats([self._state.snapshot(with_ids=False)], self._started)
        if op == "deliveries":
            return self._state.rows()  # streamed straight from the live counters
        if op == "ids":
            return [self._state.ids_blob()]  # one blob per serving process, as the supervisor answers
        return self._state.apply(op, arg)


# --------------------------------------------------------------------------- serving


class Server:
    """The connection handler: a lean HTTP/1.1 loop per connection."""

    def __init__(self, state: State, link: Link, keys: Sequence[bytes], rng: random.Random, *,
                 export_path: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self._export_path = export_path
        self._tls = tls
        self._state = state
        self._link = link
        self._keys = tuple(keys)
        self._rng = rng
        self._routes: dict[bytes, tuple[str, Profile]] = {}

    def handle(self, sock: socket.socket, _address: object) -> None:
        buf = bytearray()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                # The handshake runs here, in the connection's own greenlet: a client
                # that stalls or refuses our certificate holds up nobody else.
                sock = self._tls.wrap_socket(sock, server_side=True)
                self._state.tls_handshakes += 1
                self._state.tls_resumed += bool(sock.session_reused)
            while self._serve_one(sock, buf):
                pass
        except OSError:
            pass  # the client went away mid-exchange (or failed the handshake); there is nobody to answer
        finally:
            sock.close()

    def _serve_one(self, sock: socket.socket, buf: bytearray) -> bool:
        try:
            request = read_request(sock, buf)
        except HttpError as exc:
            sock.sendall(response(exc.status, None, True))
            return False
        if request is None:
            return False
        method, target, headers, body, keep = request
        try:
            if target.startswith(b"/_"):
                return self._control(sock, method, target, body, keep)
            return self._deliver(sock, method, target, headers, body, keep)
        except HttpError as exc:
            sock.sendall(response(exc.status, None, not keep or exc.close))
            return keep and not exc.close

    def _route(self, target: bytes) -> tuple[str, Profile]:
        route = self._routes.get(target)
        if route is not None:
            return route
        path, _, query = target.partition(b"?")
        name, sep, raw_key = path[1:].partition(b"/")
        base = name.decode("latin-1")
        if not sep or not raw_key or base not in BASE_PROFILES:
            raise HttpError(404)
        params = {
            QUERY_ALIASES.get(k, k): v
            for k, v in parse_qsl(query.decode("utf-8", "replace"), keep_blank_values=True)
        }
        try:
            profile = build_profile(base, params)
        except ValueError:
            raise HttpError(400) from None
        if len(self._routes) >= ROUTE_CACHE:
            self._routes.clear()
        route = self._routes[target] = (unquote(raw_key.decode("utf-8", "replace")), profile)
        return route

    def _deliver(
        self, sock: socket.socket, method: bytes, target: bytes,
        headers: dict[bytes, bytes], body: bytes, keep: bool,
    ) -> bool:
        key, url_profile = self._route(target)
        if method != b"POST":
            raise HttpError(405)
        state = self._state
        ep = state.endpoint(key)
        slot = ep.slot
        level = state.gauge.enter(slot)
        try:
            if level > ep.max_concurrency:
                ep.max_concurrency = level
            ep.requests += 1
            seen = self._admit(ep, headers, body)
            if isinstance(seen, int):
                send_fast(sock, response(seen, None, not keep))
                state.answered(ep, None, seen)
                return keep
            return self._answer(sock, ep, seen, state.profile_for(key, url_profile), keep)
        finally:
            state.gauge.leave(slot)

    def _admit(self, ep: EndpointCounters, headers: Mapping[bytes, bytes], body: bytes) -> Seen | int:
        """The delivery's record, or the status refusing it (401 bad signature, 400)."""
        wid = headers.get(b"webhook-id")
        if not wid or b"\n" in wid:
            if self._keys:
                ep.bad_signatures += 1
                return 401
            ep.bad_requests += 1
            return 400
        stamp: int | None
        try:
            stamp = int(headers.get(b"webhook-timestamp", b""))
        except ValueError:
            stamp = None
        else:
            if abs(time.time() - stamp) > TIMESTAMP_TOLERANCE:
                ep.stale_timestamps += 1  # counted, not refused: tests may run on fake clocks
        if self._keys and not self._verified(wid, stamp, headers.get(b"webhook-signature"), body):
            ep.bad_signatures += 1
            return 401
        return self._state.record(ep, wid, headers)

    def _verified(self, wid: bytes, stamp: int | None, header: bytes | None, body: bytes) -> bool:
        if stamp is None or header is None:
            return False
        try:
            return verify(self._keys, wid.decode("utf-8"), stamp, body, header.decode("latin-1"))
        except UnicodeDecodeError:
            return False

    def _answer(self, sock: socket.socket, ep: EndpointCounters, seen: Seen, profile: Profile, keep: bool) -> bool:
        if profile.hang:
            hold_until_closed(sock)
            self._state.answered(ep, seen, 0)  # 0: no answer was ever sent
            return False
        delay = profile.delay(self._rng)
        if delay > 0:
            gevent.sleep(delay)
        status = profile.pick_status(self._rng)
        try:
            if profile.drip_ms > 0:
                drip(sock, response(status, profile, not keep), profile.drip_ms / 1000.0, gevent.sleep)
            else:
                send_fast(sock, response(status, profile, not keep))
        except OSError:
            self._state.answered(ep, seen, 0)
            raise
        self._state.answered(ep, seen, status)
        return keep

    def _control(self, sock: socket.socket, method: bytes, target: bytes, body: bytes, keep: bool) -> bool:
        try:
            return self._control_route(sock, method, target, body, keep)
        except (RuntimeError, gevent.Timeout) as exc:  # a process did not answer in time
            sock.sendall(payload_response(500, repr(exc).encode(), "text/plain", True))
            return False

    def _control_route(self, sock: socket.socket, method: bytes, target: bytes, body: bytes, keep: bool) -> bool:
        path, _, raw_query = target.partition(b"?")
        query = dict(parse_qsl(raw_query.decode("utf-8", "replace")))
        route = (method, path)
        if route == (b"GET", b"/_healthz"):
            sock.sendall(payload_response(200, b"ok\n", "text/plain", not keep))
        elif route == (b"GET", b"/_stats"):
            fast = as_bool(query.get("fast", "0"))
            self._send_json(sock, self._link.call("stats", not fast), keep)
        elif route == (b"POST", b"/_reset"):
            self._link.call("reset", as_bool(query.get("profiles", "0")))
            self._send_json(sock, {"reset": True}, keep)
        elif route == (b"POST", b"/_export_ids"):
            self._send_json(sock, {"path": self._export_path, "ids": self.export_ids()}, keep)
        elif route == (b"GET", b"/_deliveries"):
            send_rows(sock, self._link.call("deliveries", None), not keep)
        elif path.startswith(b"/_profile/") and len(path) > len(b"/_profile/"):
            key = unquote(path[len(b"/_profile/"):].decode("utf-8", "replace"))
            self._profile_route(sock, method, key, body, keep)
        else:
            raise HttpError(404)
        return keep

    def _profile_route(self, sock: socket.socket, method: bytes, key: str, body: bytes, keep: bool) -> None:
        if method == b"GET":
            current = self._state.runtime.get(key) or self._state.file_profiles.get(key)
            self._send_json(sock, None if current is None else asdict(current), keep)
            return
        if method == b"DELETE":
            spec = None
        elif method == b"POST":
            try:
                spec = json.loads(body or b"null")
                if spec is not None:
                    profile_from_mapping(spec)  # refuse bad input before any process sees it
            except ValueError as exc:
                sock.sendall(payload_response(400, str(exc).encode(), "text/plain", not keep))
                return
        else:
            raise HttpError(405)
        self._link.call("profile", (key, spec))
        self._send_json(sock, {"key": key, "profile": spec}, keep)

    def export_ids(self) -> int:
        """Write every serving process's received ids to the --export-ids file; how many."""
        if self._export_path is None:
            raise HttpError(404)  # started without --export-ids
        return write_ids(self._export_path, self._link.call("ids", None))

    @staticmethod
    def _send_json(sock: socket.socket, document: Any, keep: bool) -> None:
        body = json.dumps(document).encode("utf-8")
        sock.sendall(payload_response(200, body, "application/json", not keep))


def send_rows(sock: socket.socket, rows: Iterable[Row], close: bool) -> None:
    """Stream the CSV in chunks so 10^6 rows never sit in memory as one body."""
    sock.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/csv; charset=utf-8\r\n"
        b"Transfer-Encoding: chunked\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n"
    )
    batch: list[bytes] = []
    for line in csv_lines(rows):
        batch.append(line)
        if len(batch) == 4096:
            _send_chunk(sock, b"".join(batch))
            batch.clear()
    _send_chunk(sock, b"".join(batch))
    sock.sendall(b"0\r\n\r\n")


def _send_chunk(sock: socket.socket, data: bytes) -> None:
    if data:
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

