"""DNS (issue 13 item 3): a black-holed zone must not hold up other workspaces.

A real DNS server runs in the test (dnslib, UDP on a loopback port) with one
zone that never answers and one that does; the dispatcher is pointed at it
with ``http.dns_servers``.  Outcomes are asserted, never timings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSServer

from dispatcher_devtools.kit import Dispatcher, produce, query, seed_workspace, status_counts
from dispatcher_devtools.receiver import ReceiverProcess
from tests.support import run_green
from tests.support.faults import settle

pytestmark = pytest.mark.timeout(90)


class Zones(BaseResolver):  # type: ignore[misc]
    """``*.lit.test`` answers 127.0.0.1 (TTL 60); ``*.dark.test`` never answers; ``*.slow.test`` answers A
    with no address after 0.5 s and never answers AAAA; anything else is NXDOMAIN."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.queries: list[str] = []

    def resolve(self, request, handler):  # type: ignore[no-untyped-def]
        name = str(request.q.qname).rstrip(".").lower()
        self.queries.append(name)
        reply = request.reply()
        if name.endswith(".dark.test"):
            self.release.wait(60)  # a black hole: the answer never comes in time
        elif name.endswith(".slow.test"):
            # A lookup that holds its slot past one dns_timeout: A (empty) late, AAAA never.
            self.release.wait(0.5 if request.q.qtype == QTYPE.A else 60)
        elif name.endswith(".lit.test"):
            if request.q.qtype == QTYPE.A:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("127.0.0.1"), ttl=60))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@pytest.fixture
def dns_server() -> Iterator[tuple[Zones, int]]:
    zones = Zones()
    server = DNSServer(zones, port=0, address="127.0.0.1")
    server.start_thread()
    if not server.isAlive():
        pytest.fail("the test DNS server did not start")
    try:
        yield zones, server.server.server_address[1]
    finally:
        zones.release.set()
        server.stop()


@pytest.fixture
def receiver() -> Iterator[ReceiverProcess]:
    from dispatcher_devtools.kit import SECRET

    with ReceiverProcess(secrets=[SECRET]) as rx:
        yield rx


def test_a_black_holed_zone_does_not_hold_up_another_workspaces_deliveries(
        db, write_config, tmp_path: Path, receiver: ReceiverProcess, dns_server: tuple[Zones, int]) -> None:
    zones, dns_port = dns_server
    dark = seed_workspace(db.dsn, "dark", [f"http://h{i}.dark.test:{receiver.port}/ok/dark{i}" for i in range(10)])
    lit = seed_workspace(db.dsn, "lit", [f"http://ok.lit.test:{receiver.port}/ok/lit",
                                         f"http://two.lit.test:{receiver.port}/ok/lit2"])
    config = write_config(db, http={"dns_servers": [f"127.0.0.1:{dns_port}"], "dns_timeout": "1s", "timeout": "2s",
                                    "require_https": False, "allow_private_networks": True},
                          retry={"base": "200ms", "jitter": 0}, breaker={"failure_threshold": 1000})
    produce(config, db.dsn, "dark", 5)
    lit_events = produce(config, db.dsn, "lit", 20)

    def dark_failed_twice() -> bool:
        return query(db.dsn, "SELECT min(attempt) FROM webhook_deliveries WHERE endpoint_id = ANY(%s)",
                     (dark,))[0][0] >= 2

    with Dispatcher(config, tmp_path / "d.log") as dispatcher:
        settle(dispatcher, db.dsn, lambda: status_counts(db.dsn).get("delivered") == 40 and dark_failed_twice(),
               "every lit row delivered while the dark rows keep failing")
        log = dispatcher.log()
    seen = {(d.webhook_id, d.endpoint) for d in receiver.deliveries() if d.ok}
    assert {e for e, endpoint in seen if endpoint == "lit"} == set(lit_events)
    dark_rows = query(db.dsn, "SELECT status, last_error FROM webhook_deliveries WHERE endpoint_id = ANY(%s)",
                      (dark,))
    assert len(dark_rows) == 50 and all(r == ("pending", "dns: name did not resolve") for r in dark_rows), dark_rows
    results = query(db.dsn, "SELECT DISTINCT result FROM webhook_delivery_attempts a JOIN webhook_deliveries d"
                            " ON d.id = a.delivery_id WHERE d.endpoint_id = ANY(%s)", (dark,))
    assert results == [("dns",)]
    assert query(db.dsn, "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ANY(%s) AND status"
                         " <> 'delivered'", (lit,)) == [(0,)]
    # The names were asked of the test's server (the real DNS path), and the operators' log names them.
    assert any(q.endswith(".dark.test") for q in zones.queries) and "ok.lit.test" in zones.queries
    assert "dark.test does not resolve (timed out)" in log
    # Answers and failures are cached and a name has one lookup in flight: each name was asked
    # fewer times than its endpoint was attempted (without either, every attempt asks at least once).
    attempts = dict(query(db.dsn, "SELECT e.url, count(*) FROM webhook_delivery_attempts a JOIN webhook_deliveries d"
                                  " ON d.id = a.delivery_id JOIN webhook_endpoints e ON e.id = d.endpoint_id"
                                  " GROUP BY e.url"))
    for url, count in attempts.items():
        name = url.split("//", 1)[1].split(":", 1)[0]
        assert zones.queries.count(name) < count, (name, zones.queries.count(name), count)


def test_a_workspaces_lookup_refusal_is_not_handed_to_another_workspace(dns_server: tuple[Zones, int]) -> None:
    """An attacker workspace past its lookup cap asks for the victim's name just before the victim does:
    the refusal is the attacker's alone, and it is not cached for the name."""
    zones, dns_port = dns_server
    out = run_green("tests.support.faults:resolve_while_a_workspace_is_refused", {"dns_port": dns_port})
    assert out["holder"] == "DnsError: hold.slow.test does not resolve (timed out)", out
    assert out["attacker"] == ("DnsError: shared.lit.test does not resolve "
                               "(too many lookups in flight for this workspace)"), out
    assert out["victim"] == ["127.0.0.1"], out
    assert out["victim_again"] == ["127.0.0.1"], out
    assert "shared.lit.test" in zones.queries
