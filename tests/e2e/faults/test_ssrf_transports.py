"""The SSRF guard through the transports: denied literals, rebinding and redirects.

Each case runs the transports in a monkey-patched child (``support.post_green``),
with a stub resolver and a dialer that records every address asked for and
refuses all but loopback -- nothing here ever reaches another machine.  The
pure policy functions are tested in ``tests/unit/test_ssrf.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import KINDS, LOOPBACK_POLICY, GreenRun, LoopbackServer, post_green, responder, response
from tests.unit.test_ssrf import LITERAL_HOSTS

pytestmark = pytest.mark.timeout(60)


# --------------------------------------------------------------------------- through the transports
@pytest.mark.parametrize("kind", KINDS)
def test_transport_refuses_denied_literals_without_dialing(kind: str) -> None:
    run = post_green(kind, [f"http://{host}:8080/hook" for host, _ in LITERAL_HOSTS], policy=_strict())
    assert [r["error"] for r in run.results] == ["blocked"] * len(LITERAL_HOSTS)
    assert all(r["status"] is None for r in run.results)
    assert run.dials == [] and run.dns_queries == []


@pytest.mark.parametrize("kind", KINDS)
def test_transport_require_https_refuses_before_resolving(kind: str) -> None:
    policy = {**LOOPBACK_POLICY, "require_https": True}
    dns = {"hooks.example.test": [["127.0.0.1"]]}
    run = post_green(kind, ["http://hooks.example.test/hook"], policy=policy, dns=dns)
    assert run.only["error"] == "blocked" and "https" in run.only["detail"]
    assert run.dials == [] and run.dns_queries == []


def _strict() -> dict[str, Any]:
    return {"require_https": False, "allow_private_networks": False, "allow_networks": []}


REBINDING_NAME = "rebind.example.test"
PUBLIC_IP = "93.184.216.34"


def _post_twice_to_a_rebinding_name(kind: str, dns_cache_ttl: float) -> tuple[GreenRun, LoopbackServer]:
    """Two posts to a name whose first answer is public and second 127.0.0.1; the
    test dialer routes the public address to a loopback server, below the policy,
    so nothing leaves the machine."""
    with LoopbackServer(responder(response(200, b"ok"))) as server:
        run = post_green(
            kind,
            [f"http://{REBINDING_NAME}:{server.port}/hook"] * 2,
            policy=_strict(),
            dns={REBINDING_NAME: [[PUBLIC_IP], ["127.0.0.1"]]},
            redirect={PUBLIC_IP: ("127.0.0.1", server.port)},
            dns_cache_ttl=dns_cache_ttl,
        )
    return run, server


@pytest.mark.parametrize("kind", KINDS)
def test_rebinding_name_is_never_dialed_at_loopback(kind: str) -> None:
    """First answer public, second 127.0.0.1: the second attempt is refused, and the
    only address ever dialed is the public one."""
    run, server = _post_twice_to_a_rebinding_name(kind, dns_cache_ttl=0)
    first, second = run.results
    assert first["status"] == 200 and first["error"] is None
    assert (second["error"], second["detail"]) == ("blocked", "address not allowed")  # the customer's reason
    assert run.dials == [(PUBLIC_IP, server.port)]
    assert run.dns_queries == [REBINDING_NAME, REBINDING_NAME]  # resolved per attempt
    assert server.requests[0].headers["host"] == f"{REBINDING_NAME}:{server.port}"


@pytest.mark.parametrize("kind", KINDS)
def test_address_cache_only_ever_holds_checked_addresses(kind: str) -> None:
    """With the TTL cache on, the rebinding answer is not even asked for: the
    cached, checked public address is dialed again -- never 127.0.0.1."""
    run, _ = _post_twice_to_a_rebinding_name(kind, dns_cache_ttl=60)
    assert [r["status"] for r in run.results] == [200, 200]
    assert run.dns_queries == [REBINDING_NAME]
    assert {ip for ip, _ in run.dials} == {PUBLIC_IP}


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_answers_are_refused_without_dialing(kind: str) -> None:
    answers = [["93.184.216.34", "10.0.0.1"], ["10.0.0.1", "93.184.216.34"], ["93.184.216.34", "::ffff:a00:1"]]
    dns = {f"mixed{i}.example.test": [answer] for i, answer in enumerate(answers)}
    run = post_green(
        kind,
        [f"http://{name}/hook" for name in dns],
        policy=_strict(),
        dns=dns,
        redirect={"93.184.216.34": ("127.0.0.1", 9)},
    )
    for result in run.results:
        assert (result["error"], result["detail"]) == ("blocked", "address not allowed"), result
    assert run.dials == []


@pytest.mark.parametrize("kind", KINDS)
def test_redirects_are_returned_not_followed(kind: str) -> None:
    codes = [301, 302, 303, 307, 308]
    with LoopbackServer(responder(response(200, b"landed"))) as target:

        def redirect(request: Any) -> bytes:
            code = int(request.path.rsplit("/", 1)[1])
            return response(code, b"moved", {"Location": target.url("/landed")})

        with LoopbackServer(responder(redirect)) as origin:
            run = post_green(kind, [origin.url(f"/hook/{code}") for code in codes])
    assert [r["status"] for r in run.results] == codes
    assert all(r["error"] is None for r in run.results)
    assert [run.body(i) for i in range(len(codes))] == [b"moved"] * len(codes)
    assert len(origin.requests) == len(codes)
    assert target.connections == 0 and target.requests == []
