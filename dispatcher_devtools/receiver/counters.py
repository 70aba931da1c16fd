"""What the receiver counts: per-process counters, the shared-memory in-flight
gauge, and merging several processes' snapshots into /_stats and /_deliveries."""

from __future__ import annotations

import csv
import io
import mmap
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from dispatcher_devtools.receiver.profiles import Profile, profile_from_mapping
from dispatcher_devtools.receiver.wire import HttpError

CSV_HEADER: Final = (
    "webhook_id", "endpoint", "first_2xx_ts", "count", "ok", "attempts", "idempotency_keys",
)

# --------------------------------------------------------------------------- counting


class Seen:
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


class EndpointCounters:
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
        self.ids: dict[bytes, Seen] = {}


def add_token(existing: bytes | None, token: bytes) -> bytes:
    if existing is None or existing == token:
        return token
    if token in existing.split(b" "):
        return existing
    return existing + b" " + token


class InFlight:
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


Row = tuple[str, bytes, int, int, float | None, bytes, bytes | None]


class State:
    """One process's counters and profile overrides."""

    def __init__(self, gauge: InFlight, file_profiles: Mapping[str, Profile]) -> None:
        self.gauge = gauge
        self.file_profiles = dict(file_profiles)
        self.runtime: dict[str, Profile] = {}
        self.endpoints: dict[str, EndpointCounters] = {}
        # Slots outlive /_reset: requests in flight across a reset still leave their slot.
        self.slots: dict[str, int] = {}
        self.allocate: Callable[[str], int] = self._allocate_locally
        # TLS handshakes completed, and how many of them resumed a session: how
        # well a client's keep-alive and session reuse hold (the tls benchmark).
        self.tls_handshakes = 0
        self.tls_resumed = 0

    def _allocate_locally(self, key: str) -> int:
        return len(self.slots) if len(self.slots) < self.gauge.slots else -1

    def endpoint(self, key: str) -> EndpointCounters:
        ep = self.endpoints.get(key)
        if ep is not None:
            return ep
        slot = self.slots.get(key)
        if slot is None:
            slot = self.allocate(key)  # may switch greenlets (asks the supervisor)
            if slot < 0:
                raise HttpError(507)
            self.slots[key] = slot
        return self.endpoints.setdefault(key, EndpointCounters(slot))

    def profile_for(self, key: str, url_profile: Profile) -> Profile:
        profile = self.runtime.get(key)
        if profile is None:
            profile = self.file_profiles.get(key, url_profile)
        return profile

    @staticmethod
    def record(ep: EndpointCounters, wid: bytes, headers: Mapping[bytes, bytes]) -> Seen:
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
            seen = ep.ids[wid] = Seen(attempt, wid if idem == wid else idem)
            return seen
        seen.count += 1
        seen.attempts += b" " + attempt
        if idem is not None:
            seen.idem = add_token(seen.idem, idem)
        return seen

    @staticmethod
    def answered(ep: EndpointCounters, seen: Seen | None, status: int) -> None:
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
        if op == "ids":
            return self.ids_blob()
        if op == "reset":
            self.endpoints = {}
            self.tls_handshakes = self.tls_resumed = 0
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
            "tls": (self.tls_handshakes, self.tls_resumed),
            "endpoints": {
                key: self._endpoint_snapshot(ep, with_ids) for key, ep in self.endpoints.items()
            },
        }

    def _endpoint_snapshot(self, ep: EndpointCounters, with_ids: bool) -> dict[str, Any]:
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

    def ids_blob(self) -> bytes:
        """Every webhook-id this process recorded, on any endpoint, newline-separated
        (one blob pickles far faster than 10^6 small bytes objects)."""
        return b"\n".join({wid for ep in list(self.endpoints.values()) for wid in ep.ids})

    def rows(self) -> Iterator[Row]:
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
    for name in ("max_concurrency", "in_flight"):  # already global (InFlight); see merge_stats
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
    handshakes = resumed = 0
    for snap in snapshots:
        user += snap["cpu"][0]
        system += snap["cpu"][1]
        handshakes += snap.get("tls", (0, 0))[0]
        resumed += snap.get("tls", (0, 0))[1]
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
        "tls_handshakes": handshakes, "tls_resumed": resumed,
    }


def merge_rows(parts: Sequence[Sequence[Row]]) -> list[Row]:
    """Per-(endpoint, id) rows folded across processes."""
    if len(parts) == 1:
        return list(parts[0])
    merged: dict[tuple[str, bytes], Row] = {}
    for part in parts:
        for row in part:
            prior = merged.get((row[0], row[1]))
            merged[(row[0], row[1])] = row if prior is None else _fold_row(prior, row)
    return list(merged.values())


def _fold_row(a: Row, b: Row) -> Row:
    key, wid, count, ok, first, attempts, idem = a
    firsts = [t for t in (first, b[4]) if t is not None]
    # Across processes the arrival order is lost; sorted is at least deterministic.
    tokens = sorted((attempts + b" " + b[5]).split(), key=lambda t: (not t.isdigit(), int(t) if t.isdigit() else 0, t))
    for token in (b[6] or b"").split():
        idem = add_token(idem, token)
    return key, wid, count + b[2], ok + b[3], min(firsts) if firsts else None, b" ".join(tokens), idem


def write_ids(path: str, blobs: Iterable[bytes]) -> int:
    """Write the distinct ids in ``blobs`` (one per serving process) to ``path``, one
    per line, sorted so two exports compare with diff; returns how many.

    The file is replaced atomically: a rollout gate polling it never reads half a list.
    """
    ids = sorted(_union(blobs))
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as handle:
        handle.writelines(wid + b"\n" for wid in ids)
    os.replace(partial, path)
    return len(ids)


def _csv_row(row: Row) -> tuple[str, ...]:
    key, wid, count, ok, first, attempts, idem = row
    return (
        wid.decode("utf-8", "replace"), key, "" if first is None else f"{first:.6f}",
        str(count), str(ok), attempts.decode("utf-8", "replace"),
        "" if idem is None else idem.decode("utf-8", "replace"),
    )


def csv_lines(rows: Iterable[Row]) -> Iterator[bytes]:
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

