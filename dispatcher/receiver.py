"""A fast local mock webhook receiver for the demo, the tests and the benchmarks.

Run it as ``python -m dispatcher.receiver --listen 127.0.0.1:0 [--secret S ...]
[--profiles FILE.yaml] [--processes N] [--ready-file PATH] [--seed N]``, or from
Python through :class:`ReceiverProcess`.

Delivery URLs are ``/<profile>/<endpoint-key>?<params>``.  The profile name gives
the defaults (see ``BASE_PROFILES``) and the query string overrides them:

* ``/ok/k``                                   instant 200
* ``/latency/k?ms=80``                        fixed delay
* ``/latency/k?median_ms=80&sigma=0.5``       log-normal delay
* ``/error/k?rate=0.02&status=500``           random errors (combine with delays)
* ``/ratelimit/k?retry_after=2``              429 with Retry-After
* ``/unavailable/k?retry_after=2``            503 with Retry-After
* ``/hang/k``                                 never answers; held until the client leaves
* ``/slow/k?ms=4800``                         200 after 4.8 s
* ``/redirect/k?to=URL&code=302``             redirect
* ``/status/k?code=404``                      fixed status

Query names: ``ms`` (latency_ms), ``median_ms``, ``sigma``, ``rate`` (error_rate),
``status`` (error_status), ``code`` (status), ``to`` (location), ``retry_after``,
``body`` (body_bytes, a response body of that many bytes), ``hang``, and the
canonical :class:`Profile` field names except ``status``.  A "down" endpoint is
a closed port, not a route: see :func:`closed_port_url`.

Profiles in ``--profiles FILE`` (``key: {latency_ms: 80, error_rate: 0.1}``,
optionally ``profile: <base name>``) and those posted to ``/_profile/<key>``
replace the URL's profile for that key; runtime ones win over the file.

Control routes (never counted): ``GET /_healthz``, ``GET /_stats[?fast=1]``,
``POST /_reset[?profiles=1]``, ``GET /_deliveries`` (CSV), and
``GET|POST|DELETE /_profile/<key>``.

Every delivery must carry a Standard Webhooks signature that verifies against
one of the ``--secret`` values (401 otherwise); without secrets nothing is
verified but ``webhook-id`` is still required (400 otherwise).
"""

if __name__ == "__main__":
    # This module is an entry point: gevent must patch socket/ssl/threading before
    # anything below imports them.  Imported as a library (tests, benchmarks) it
    # must not patch the importer, hence the guard.
    from gevent import monkey

    monkey.patch_all()

# ruff: noqa: E402  -- the imports have to follow the guarded monkey-patch above.
import argparse
import contextlib
import csv
import http.client
import io
import itertools
import json
import math
import mmap
import multiprocessing
import os
import pickle
import random
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, Protocol, Self
from urllib.parse import parse_qsl, quote, unquote, urlencode

import gevent
import gevent.os
from gevent.event import AsyncResult, Event
from gevent.lock import Semaphore
from gevent.server import StreamServer

from dispatcher.signing import secret_key, signature_header, verify

__all__ = [
    "BASE_PROFILES",
    "Delivery",
    "Profile",
    "ReceiverProcess",
    "build_profile",
    "closed_port_url",
    "main",
    "profile_from_mapping",
    "signed_headers",
]

MAX_HEAD: Final = 64 * 1024
MAX_BODY: Final = 16 * 1024 * 1024
RECV_SIZE: Final = 64 * 1024
TIMESTAMP_TOLERANCE: Final = 300      # Standard Webhooks' default, seconds
ROUTE_CACHE: Final = 100_000
CALL_TIMEOUT: Final = 120.0           # a /_stats over 10^6 ids across processes takes seconds
DEFAULT_MAX_ENDPOINTS: Final = 65_536
CSV_HEADER: Final = (
    "webhook_id", "endpoint", "first_2xx_ts", "count", "ok", "attempts", "idempotency_keys",
)


# --------------------------------------------------------------------------- profiles


def _header_safe(text: str) -> bool:
    return text.isprintable() and text.isascii()  # no CR/LF: no header injection


@dataclass(frozen=True, slots=True)
class Profile:
    """How an endpoint answers.  The field names are the YAML/JSON keys."""

    status: int = 200               # the answer when no error is drawn
    latency_ms: float = 0.0         # fixed delay before answering
    median_ms: float = 0.0          # > 0 adds a log-normal delay with this median
    sigma: float = 0.5              # shape of that log-normal delay
    error_rate: float = 0.0         # probability of answering error_status instead
    error_status: int = 500
    retry_after: str | None = None  # sent with every non-2xx answer
    location: str | None = None     # sent when set (redirects)
    hang: bool = False              # never answer; hold the connection until the client leaves
    body_bytes: int = 0             # size of the response body

    def __post_init__(self) -> None:
        if not (200 <= self.status <= 599 and 200 <= self.error_status <= 599):
            raise ValueError("status codes must be within 200..599")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be within 0..1")
        numbers = (self.latency_ms, self.median_ms, self.sigma)
        if not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise ValueError("latency_ms, median_ms and sigma must be finite and not negative")
        for text in (self.retry_after, self.location):
            if text is not None and not _header_safe(text):
                raise ValueError(f"not usable as a header value: {text!r}")
        if not 0 <= self.body_bytes <= 1024 * 1024:
            raise ValueError("body_bytes must be within 0..1048576")

    def delay(self, rng: random.Random) -> float:
        """Seconds to wait before answering."""
        seconds = self.latency_ms / 1000.0
        if self.median_ms > 0:
            seconds += rng.lognormvariate(math.log(self.median_ms / 1000.0), self.sigma)
        return seconds

    def pick_status(self, rng: random.Random) -> int:
        if self.error_rate >= 1.0 or (self.error_rate > 0 and rng.random() < self.error_rate):
            return self.error_status
        return self.status


BASE_PROFILES: Final[Mapping[str, Profile]] = {
    "ok": Profile(),
    "latency": Profile(),
    "error": Profile(error_rate=1.0),
    "ratelimit": Profile(error_rate=1.0, error_status=429, retry_after="1"),
    "unavailable": Profile(error_rate=1.0, error_status=503, retry_after="1"),
    "hang": Profile(hang=True),
    "slow": Profile(latency_ms=4800.0),
    "redirect": Profile(status=302, location="/ok/redirected"),
    "status": Profile(status=404),
}

