"""Name resolution for outbound requests: bounded, cached, shared, and fair between workspaces.

gevent's default resolver runs ``getaddrinfo`` on a pool of 10 threads.  A
lookup abandoned by its caller's deadline keeps its thread until the system
resolver gives up, and failures are not cached, so 10 endpoints on a
black-holed DNS zone could occupy every thread and make a different
workspace's healthy deliveries time out.  This resolver instead:

* asks DNS itself with dnspython (its UDP/TCP client runs on gevent's
  patched sockets, so a lookup is a greenlet, not a thread), pointed at
  ``http.dns_servers`` or, when that is empty, the system's nameservers
  (``/etc/resolv.conf``); names in ``/etc/hosts`` are answered from it first;
* bounds each lookup (``http.dns_timeout``): past it the lookup greenlet is
  killed, its socket closed, and it fails as ``dns``;
* caches answers for their TTL clamped to [``MIN_TTL``, ``http.dns_max_ttl``],
  a name that does not exist for the zone's negative TTL (SOA minimum) within
  the same bounds, and any other failure (a timeout, SERVFAIL) for
  ``FAILURE_TTL``, so a black-holed name costs one lookup per interval, not
  one per attempt;
* runs at most one lookup per name at a time: concurrent callers wait for
  the same answer;
* lets each workspace run at most ``http.dns_per_workspace`` lookups at once;
  a caller past that waits for a slot (its whole wait, slot and answer, is
  within ``dns_timeout``), so one
  workspace's bad zone cannot hold every lookup of the process.  A caller
  still without a slot then fails as ``dns``, alone: the refusal is neither
  cached nor handed to another workspace waiting on the same name, so one
  workspace cannot make another's deliveries fail (and trip its breaker).

Only addresses come out of here; the outbound policy checks them
(``netguard.check_addresses``) before anything is dialed.  This module
imports gevent: it is used only in the patched worker processes.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver
import gevent
from gevent.event import AsyncResult
from gevent.lock import BoundedSemaphore

from dispatcher.outbound.netguard import DnsError, read_hosts

log = logging.getLogger(__name__)

# Sane bounds on what a zone may ask us to cache.
MIN_TTL = 5.0
# A lookup that failed without an answer (timeout, SERVFAIL, refused) is not retried for this long.
FAILURE_TTL = 10.0
CACHE_ENTRIES = 16384


@dataclass(frozen=True, slots=True)
class _Entry:
    until: float
    addresses: tuple[str, ...]   # empty: the failure below
    failure: str = ""


def _nameservers(servers: Sequence[str]) -> list[Any]:
    """``ip`` or ``ip:port`` (``[v6]:port``) strings as dnspython nameservers."""
    out: list[Any] = []
    for server in servers:
        host, port = server, 53
        if server.startswith("["):
            host, _, rest = server[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else 53
        elif server.count(":") == 1:
            host, _, text = server.partition(":")
            port = int(text)
        out.append(dns.nameserver.Do53Nameserver(str(ipaddress.ip_address(host)), port))
    return out


class DnsLookups:
    """What both resolvers share: dnspython pointed at the servers, the hosts file, the TTL cache.
    No gevent here: the flag-off path's threads use it too (``dispatcher/outbound/legacy.py``)."""

    def __init__(self, servers: Sequence[str] = (), timeout: float = 2.0, max_ttl: float = 300.0,
                 hosts: dict[str, tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._resolver = dns.resolver.Resolver(configure=not servers)
        if servers:
            self._resolver.nameservers = _nameservers(servers)
        self._resolver.lifetime = timeout
        self._resolver.timeout = timeout
        self._timeout = timeout
        self._max_ttl = max(MIN_TTL, max_ttl)
        self._hosts = read_hosts() if hosts is None else hosts
        self._clock = clock
        self._cache: dict[str, _Entry] = {}

    def _cached(self, name: str) -> _Entry | None:
        entry = self._cache.get(name)
        return entry if entry is not None and entry.until > self._clock() else None

    def _lookup(self, name: str, until: float | None = None) -> _Entry:
        """Ask DNS (A, then AAAA), both within the timeout and by ``until`` (on the clock) if given."""
        addresses: list[str] = []
        ttl = self._max_ttl
        negative: float | None = None
        failure = ""
        for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            lifetime = self._timeout if until is None else min(self._timeout, until - self._clock())
            try:
                if lifetime <= 0:
                    raise dns.exception.Timeout
                answer = self._resolver.resolve(name, rdtype, search=False, lifetime=lifetime)
            except dns.resolver.NXDOMAIN as exc:
                negative, failure = self._negative_ttl(exc), "no such name"
                break
            except dns.resolver.NoAnswer:
                failure = failure or "no address"
                continue
            except dns.exception.Timeout:
                return _Entry(self._clock() + FAILURE_TTL, (), "timed out")
            except dns.exception.DNSException as exc:
                return _Entry(self._clock() + FAILURE_TTL, (), type(exc).__name__)
            addresses.extend(str(r.address) for r in answer)
            ttl = min(ttl, float(answer.rrset.ttl) if answer.rrset is not None else ttl)
        if addresses:
            return _Entry(self._clock() + self._clamp(ttl), tuple(dict.fromkeys(addresses)))
        return _Entry(self._clock() + self._clamp(negative if negative is not None else MIN_TTL), (),
                      failure or "no address")

    def _negative_ttl(self, exc: dns.resolver.NXDOMAIN) -> float:
        """The zone's negative TTL (its SOA minimum, RFC 2308), or the lower bound."""
        for response in exc.responses().values():
            for rrset in response.authority:
                if rrset.rdtype == dns.rdatatype.SOA:
                    return float(min(rrset.ttl, rrset[0].minimum))
        return MIN_TTL

    def _clamp(self, ttl: float) -> float:
        return min(max(ttl, MIN_TTL), self._max_ttl)

    def _remember(self, name: str, entry: _Entry) -> None:
        if len(self._cache) >= CACHE_ENTRIES:
            now = self._clock()
            self._cache = {k: v for k, v in self._cache.items() if v.until > now}
            while len(self._cache) >= CACHE_ENTRIES:
                self._cache.pop(next(iter(self._cache)))
        self._cache[name] = entry


class DnsResolver(DnsLookups):
    """See the module docstring.  ``resolve(host, workspace)`` returns addresses or raises DnsError."""

    def __init__(self, servers: Sequence[str] = (), timeout: float = 2.0, max_ttl: float = 300.0,
                 per_workspace: int = 4, hosts: dict[str, tuple[str, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(servers, timeout, max_ttl, hosts, clock)
        self._per_workspace = per_workspace
        self._in_flight: dict[str, AsyncResult] = {}
        self._slots: dict[str, BoundedSemaphore] = {}

    def resolve(self, host: str, workspace: str | None = None) -> list[str]:
        name = host.lower().rstrip(".")
        if name in self._hosts:
            return list(self._hosts[name])
        entry = self._cached(name) or self._shared_lookup(name, workspace or "")
        if not entry.addresses:
            raise DnsError(f"{host} does not resolve ({entry.failure})")
        return list(entry.addresses)

    def _shared_lookup(self, name: str, workspace: str) -> _Entry:
        """One lookup per name at a time: a caller arriving meanwhile waits for the same answer.

        Only an answer from DNS is shared.  A caller refused a slot is refused alone (its
        workspace's cap is not another's).  The lookup runs in a greenlet of its own, so a
        caller cut off by its deadline does not take it down: its answer still reaches the
        other waiters and the cache.
        """
        until = time.monotonic() + self._timeout  # a caller's whole wait, slot included
        pending = self._in_flight.get(name) or self._start_lookup(name, workspace, until)
        try:
            entry: _Entry = pending.get(timeout=max(0.0, until - time.monotonic()))
        except gevent.Timeout:
            return _Entry(0.0, (), "timed out")  # this caller's wait only: the lookup goes on
        return entry

    def _start_lookup(self, name: str, workspace: str, until: float) -> AsyncResult:
        """Take a slot of ``workspace`` (or fail as dns, alone) and start the name's lookup under it."""
        slots = self._slots.setdefault(workspace, BoundedSemaphore(self._per_workspace))
        if not slots.acquire(timeout=max(0.0, until - time.monotonic())):
            self._forget_slots(workspace, slots)
            raise DnsError(f"{name} does not resolve (too many lookups in flight for this workspace)")
        pending = self._in_flight.get(name)  # started by another workspace while this caller waited
        entry = self._cached(name)
        if pending is not None or entry is not None:
            slots.release()
            self._forget_slots(workspace, slots)
            if pending is None:
                pending = AsyncResult()
                pending.set(entry)
            return pending
        pending = self._in_flight[name] = AsyncResult()
        gevent.spawn(self._run_lookup, name, pending, workspace, slots)
        return pending

    def _run_lookup(self, name: str, pending: AsyncResult, workspace: str, slots: BoundedSemaphore) -> None:
        entry = _Entry(self._clock() + FAILURE_TTL, (), "lookup failed")
        try:
            entry = self._bounded_lookup(name)
            self._remember(name, entry)
        finally:
            del self._in_flight[name]
            pending.set(entry)
            slots.release()
            self._forget_slots(workspace, slots)

    def _forget_slots(self, workspace: str, slots: BoundedSemaphore) -> None:
        if not slots.locked() and slots.counter == self._per_workspace and self._slots.get(workspace) is slots:
            self._slots.pop(workspace, None)  # bounded by the workspaces with lookups in flight

    def _bounded_lookup(self, name: str) -> _Entry:
        lookup = gevent.spawn(self._lookup, name)
        try:
            entry: _Entry | None = lookup.get(timeout=self._timeout + 0.5)
        except gevent.Timeout:
            entry = None
        finally:
            lookup.kill(block=False)  # an abandoned lookup ends here, its socket closed
        return entry or _Entry(self._clock() + FAILURE_TTL, (), "timed out")
