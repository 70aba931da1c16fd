"""The SSRF guard: the deny list, URL parsing and DNS checks.

Policy functions are pure and run in-process here; the same guard through the
transports (a monkey-patched child per case) is in
``tests/e2e/faults/test_ssrf_transports.py``.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from dispatcher.outbound.netguard import (
    BlockedURL,
    DnsError,
    InvalidURL,
    OutboundPolicy,
    Target,
    check_registration_url,
    is_denied,
    parse_target,
    registration_refusal,
    resolve_checked,
)

pytestmark = pytest.mark.timeout(60)

STRICT = OutboundPolicy(require_https=False, allow_private_networks=False)
HTTPS_ONLY = OutboundPolicy(require_https=True, allow_private_networks=False)
OPEN = OutboundPolicy(require_https=False, allow_private_networks=True)

# A sample of every IPv4 rule: first, last and a notable address of each range.
DENIED_V4 = [
    ("0.0.0.0", "unspecified"),
    ("0.255.255.255", "unspecified"),
    ("10.0.0.0", "private"),
    ("10.255.255.255", "private"),
    ("100.64.0.0", "carrier-grade NAT"),
    ("100.127.255.255", "carrier-grade NAT"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("169.254.0.1", "link-local"),
    ("169.254.169.254", "link-local"),
    ("172.16.0.0", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("192.0.2.1", "documentation"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("192.168.0.1", "private"),
    ("192.168.255.255", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.254", "reserved"),
    ("255.255.255.255", "broadcast"),
]

DENIED_V6 = [
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::7f00:1", "IPv4-compatible"),
    ("64:ff9b:1::1", "local-use NAT64"),
    ("100::1", "discard-only"),
    ("2001::1", "IETF protocol assignments"),  # Teredo
    ("2001:db8::1", "documentation"),
    ("2001:db8:ffff::1", "documentation"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("fe80::1", "link-local"),
    ("febf:ffff::1", "link-local"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("ff05::1:3", "multicast"),
]


def _embeddings(v4: str) -> list[tuple[str, str]]:
    """The IPv6 spellings that reach ``v4``: IPv4-mapped, IPv4-translated, NAT64, 6to4."""
    n = int(ipaddress.IPv4Address(v4))
    return [
        (str(ipaddress.IPv6Address((0xFFFF << 32) | n)), "IPv4-mapped"),
        (str(ipaddress.IPv6Address((0xFFFF << 48) | n)), "IPv4-translated"),
        (str(ipaddress.IPv6Address((0x0064FF9B << 96) | n)), "NAT64"),
        (str(ipaddress.IPv6Address((0x2002 << 112) | (n << 80) | 1)), "6to4"),
    ]


DENIED_EMBEDDED = [(v6, reason, kind) for v4, reason in DENIED_V4 for v6, kind in _embeddings(v4)]

ALLOWED = [
    "93.184.216.34",
    "8.8.8.8",
    "1.1.1.1",
    "9.255.255.255",  # just below 10/8
    "11.0.0.0",  # just above 10/8
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above CGNAT
    "172.15.255.255",
    "172.32.0.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",  # just below multicast
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "2001:200::1",  # just past 2001::/23
    *[v6 for v6, _kind in _embeddings("93.184.216.34")],
]

# Spellings of denied addresses as URL hosts, and the canonical address each means.
LITERAL_HOSTS = [
    ("127.0.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("0x7F.0.0.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("0177.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("017700000001", "127.0.0.1"),
    ("127.0.0.1.", "127.0.0.1"),
    ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "127.0.0.1"),  # full-width digits
    ("0", "0.0.0.0"),
    ("169.254.169.254", "169.254.169.254"),
    ("2852039166", "169.254.169.254"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("0251.0376.0251.0376", "169.254.169.254"),
    ("10.1", "10.0.0.1"),
    ("[::1]", "::1"),
    ("[::]", "::"),
    ("[0:0:0:0:0:0:0:1]", "::1"),
    ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
    ("[::ffff:7f00:1]", "::ffff:7f00:1"),
    ("[::ffff:a9fe:a9fe]", "::ffff:a9fe:a9fe"),
    ("[64:ff9b::a9fe:a9fe]", "64:ff9b::a9fe:a9fe"),
    ("[2002:a9fe:a9fe::1]", "2002:a9fe:a9fe::1"),
    ("[fe80::1]", "fe80::1"),
    ("[fd00:ec2::254]", "fd00:ec2::254"),  # AWS IPv6 metadata
]

INVALID_URLS = [
    "",
    "example.com/hook",
    "//example.com/hook",
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_FLUSHALL",
    "javascript:alert(1)",
    "http://",
    "http:///hook",
    "http://:443/hook",
    "http://user:secret@example.com/hook",
    "http://user@example.com/hook",
    "http://example.com\\@127.0.0.1/",
    "http://example.com:0/",
    "http://example.com:65536/",
    "http://example.com:8o/",
    "http://example.com:-1/",
    "http://exa mple.com/",
    " http://example.com/",
    "http://example.com/\r\nX-Injected: 1",
    "http://example.com/\x00",
    "http://[::1/",
    "http://::1/",
    "http://[fe80::1%25eth0]/",
    "http://[not-v6]/",
    "http://1.2.3.4.5/",
    "http://256.0.0.1/",
    "http://08.0.0.1/",
    "http://0x100000000/",
    "http://7f.1/",
    "http://-bad-.example.com/",
    "http://a..b/",
    "http://exa$mple.com/",
    "http://%31%32%37.0.0.1/",  # percent-encoded hosts are never decoded into an address
    "http://ex%61mple.com/",
    "http://" + "a" * 64 + ".com/",
    "https://example.com/" + "a" * 3000,
]


# --------------------------------------------------------------------------- is_denied
@pytest.mark.parametrize(("address", "reason"), DENIED_V4 + DENIED_V6)
def test_denied_addresses(address: str, reason: str) -> None:
    denied = is_denied(address, STRICT)
    assert denied is not None and reason in denied


@pytest.mark.parametrize(("address", "reason", "kind"), DENIED_EMBEDDED)
def test_ipv4_rules_hold_for_every_ipv6_embedding(address: str, reason: str, kind: str) -> None:
    denied = is_denied(address, STRICT)
    assert denied is not None and reason in denied and kind in denied


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_denied(address, STRICT) is None
    assert is_denied(ipaddress.ip_address(address), STRICT) is None


def test_allow_private_networks_disables_the_checks() -> None:
    for address, _ in DENIED_V4 + DENIED_V6:
        assert is_denied(address, OPEN) is None


def test_allow_networks_opens_only_the_listed_ranges() -> None:
    # Strings (as read from config) are accepted and converted.
    policy = OutboundPolicy(True, False, allow_networks=("127.0.0.0/8",))  # type: ignore[arg-type]
    assert policy.allow_networks == (ipaddress.ip_network("127.0.0.0/8"),)
    assert is_denied("127.0.0.1", policy) is None
    assert is_denied("::ffff:127.0.0.1", policy) is None  # the same address, mapped
    assert is_denied("10.0.0.1", policy) == "private"
    assert is_denied("::1", policy) == "loopback"  # IPv6 loopback is not in an IPv4 network


# --------------------------------------------------------------------------- parse_target
@pytest.mark.parametrize(("host", "canonical"), LITERAL_HOSTS)
def test_ip_literal_spellings_are_recognised_and_refused(host: str, canonical: str) -> None:
    with pytest.raises(BlockedURL, match="address"):
        parse_target(f"http://{host}/hook", STRICT)
    target = parse_target(f"http://{host}/hook", OPEN)
    assert target.literal
    assert ipaddress.ip_address(target.host) == ipaddress.ip_address(canonical)


@pytest.mark.parametrize("url", INVALID_URLS)
def test_invalid_urls(url: str) -> None:
    with pytest.raises(InvalidURL) as raised:
        parse_target(url, OPEN)
    message = str(raised.value)
    assert message and "\n" not in message
    assert "secret" not in message  # never echo credentials


def test_require_https_refuses_plain_http() -> None:
    with pytest.raises(BlockedURL, match="https is required"):
        parse_target("http://hooks.example.com/hook", HTTPS_ONLY)
    assert parse_target("https://hooks.example.com/hook", HTTPS_ONLY).scheme == "https"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTPS://Hooks.Example.COM/a/b?x=1&y=2#frag", Target("https", "hooks.example.com", 443, "/a/b?x=1&y=2")),
        ("https://hooks.example.com.:8443", Target("https", "hooks.example.com", 8443, "/")),
        ("https://hooks.example.com:/?", Target("https", "hooks.example.com", 443, "/")),
        ("https://b\u00fccher.example/h\u00e9", Target("https", "xn--bcher-kva.example", 443, "/h%C3%A9")),
        ("https://my_host.example.com/", Target("https", "my_host.example.com", 443, "/")),
        ("https://[2606:4700::1111]:8443/x", Target("https", "2606:4700::1111", 8443, "/x", literal=True)),
        ("http://93.184.216.34/", Target("http", "93.184.216.34", 80, "/", literal=True)),
    ],
)
def test_parse_target_normalises(url: str, expected: Target) -> None:
    assert parse_target(url, HTTPS_ONLY if url.lower().startswith("https") else STRICT) == expected


def test_authority_is_the_host_header() -> None:
    assert parse_target("https://h.example:443/", STRICT).authority == "h.example"
    assert parse_target("https://h.example:8443/", STRICT).authority == "h.example:8443"
    assert parse_target("http://[2606:4700::1]:8080/", STRICT).authority == "[2606:4700::1]:8080"


# --------------------------------------------------------------------------- resolve_checked
def _resolver(*addresses: str) -> Any:
    def resolve(host: str, port: int, *_: Any) -> list[tuple[Any, ...]]:
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    return resolve


def _failing_resolver(host: str, port: int, *_: Any) -> Any:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_resolve_checked_returns_every_address_when_all_are_public() -> None:
    addresses = resolve_checked("hooks.example.test", 443, STRICT, _resolver("93.184.216.34", "2606:4700::1"))
    assert addresses == ["93.184.216.34", "2606:4700::1"]


@pytest.mark.parametrize(
    "answers",
    [("93.184.216.34", "10.0.0.1"), ("10.0.0.1", "93.184.216.34"), ("93.184.216.34", "::ffff:10.0.0.1")],
)
def test_one_denied_answer_refuses_the_name(answers: tuple[str, ...]) -> None:
    with pytest.raises(BlockedURL, match=r"hooks\.example\.test resolves to .*10\.0\.0\.1.*private") as refused:
        resolve_checked("hooks.example.test", 443, STRICT, _resolver(*answers))
    assert refused.value.public == "address not allowed"  # what a customer is shown


def test_dns_failure_is_a_dns_error() -> None:
    with pytest.raises(DnsError, match="nowhere.example.test does not resolve") as failed:
        resolve_checked("nowhere.example.test", 443, STRICT, _failing_resolver)
    assert failed.value.public == "name did not resolve"
    with pytest.raises(DnsError):
        resolve_checked("empty.example.test", 443, STRICT, _resolver())


def test_registration_check() -> None:
    target = check_registration_url("https://later.example.test/hook", HTTPS_ONLY, hosts={})
    assert target.host == "later.example.test"  # not resolving (yet) is fine
    with pytest.raises(BlockedURL, match="10.1.2.3"):
        check_registration_url("https://internal.example.test/", HTTPS_ONLY,
                               hosts={"internal.example.test": ("10.1.2.3",)})
    with pytest.raises(BlockedURL, match="169.254.169.254"):
        check_registration_url("https://169.254.169.254/latest/meta-data/", HTTPS_ONLY, hosts={})
    with pytest.raises(BlockedURL, match="https"):
        check_registration_url("http://hooks.example.test/", HTTPS_ONLY, hosts={})
    with pytest.raises(InvalidURL):
        check_registration_url("https://user:pw@hooks.example.test/", HTTPS_ONLY, hosts={})


def test_registration_never_waits_on_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registration runs on the API's shared threads, where one tenant's names on a black-holed zone
    held every other tenant's create: it asks no nameserver (the send-time check is the one that
    counts) and only reads the local hosts file, so ``localhost`` is still refused up front."""
    asked: list[str] = []

    def system_resolver(host: str, *_: Any) -> Any:
        asked.append(host)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", system_resolver)
    assert registration_refusal("https://hooks.dark.example.test/x", HTTPS_ONLY) is None
    assert registration_refusal("https://localhost/x", HTTPS_ONLY) == "address not allowed"
    assert asked == []