# Short query-string names.  "status" means the *error* status in a URL, as in
# /error/k?rate=0.02&status=500, while "code" is the plain status.
QUERY_ALIASES: Final[Mapping[str, str]] = {
    "ms": "latency_ms", "rate": "error_rate", "status": "error_status", "code": "status",
    "to": "location", "body": "body_bytes",
}


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on", ""):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


def _as_optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


_CONVERTERS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "status": int, "latency_ms": float, "median_ms": float, "sigma": float,
    "error_rate": float, "error_status": int, "retry_after": _as_optional_str,
    "location": _as_optional_str, "hang": _as_bool, "body_bytes": int,
}


def build_profile(base: str, params: Mapping[str, Any]) -> Profile:
    """``BASE_PROFILES[base]`` with canonical-named ``params`` applied; ValueError if invalid."""
    try:
        profile = BASE_PROFILES[base]
    except KeyError:
        raise ValueError(f"unknown profile {base!r}") from None
    changes: dict[str, Any] = {}
    for name, value in params.items():
        convert = _CONVERTERS.get(name)
        if convert is None:
            raise ValueError(f"unknown profile field {name!r}")
        try:
            changes[name] = convert(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad value for {name}: {value!r}") from exc
    return replace(profile, **changes)


def profile_from_mapping(spec: Mapping[str, Any] | str) -> Profile:
    """A profile from YAML/JSON: ``{"profile": "error", "error_rate": 0.5}`` or just ``"ok"``."""
    if isinstance(spec, str):
        return build_profile(spec, {})
    if not isinstance(spec, Mapping):
        raise ValueError("a profile must be a mapping or a base profile name")
    params = dict(spec)
    base = params.pop("profile", "ok")
    return build_profile(str(base), params)


def _load_profile_file(path: str) -> dict[str, Profile]:
    import yaml  # only the CLI with --profiles needs it

    with open(path, encoding="utf-8") as handle:
        document = yaml.safe_load(handle) or {}
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a mapping of endpoint key to profile")
    return {str(key): profile_from_mapping(spec) for key, spec in document.items()}


# --------------------------------------------------------------------------- HTTP wire


class _HttpError(Exception):
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
def _response(status: int, profile: Profile | None, close: bool) -> bytes:
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


def _payload_response(status: int, body: bytes, content_type: str, close: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_reason(status)}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode("latin-1") + body


_Request = tuple[bytes, bytes, dict[bytes, bytes], bytes, bool]


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
            raise _HttpError(431, close=True)
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


def _read_request(sock: socket.socket, buf: bytearray) -> _Request | None:
    """One request as (method, target, headers, body, keep_alive); None at EOF."""
    head = _read_head(sock, buf)
    if head is None:
        return None
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _HttpError(400, close=True)
    method, target, version = parts
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise _HttpError(400, close=True)
        headers[name.lower()] = value.strip()
    if b"transfer-encoding" in headers:
        raise _HttpError(411, close=True)  # only Content-Length bodies are supported
    try:
        length = int(headers.get(b"content-length", b"0"))
    except ValueError:
        raise _HttpError(400, close=True) from None
    if not 0 <= length <= MAX_BODY:
        raise _HttpError(413 if length > 0 else 400, close=True)
    if length and headers.get(b"expect", b"").lower() == b"100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = _read_body(sock, buf, length) if length else b""
    if body is None:
        return None
    keep = version == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != b"close"
    return method, target, headers, body, keep


def _send(sock: socket.socket, data: bytes) -> None:
    """``sendall`` for the hot path: gevent's sendall costs an extra getsockopt
    syscall per call, and a small answer nearly always goes out in one send."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def _hold_until_closed(sock: socket.socket) -> None:
    """Swallow input until the client gives up: what a hung endpoint looks like."""
    try:
        while sock.recv(RECV_SIZE):
            pass
    except OSError:
        pass


# --------------------------------------------------------------------------- counting


class _Seen:
    """What one endpoint saw of one webhook-id.

    Slots and shared objects keep 10^6 of these small: ``attempts`` is usually the
    interpreter's cached one-byte ``b"1"`` and ``idem`` usually *is* the dict key.
    """

    __slots__ = ("count", "ok", "first_2xx", "attempts", "idem")

    count: int
    ok: int
    first_2xx: float | None
    attempts: bytes         # X-Larkspur-Attempt values, space-separated ("-" when absent)
    idem: bytes | None      # distinct Idempotency-Key values, space-separated

    def __init__(self, attempt: bytes, idem: bytes | None) -> None:
        self.count = 1
        self.ok = 0
        self.first_2xx = None
        self.attempts = attempt
        self.idem = idem


class _Endpoint:
    """Counters for one endpoint key in one process."""

    __slots__ = (
        "slot", "requests", "count", "ok", "ok_ids", "bad_signatures", "bad_requests",
        "stale_timestamps", "idempotency_missing", "idempotency_mismatch",
        "max_concurrency", "statuses", "attempts", "ids",
    )

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.requests = self.count = self.ok = self.ok_ids = 0
        self.bad_signatures = self.bad_requests = self.stale_timestamps = 0
        self.idempotency_missing = self.idempotency_mismatch = 0
        self.max_concurrency = 0
        self.statuses: dict[int, int] = {}
        self.attempts: dict[bytes, int] = {}
        self.ids: dict[bytes, _Seen] = {}


def _add_token(existing: bytes | None, token: bytes) -> bytes:
    if existing is None or existing == token:
        return token
    if token in existing.split(b" "):
        return existing
    return existing + b" " + token


class _InFlight:
    """Requests in flight per endpoint slot: one row per process, in shared memory.

    A process bumps its own cell and then sums the slot's column, so the maximum
    it observes is global across ``--processes``.  With several processes the
    bump-then-sum runs under a shared lock: without that fence x86 may let two
    processes each read the other's cell before its store lands, and both
    under-count (seen: 5 of 6 held requests).  One process needs no lock.
    """

    def __init__(self, processes: int, slots: int) -> None:
        self.slots = slots
        self._memory = mmap.mmap(-1, processes * slots * 8)  # MAP_SHARED: survives fork
        self._cells = memoryview(self._memory).cast("q")
        self._base = 0
        self._lock = multiprocessing.get_context("fork").Lock() if processes > 1 else None

    def adopt_row(self, row: int) -> None:
        self._base = row * self.slots

    def enter(self, slot: int) -> int:
        """Count one more request in flight; returns the level including it."""
        if self._lock is None:
            self._cells[self._base + slot] += 1
            return sum(self._cells[slot::self.slots])
        with self._lock:
            self._cells[self._base + slot] += 1
            return sum(self._cells[slot::self.slots])

    def leave(self, slot: int) -> None:
        if self._lock is None:
            self._cells[self._base + slot] -= 1
            return
        with self._lock:  # else a late-visible decrement could over-count elsewhere
            self._cells[self._base + slot] -= 1

    def level(self, slot: int) -> int:
        return sum(self._cells[slot::self.slots])


_Row = tuple[str, bytes, int, int, float | None, bytes, bytes | None]


class _State:
    """One process's counters and profile overrides."""

    def __init__(self, gauge: _InFlight, file_profiles: Mapping[str, Profile]) -> None:
        self.gauge = gauge
        self.file_profiles = dict(file_profiles)
        self.runtime: dict[str, Profile] = {}
        self.endpoints: dict[str, _Endpoint] = {}
        # Slots outlive /_reset: requests in flight across a reset still leave their slot.
        self.slots: dict[str, int] = {}
        self.allocate: Callable[[str], int] = self._allocate_locally

    def _allocate_locally(self, key: str) -> int:
        return len(self.slots) if len(self.slots) < self.gauge.slots else -1

    def endpoint(self, key: str) -> _Endpoint:
        ep = self.endpoints.get(key)
        if ep is not None:
            return ep
        slot = self.slots.get(key)
        if slot is None:
            slot = self.allocate(key)  # may switch greenlets (asks the supervisor)
            if slot < 0:
                raise _HttpError(507)
            self.slots[key] = slot
        return self.endpoints.setdefault(key, _Endpoint(slot))

    def profile_for(self, key: str, url_profile: Profile) -> Profile:
        profile = self.runtime.get(key)
        if profile is None:
            profile = self.file_profiles.get(key, url_profile)
        return profile

    @staticmethod
    def record(ep: _Endpoint, wid: bytes, headers: Mapping[bytes, bytes]) -> _Seen:
        ep.count += 1
        attempt = headers.get(b"x-larkspur-attempt", b"-")
        ep.attempts[attempt] = ep.attempts.get(attempt, 0) + 1
        idem = headers.get(b"idempotency-key")
        if idem is None:
            ep.idempotency_missing += 1
        elif idem != wid:
            ep.idempotency_mismatch += 1
        seen = ep.ids.get(wid)
        if seen is None:
            seen = ep.ids[wid] = _Seen(attempt, wid if idem == wid else idem)
            return seen
        seen.count += 1
        seen.attempts += b" " + attempt
        if idem is not None:
            seen.idem = _add_token(seen.idem, idem)
        return seen

    @staticmethod
    def answered(ep: _Endpoint, seen: _Seen | None, status: int) -> None:
        ep.statuses[status] = ep.statuses.get(status, 0) + 1
        if seen is not None and 200 <= status < 300:
            ep.ok += 1
            seen.ok += 1
            if seen.ok == 1:
                ep.ok_ids += 1
                seen.first_2xx = time.time()

    def apply(self, op: str, arg: Any) -> Any:
        """Run one control operation on this process's state."""
        if op == "stats":
            return self.snapshot(with_ids=bool(arg))
        if op == "deliveries":
            return list(self.rows())
        if op == "reset":
            self.endpoints = {}
            if arg:
                self.runtime.clear()
            return None
        if op == "profile":
            key, spec = arg
            if spec is None:
                self.runtime.pop(key, None)
            else:
                self.runtime[key] = profile_from_mapping(spec)
            return None
        raise ValueError(f"unknown operation {op!r}")

    def snapshot(self, with_ids: bool) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "pid": os.getpid(),
            "cpu": (usage.ru_utime, usage.ru_stime),
            "endpoints": {
                key: self._endpoint_snapshot(ep, with_ids) for key, ep in self.endpoints.items()
            },
        }

    def _endpoint_snapshot(self, ep: _Endpoint, with_ids: bool) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "requests": ep.requests, "count": ep.count, "unique": len(ep.ids), "ok": ep.ok,
            "ok_unique": ep.ok_ids, "bad_signatures": ep.bad_signatures,
            "bad_requests": ep.bad_requests, "stale_timestamps": ep.stale_timestamps,
            "idempotency_key_missing": ep.idempotency_missing,
            "idempotency_key_mismatch": ep.idempotency_mismatch,
            "max_concurrency": ep.max_concurrency, "in_flight": self.gauge.level(ep.slot),
            "statuses": dict(ep.statuses),
            "attempts": {k.decode("utf-8", "replace"): n for k, n in ep.attempts.items()},
        }
        if with_ids:
            # One joined blob pickles far faster than 10^6 small bytes objects.
            # Ids never contain b"\n": such requests are refused.
            snap["ids"] = b"\n".join(ep.ids)
            snap["ok_ids"] = b"\n".join(w for w, s in ep.ids.items() if s.ok)
        return snap

    def rows(self) -> Iterator[_Row]:
        # Iterate over copies: the caller yields to the hub while requests keep coming.
        for key, ep in list(self.endpoints.items()):
            ids = ep.ids
            for wid in list(ids):
                seen = ids[wid]
                yield key, wid, seen.count, seen.ok, seen.first_2xx, seen.attempts, seen.idem


# --------------------------------------------------------------------------- merging


_SUMMED: Final = (
    "requests", "count", "unique", "ok", "ok_unique", "bad_signatures", "bad_requests",
    "stale_timestamps", "idempotency_key_missing", "idempotency_key_mismatch",
)


def _fold_endpoint(acc: dict[str, Any], snap: Mapping[str, Any]) -> None:
    for name in _SUMMED:
        acc[name] = acc.get(name, 0) + snap[name]
    for name in ("max_concurrency", "in_flight"):  # already global (_InFlight); see merge_stats
        acc[name] = max(acc.get(name, 0), snap[name])
    for name in ("statuses", "attempts"):
        bucket = acc.setdefault(name, {})
        for value, n in snap[name].items():
            bucket[value] = bucket.get(value, 0) + n
    if "ids" in snap:
        acc.setdefault("_ids", []).append(snap["ids"])
        acc.setdefault("_ok_ids", []).append(snap["ok_ids"])


def _finish_endpoint(acc: dict[str, Any], parts: int) -> dict[str, Any]:
    unique: int | None = acc["unique"]
    ok_unique: int | None = acc["ok_unique"]
    if parts > 1:  # the same id may have reached several processes
        unique = len(_union(acc["_ids"])) if "_ids" in acc else None
        ok_unique = len(_union(acc["_ok_ids"])) if "_ok_ids" in acc else None
    return {
        "requests": acc["requests"], "count": acc["count"], "unique": unique,
        "duplicates": None if unique is None else acc["count"] - unique,
        "ok": acc["ok"], "duplicates_2xx": None if ok_unique is None else acc["ok"] - ok_unique,
        "bad_signatures": acc["bad_signatures"], "bad_requests": acc["bad_requests"],
        "max_concurrency": acc["max_concurrency"], "in_flight": acc["in_flight"],
        "statuses": {str(code): n for code, n in sorted(acc["statuses"].items())},
        "attempts": acc["attempts"], "stale_timestamps": acc["stale_timestamps"],
        "idempotency_key_missing": acc["idempotency_key_missing"],
        "idempotency_key_mismatch": acc["idempotency_key_mismatch"],
    }


def _union(blobs: Iterable[bytes]) -> set[bytes]:
    merged: set[bytes] = set()
    for blob in blobs:
        if blob:
            merged.update(blob.split(b"\n"))
    return merged


def merge_stats(
    snapshots: Sequence[Mapping[str, Any]], started: float, extra_cpu: tuple[float, float] = (0.0, 0.0),
    in_flight: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The /_stats document from one snapshot per serving process.

    Processes snapshot one after another, so a level read by a late one can
    include a request that entered a process which had already reported its
    maximum.  The supervisor therefore passes ``in_flight`` as read *before* it
    asked for the snapshots: every request counted there has already updated
    its process's maximum, which keeps ``max_concurrency >= in_flight``.
    """
    folded: dict[str, dict[str, Any]] = {}
    user, system = extra_cpu
    for snap in snapshots:
        user += snap["cpu"][0]
        system += snap["cpu"][1]
        for key, ep in snap["endpoints"].items():
            _fold_endpoint(folded.setdefault(key, {}), ep)
    if in_flight is not None:
        for key, acc in folded.items():
            acc["in_flight"] = in_flight.get(key, 0)
    endpoints = {key: _finish_endpoint(acc, len(snapshots)) for key, acc in sorted(folded.items())}

    def total(name: str) -> int | None:
        values = [ep[name] for ep in endpoints.values()]
        return None if None in values else sum(values)

    return {
        "total": total("count"), "requests": total("requests"),
        "bad_signatures": total("bad_signatures"), "duplicates": total("duplicates"),
        "duplicates_2xx": total("duplicates_2xx"),
        "uptime_s": round(time.time() - started, 3),
        "cpu_s": round(user + system, 3), "cpu_user_s": round(user, 3),
        "cpu_system_s": round(system, 3), "processes": len(snapshots),
        "pids": [snap["pid"] for snap in snapshots], "endpoints": endpoints,
    }


def merge_rows(parts: Sequence[Sequence[_Row]]) -> list[_Row]:
    """Per-(endpoint, id) rows folded across processes."""
    if len(parts) == 1:
        return list(parts[0])
    merged: dict[tuple[str, bytes], _Row] = {}
    for part in parts:
        for row in part:
            prior = merged.get((row[0], row[1]))
            merged[(row[0], row[1])] = row if prior is None else _fold_row(prior, row)
    return list(merged.values())


def _fold_row(a: _Row, b: _Row) -> _Row:
    key, wid, count, ok, first, attempts, idem = a
    firsts = [t for t in (first, b[4]) if t is not None]
    # Across processes the arrival order is lost; sorted is at least deterministic.
    tokens = sorted((attempts + b" " + b[5]).split(), key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0, t))
    for token in (b[6] or b"").split():
        idem = _add_token(idem, token)
    return key, wid, count + b[2], ok + b[3], min(firsts) if firsts else None, b" ".join(tokens), idem


def _csv_row(row: _Row) -> tuple[str, ...]:
    key, wid, count, ok, first, attempts, idem = row
    return (
        wid.decode("utf-8", "replace"), key, "" if first is None else f"{first:.6f}",
        str(count), str(ok), attempts.decode("utf-8", "replace"),
        "" if idem is None else idem.decode("utf-8", "replace"),
    )


def _csv_lines(rows: Iterable[_Row]) -> Iterator[bytes]:
    """CSV lines as bytes.  Plain ASCII rows (nearly all) skip the csv module,
    which would double the cost of dumping 10^6 rows; the rest go through it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    yield out.getvalue().encode()
    encoded: dict[str, bytes] = {}
    for row in rows:
        key, wid, count, ok, first, attempts, idem = row
        key_bytes = encoded.get(key)
        if key_bytes is None:
            key_bytes = encoded[key] = key.encode("utf-8")
        stamp = b"" if first is None else b"%.6f" % first
        line = b"%s,%s,%s,%d,%d,%s,%s\n" % (wid, key_bytes, stamp, count, ok, attempts, idem or b"")
        if line.count(b",") == 6 and line.isascii() and b'"' not in line and b"\r" not in line:
            yield line  # ids never hold b"\n" (refused), so the only newline is ours
            continue
        out.seek(0)
        out.truncate()
        writer.writerow(_csv_row(row))
        yield out.getvalue().encode("utf-8")


# --------------------------------------------------------------------------- control links


class _Link(Protocol):
    """How a serving process runs a control operation across all serving processes."""

    def call(self, op: str, arg: Any) -> Any: ...


class _LocalLink:
    """The single-process case: this process is everyone."""

    def __init__(self, state: _State, started: float) -> None:
        self._state = state
        self._started = started

    def call(self, op: str, arg: Any) -> Any:
        if op == "stats":
            return merge_stats([self._state.snapshot(with_ids=False)], self._started)
        if op == "deliveries":
            return self._state.rows()  # streamed straight from the live counters
        return self._state.apply(op, arg)


_FRAME: Final = struct.Struct("!Q")


class _Channel:
    """Length-prefixed pickle frames over a socketpair between supervisor and child."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = Semaphore()  # frames from several greenlets must not interleave

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self._sock.sendall(_FRAME.pack(len(data)))
            self._sock.sendall(data)

    def recv(self) -> tuple[Any, ...] | None:
        header = self._recv_exactly(_FRAME.size)
        if header is None:
            return None
        data = self._recv_exactly(_FRAME.unpack(header)[0])
        return None if data is None else pickle.loads(data)

    def _recv_exactly(self, size: int) -> bytearray | None:
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                return None
            got += n
        return data

    def close(self) -> None:
        self._sock.close()


class _ChildLink:
    """A forked serving process: control operations go through the supervisor."""

    def __init__(self, channel: _Channel, state: _State) -> None:
        self._channel = channel
        self._state = state
        self._pending: dict[int, AsyncResult] = {}
        self._ids = itertools.count()

    def call(self, op: str, arg: Any) -> Any:
        request = next(self._ids)
        result = self._pending[request] = AsyncResult()
        try:
            self._channel.send(("call", request, op, arg))
            ok, value = result.get(timeout=CALL_TIMEOUT)
        finally:
            self._pending.pop(request, None)
        if not ok:
            raise RuntimeError(value)
        return value

    def slot(self, key: str) -> int:
        return int(self.call("slot", key))

    def run(self) -> None:
        """Serve the supervisor until it goes away (then the caller exits)."""
        while (message := self._channel.recv()) is not None:
            if message[0] == "do":
                _, token, op, arg = message
                self._channel.send(("done", token, self._state.apply(op, arg)))
            elif message[0] == "result":
                _, request, ok, value = message
                waiter = self._pending.get(request)
                if waiter is not None:
                    waiter.set((ok, value))


# --------------------------------------------------------------------------- serving


class _Server:
    """The connection handler: a lean HTTP/1.1 loop per connection."""

    def __init__(self, state: _State, link: _Link, keys: Sequence[bytes], rng: random.Random) -> None:
        self._state = state
        self._link = link
        self._keys = tuple(keys)
        self._rng = rng
        self._routes: dict[bytes, tuple[str, Profile]] = {}

    def handle(self, sock: socket.socket, _address: object) -> None:
        buf = bytearray()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while self._serve_one(sock, buf):
                pass
        except OSError:
            pass  # the client went away mid-exchange; there is nobody to answer
        finally:
            sock.close()

    def _serve_one(self, sock: socket.socket, buf: bytearray) -> bool:
        try:
            request = _read_request(sock, buf)
        except _HttpError as exc:
            sock.sendall(_response(exc.status, None, True))
            return False
        if request is None:
            return False
        method, target, headers, body, keep = request
        try:
            if target.startswith(b"/_"):
                return self._control(sock, method, target, body, keep)
            return self._deliver(sock, method, target, headers, body, keep)
        except _HttpError as exc:
            sock.sendall(_response(exc.status, None, not keep or exc.close))
            return keep and not exc.close

    def _route(self, target: bytes) -> tuple[str, Profile]:
        route = self._routes.get(target)
        if route is not None:
            return route
        path, _, query = target.partition(b"?")
        name, sep, raw_key = path[1:].partition(b"/")
        base = name.decode("latin-1")
        if not sep or not raw_key or base not in BASE_PROFILES:
            raise _HttpError(404)
        params = {
            QUERY_ALIASES.get(k, k): v
            for k, v in parse_qsl(query.decode("utf-8", "replace"), keep_blank_values=True)
        }
        try:
            profile = build_profile(base, params)
        except ValueError:
            raise _HttpError(400) from None
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
            raise _HttpError(405)
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
                _send(sock, _response(seen, None, not keep))
                state.answered(ep, None, seen)
                return keep
            return self._answer(sock, ep, seen, state.profile_for(key, url_profile), keep)
        finally:
            state.gauge.leave(slot)

    def _admit(self, ep: _Endpoint, headers: Mapping[bytes, bytes], body: bytes) -> _Seen | int:
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

    def _answer(self, sock: socket.socket, ep: _Endpoint, seen: _Seen, profile: Profile, keep: bool) -> bool:
        if profile.hang:
            _hold_until_closed(sock)
            self._state.answered(ep, seen, 0)  # 0: no answer was ever sent
            return False
        delay = profile.delay(self._rng)
        if delay > 0:
            gevent.sleep(delay)
        status = profile.pick_status(self._rng)
        try:
            _send(sock, _response(status, profile, not keep))
        except OSError:
            self._state.answered(ep, seen, 0)
            raise
        self._state.answered(ep, seen, status)
        return keep

    def _control(self, sock: socket.socket, method: bytes, target: bytes, body: bytes, keep: bool) -> bool:
        try:
            return self._control_route(sock, method, target, body, keep)
        except (RuntimeError, gevent.Timeout) as exc:  # a process did not answer in time
            sock.sendall(_payload_response(500, repr(exc).encode(), "text/plain", True))
            return False

    def _control_route(self, sock: socket.socket, method: bytes, target: bytes, body: bytes, keep: bool) -> bool:
        path, _, raw_query = target.partition(b"?")
        query = dict(parse_qsl(raw_query.decode("utf-8", "replace")))
        route = (method, path)
        if route == (b"GET", b"/_healthz"):
            sock.sendall(_payload_response(200, b"ok\n", "text/plain", not keep))
        elif route == (b"GET", b"/_stats"):
            fast = _as_bool(query.get("fast", "0"))
            self._send_json(sock, self._link.call("stats", not fast), keep)
        elif route == (b"POST", b"/_reset"):
            self._link.call("reset", _as_bool(query.get("profiles", "0")))
            self._send_json(sock, {"reset": True}, keep)
        elif route == (b"GET", b"/_deliveries"):
            _send_rows(sock, self._link.call("deliveries", None), not keep)
        elif path.startswith(b"/_profile/") and len(path) > len(b"/_profile/"):
            key = unquote(path[len(b"/_profile/"):].decode("utf-8", "replace"))
            self._profile_route(sock, method, key, body, keep)
        else:
            raise _HttpError(404)
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
                sock.sendall(_payload_response(400, str(exc).encode(), "text/plain", not keep))
                return
        else:
            raise _HttpError(405)
        self._link.call("profile", (key, spec))
        self._send_json(sock, {"key": key, "profile": spec}, keep)

    @staticmethod
    def _send_json(sock: socket.socket, document: Any, keep: bool) -> None:
        body = json.dumps(document).encode("utf-8")
        sock.sendall(_payload_response(200, body, "application/json", not keep))


def _send_rows(sock: socket.socket, rows: Iterable[_Row], close: bool) -> None:
    """Stream the CSV in chunks so 10^6 rows never sit in memory as one body."""
    sock.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/csv; charset=utf-8\r\n"
        b"Transfer-Encoding: chunked\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n"
    )
    batch: list[bytes] = []
    for line in _csv_lines(rows):
        batch.append(line)
        if len(batch) == 4096:
            _send_chunk(sock, b"".join(batch))
            batch.clear()
    _send_chunk(sock, b"".join(batch))
    sock.sendall(b"0\r\n\r\n")


def _send_chunk(sock: socket.socket, data: bytes) -> None:
    if data:
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))


# --------------------------------------------------------------------------- processes


def _listen_socket(host: str, port: int, *, reuse_port: bool, listen: bool = True) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(4096)
    return sock


def _announce(host: str, port: int, ready_file: str | None, processes: int) -> None:
    if ready_file:
        document = {"host": host, "port": port, "pid": os.getpid(), "processes": processes}
        partial = f"{ready_file}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(document, handle)
        os.replace(partial, ready_file)  # readers never see a half-written file
    print(f"LISTENING {host}:{port}", flush=True)


def _stop_on_signals_and_stdin(stop: Event, watch_stdin: bool) -> None:
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    if watch_stdin:
        gevent.spawn(_wait_for_stdin_eof, stop)


def _wait_for_stdin_eof(stop: Event) -> None:
    # The parent holds our stdin open; EOF means it died, even by SIGKILL.
    fd = sys.stdin.fileno()
    gevent.os.make_nonblocking(fd)
    try:
        while gevent.os.nb_read(fd, 4096):
            pass
    except OSError:
        pass
    stop.set()


def _new_rng(seed: int | None, row: int) -> random.Random:
    return random.Random(None if seed is None else seed * 1000 + row)


def _run_single(options: argparse.Namespace, keys: Sequence[bytes], profiles: Mapping[str, Profile]) -> int:
    started = time.time()
    state = _State(_InFlight(1, options.max_endpoints), profiles)
    server = _Server(state, _LocalLink(state, started), keys, _new_rng(options.seed, 0))
    host, port = options.listen
    listener = _listen_socket(host, port, reuse_port=False)
    stream = StreamServer(listener, server.handle)
    stream.start()
    stop = Event()
    _stop_on_signals_and_stdin(stop, options.watch_stdin)
    _announce(host, listener.getsockname()[1], options.ready_file, 1)
    stop.wait()
    stream.stop(timeout=1)
    return 0


def _run_child(
    options: argparse.Namespace, row: int, channel: _Channel, gauge: _InFlight,
    keys: Sequence[bytes], profiles: Mapping[str, Profile], port: int,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the supervisor handles ^C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gauge.adopt_row(row)
    state = _State(gauge, profiles)
    link = _ChildLink(channel, state)
    state.allocate = link.slot
    server = _Server(state, link, keys, _new_rng(options.seed, row))
    # One SO_REUSEPORT socket per child: the kernel spreads connections evenly,
    # where a single shared socket lets whichever process wakes first take a burst.
    listener = _listen_socket(options.listen[0], port, reuse_port=True)
    StreamServer(listener, server.handle).start()
    channel.send(("ready", os.getpid()))
    link.run()


class _Supervisor:
    """Parent of --processes N children: fans control operations out and merges."""

    def __init__(self, channels: Sequence[_Channel], pids: Sequence[int], gauge: _InFlight) -> None:
        self._channels = list(channels)
        self._pids = list(pids)
        self._gauge = gauge
        self._capacity = gauge.slots
        self._slots: dict[str, int] = {}
        self._waiting: dict[int, list[AsyncResult]] = {}
        self._tokens = itertools.count()
        self._ready = 0
        self._all_ready = Event()
        self._stop = Event()
        self._stopping = False
        self._failed = False
        self._started = time.time()

    def run(self, options: argparse.Namespace, port: int) -> int:
        for row, channel in enumerate(self._channels):
            gevent.spawn(self._read, row, channel)
        _stop_on_signals_and_stdin(self._stop, options.watch_stdin)
        gevent.wait([self._all_ready, self._stop], count=1, timeout=30)
        if self._all_ready.is_set() and not self._stop.is_set():
            _announce(options.listen[0], port, options.ready_file, len(self._pids))
            self._stop.wait()
        else:
            self._failed = True
        self._stopping = True
        healthy = self._terminate()
        return 0 if healthy and not self._failed else 1

    def _read(self, row: int, channel: _Channel) -> None:
        while (message := channel.recv()) is not None:
            kind = message[0]
            if kind == "ready":
                self._ready += 1
                if self._ready == len(self._channels):
                    self._all_ready.set()
            elif kind == "call":
                gevent.spawn(self._serve_call, channel, *message[1:])
            elif kind == "done":
                waits = self._waiting.get(message[1])
                if waits is not None:
                    waits[row].set(message[2])
        if not self._stopping:
            self._stop.set()  # a child is gone: _terminate tells a crash from a group SIGTERM

    def _serve_call(self, origin: _Channel, request: int, op: str, arg: Any) -> None:
        try:
            value = self._slot(arg) if op == "slot" else self._fan_out(op, arg)
        except Exception as exc:  # reported to the calling child, which answers 500
            origin.send(("result", request, False, repr(exc)))
        else:
            origin.send(("result", request, True, value))

    def _slot(self, key: str) -> int:
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= self._capacity:
                return -1
            slot = self._slots[key] = len(self._slots)
        return slot

    def _fan_out(self, op: str, arg: Any) -> Any:
        levels = {key: self._gauge.level(slot) for key, slot in self._slots.items()}  # see merge_stats
        token = next(self._tokens)
        waits = self._waiting[token] = [AsyncResult() for _ in self._channels]
        try:
            for channel in self._channels:
                channel.send(("do", token, op, arg))
            results = [wait.get(timeout=CALL_TIMEOUT) for wait in waits]
        finally:
            del self._waiting[token]
        if op == "stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return merge_stats(results, self._started, (usage.ru_utime, usage.ru_stime), levels)
        if op == "deliveries":
            return merge_rows(results)
        return None

    def _terminate(self) -> bool:
        """Stop and reap every child; False if one of them had died on its own."""
        for pid in self._pids:
            _signal_quietly(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        healthy = True
        for pid in self._pids:
            expected = {signal.SIGTERM}  # ours, or a group-wide one (ReceiverProcess, timeout(1))
            while (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
                if time.monotonic() > deadline:
                    _signal_quietly(pid, signal.SIGKILL)
                    expected.add(signal.SIGKILL)
                    status = os.waitpid(pid, 0)
                    break
                gevent.sleep(0.02)
            code = status[1]
            if code != 0 and not (os.WIFSIGNALED(code) and os.WTERMSIG(code) in expected):
                print(f"receiver: child {pid} failed (wait status {code})", file=sys.stderr)
                healthy = False
        return healthy


def _signal_quietly(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _run_supervisor(options: argparse.Namespace, keys: Sequence[bytes], profiles: Mapping[str, Profile]) -> int:
    host, port = options.listen
    # Bound but never listening: it reserves the port (port 0 picks it) and, not
    # being in the accept group, never receives a connection itself.
    reservation = _listen_socket(host, port, reuse_port=True, listen=False)
    port = reservation.getsockname()[1]
    gauge = _InFlight(options.processes, options.max_endpoints)
    pairs = [socket.socketpair() for _ in range(options.processes)]
    pids: list[int] = []
    for row in range(options.processes):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                reservation.close()
                for other, (parent_end, child_end) in enumerate(pairs):
                    parent_end.close()
                    if other != row:
                        child_end.close()
                _run_child(options, row, _Channel(pairs[row][1]), gauge, keys, profiles, port)
                code = 0  # the supervisor went away
            except BaseException:  # a child must never return into the supervisor's code
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    for _, child_end in pairs:
        child_end.close()
    supervisor = _Supervisor([_Channel(parent_end) for parent_end, _ in pairs], pids, gauge)
    return supervisor.run(options, port)


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dispatcher.receiver", description=__doc__ or "Mock webhook receiver.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--listen", type=_listen_address, default=("127.0.0.1", 0), help="HOST:PORT (port 0: pick one)")
    parser.add_argument("--secret", action="append", default=[], help="signing secret, plain or whsec_ (repeatable)")
    parser.add_argument("--profiles", help="YAML file: endpoint-key -> profile fields")
    parser.add_argument("--processes", type=int, default=1, help="serving processes sharing the port")
    parser.add_argument("--ready-file", help="write {host, port, pid} JSON here once accepting")
    parser.add_argument("--seed", type=int, help="seed for the random latencies and errors")
    parser.add_argument("--max-endpoints", type=int, default=DEFAULT_MAX_ENDPOINTS)
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin reaches EOF")
    options = parser.parse_args(argv)
    if options.processes < 1:
        parser.error("--processes must be at least 1")
    return options


def _raise_file_limit() -> None:
    # Benchmarks may hold thousands of keep-alive connections; the soft default
    # (often 1024) would make accept() fail long before the CPU runs out.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse_args(argv)
    _raise_file_limit()
    keys = tuple(dict.fromkeys(secret_key(secret) for secret in options.secret))
    profiles = _load_profile_file(options.profiles) if options.profiles else {}
    if options.processes == 1:
        return _run_single(options, keys, profiles)
    return _run_supervisor(options, keys, profiles)


# --------------------------------------------------------------------------- library API


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook-id as one endpoint saw it (a /_deliveries row)."""

    webhook_id: str
    endpoint: str
    first_2xx_ts: float | None   # time.time() when the first 2xx answer was sent
    count: int                   # requests with a valid signature carrying this id
    ok: int                      # of those, answered 2xx
    attempts: tuple[str, ...]    # every X-Larkspur-Attempt seen ("-" when absent)
    idempotency_keys: tuple[str, ...]  # the distinct Idempotency-Key values seen


def signed_headers(
    secrets: str | Sequence[str], webhook_id: str, body: bytes, *,
    attempt: int | None = 1, idempotency_key: str | None = None, timestamp: int | None = None,
) -> dict[str, str]:
    """Headers of a correctly signed delivery (the Idempotency-Key defaults to the id)."""
    secret_list = [secrets] if isinstance(secrets, str) else list(secrets)
    stamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature_header(
            [secret_key(s) for s in secret_list], webhook_id, stamp, body
        ),
        "Idempotency-Key": webhook_id if idempotency_key is None else idempotency_key,
    }
    if attempt is not None:
        headers["X-Larkspur-Attempt"] = str(attempt)
    return headers


# Bound, never listening: a connect gets RST (ECONNREFUSED) and, while held, no
# other socket on the host can take the port.
_CLOSED_PORTS: list[socket.socket] = []


def closed_port_url(key: str = "down") -> str:
    """A URL on 127.0.0.1 whose port refuses connections for this process's lifetime."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    _CLOSED_PORTS.append(sock)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/down/{quote(key, safe='')}"


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Finaliser: leave no receiver processes behind, whatever happened to the caller."""
    if process.poll() is None:
        # The leader is not reaped yet, so its pid (= the group id) cannot be reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class ReceiverProcess:
    """``python -m dispatcher.receiver`` on 127.0.0.1 with an ephemeral port
    (or ``port``, e.g. to bring back an endpoint that was down).

    Use as a context manager; it stops the receiver (and its children) on exit,
    and a finaliser kills it if the object is dropped or the interpreter exits.
    """

    def __init__(
        self, secrets: Sequence[str] = (), *, profiles: Mapping[str, Any] | str | Path | None = None,
        processes: int = 1, seed: int | None = None, max_endpoints: int | None = None,
        startup_timeout: float = 20.0, control_timeout: float = 120.0, port: int = 0,
    ) -> None:
        self.secrets = [secrets] if isinstance(secrets, str) else list(secrets)
        self._profiles = profiles
        self._processes = processes
        self._seed = seed
        self._max_endpoints = max_endpoints
        self._startup_timeout = startup_timeout
        self._control_timeout = control_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], ReceiverProcess] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.host = "127.0.0.1"
        self.port = port

    # lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError("already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="receiver-")
        workdir = Path(self._workdir.name)
        ready = workdir / "ready.json"
        log = open(workdir / "receiver.log", "wb")  # noqa: SIM115 -- handed to the child
        try:
            self._process = subprocess.Popen(
                self._command(workdir, ready), stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env=self._environment(),
            )
        finally:
            log.close()
        self._finalizer = weakref.finalize(self, _kill_group, self._process)
        try:
            self._wait_ready(ready, workdir / "receiver.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, workdir: Path, ready: Path) -> list[str]:
        command = [
            sys.executable, "-m", "dispatcher.receiver", "--listen", f"{self.host}:{self.port}",
            "--ready-file", str(ready), "--processes", str(self._processes), "--watch-stdin",
        ]
        for secret in self.secrets:
            command += ["--secret", secret]
        if self._seed is not None:
            command += ["--seed", str(self._seed)]
        if self._max_endpoints is not None:
            command += ["--max-endpoints", str(self._max_endpoints)]
        if isinstance(self._profiles, Mapping):
            path = workdir / "profiles.yaml"
            path.write_text(json.dumps(self._profiles), encoding="utf-8")  # JSON is YAML
            command += ["--profiles", str(path)]
        elif self._profiles is not None:
            command += ["--profiles", str(self._profiles)]
        return command

    @staticmethod
    def _environment() -> dict[str, str]:
        # The child must import this very checkout, wherever the caller runs from.
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def _wait_ready(self, ready: Path, log: Path) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while not ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
                raise RuntimeError(f"receiver did not start (exit {self._process.poll()}):\n{tail}")
            time.sleep(0.01)
        self.port = int(json.loads(ready.read_text(encoding="utf-8"))["port"])

    def stop(self) -> None:
        """SIGTERM the receiver's process group, then SIGKILL whatever is left."""
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=5)
                except ProcessLookupError:
                    pass
                except subprocess.TimeoutExpired:
                    _kill_group(process)
            process.wait()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    # addresses and control -------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, profile: str, key: str, **params: Any) -> str:
        """``url("error", "ep1", rate=0.5)`` -> ``http://127.0.0.1:P/error/ep1?rate=0.5``."""
        if profile not in BASE_PROFILES:
            raise ValueError(f"unknown profile {profile!r}")
        query = urlencode({k: _query_value(v) for k, v in params.items()})
        return f"{self.base_url}/{profile}/{quote(key, safe='')}" + (f"?{query}" if query else "")

    def _request(self, method: str, path: str, body: bytes | None = None) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self._control_timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read().decode("utf-8", "replace")
            connection.close()
            raise RuntimeError(f"{method} {path}: {response.status} {detail}")
        return response

    def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        response = self._request(method, path, body)
        try:
            return json.loads(response.read())
        finally:
            response.close()

    def healthy(self) -> bool:
        try:
            self._request("GET", "/_healthz").close()
        except OSError:
            return False
        return True

    def stats(self, *, fast: bool = False) -> dict[str, Any]:
        """The /_stats document; ``fast`` skips the cross-process id merge (unique: null)."""
        return dict(self._json("GET", "/_stats?fast=1" if fast else "/_stats"))

    def endpoint(self, key: str, *, fast: bool = False) -> dict[str, Any]:
        """One endpoint's counters ({} if it has seen nothing)."""
        return dict(self.stats(fast=fast)["endpoints"].get(key, {}))

    def deliveries(self) -> list[Delivery]:
        return list(self.iter_deliveries())

    def iter_deliveries(self) -> Iterator[Delivery]:
        """Stream /_deliveries without holding 10^6 rows twice."""
        response = self._request("GET", "/_deliveries")
        try:
            reader = csv.reader(io.TextIOWrapper(response, encoding="utf-8", newline=""))
            next(reader, None)  # header
            for wid, key, first, count, ok, attempts, idem in reader:
                yield Delivery(
                    wid, key, float(first) if first else None, int(count), int(ok),
                    tuple(attempts.split()), tuple(idem.split()),
                )
        finally:
            response.close()

    def set_profile(self, key: str, profile: Mapping[str, Any] | str | None) -> None:
        """Override ``key``'s profile in every process (None restores the URL's/file's)."""
        if profile is None:
            self._json("DELETE", f"/_profile/{quote(key, safe='')}")
            return
        spec = {"profile": profile} if isinstance(profile, str) else dict(profile)
        self._json("POST", f"/_profile/{quote(key, safe='')}", json.dumps(spec).encode())

    def reset(self, *, profiles: bool = False) -> None:
        """Forget all counters (and the runtime profile overrides when ``profiles``)."""
        self._json("POST", "/_reset?profiles=1" if profiles else "/_reset")

    def wait_until(
        self, predicate: Callable[[dict[str, Any]], bool], *, timeout: float = 10.0,
        interval: float = 0.02, fast: bool = False,
    ) -> dict[str, Any]:
        """Poll /_stats until ``predicate(stats)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats(fast=fast)
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s; last stats: {stats}")
            time.sleep(interval)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
