"""Outbound network policy: the SSRF guard (in the spirit of Stripe's smokescreen and Svix).

A customer chooses the URL we POST to, so without a guard a webhook is a request
forgery primitive against our own network (cloud metadata at 169.254.169.254,
internal admin ports, the database).  The rules:

* Only ``http``/``https`` URLs with a host and no ``user:pass@`` part; with
  ``require_https`` plain ``http`` is refused.
* Every address we would connect to is checked against a deny list (loopback,
  private, link-local, CGNAT, reserved, multicast, documentation, ...), including
  the IPv6 forms that embed an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``,
  NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``), because the kernel or a NAT64
  gateway turns those into the IPv4 address they carry.
* Host literals are parsed the way ``inet_aton`` (and so most resolvers and
  browsers) parse them: ``2130706433``, ``0x7f.1`` and ``0177.0.0.1`` are all
  127.0.0.1.  A host whose last label is numeric must be a valid IPv4 literal,
  so a resolver can never be handed something it might read as an address.
* A name is resolved once and *every* answer must pass.  The caller then dials
  one of the checked addresses itself (see ``dispatcher.outbound.transport``); resolving
  again at connect time would reopen the DNS-rebinding hole.

* The port must not be on the operator's deny list (``http.deny_ports``: SSH,
  SMTP, databases, caches by default) and, when an allow list is set
  (``http.allow_ports``), must be on it.

Each error has two texts.  ``str(exc)`` is the operator's: it names the host,
the address and why (never the whole URL: webhook URLs often carry a secret
token in their path or query).  ``exc.public`` is the customer's: a generic
reason ("address not allowed", "name did not resolve", "port not allowed"),
because internal names and addresses must not reach customers through
``last_error`` or a registration error.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    from dispatcher.config import HttpConfig

__all__ = [
    "BlockedURL",
    "DnsError",
    "InvalidURL",
    "OutboundError",
    "OutboundPolicy",
    "Resolver",
    "Target",
    "check_addresses",
    "check_registration_url",
    "is_denied",
    "parse_target",
    "read_hosts",
    "registration_refusal",
    "resolve_checked",
]

log = logging.getLogger("dispatcher.netguard")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: ``socket.getaddrinfo``-compatible: ``(host, port, family, type) -> [(family, type, proto, canonname, sockaddr)]``
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 2048
HOSTS_FILE = Path("/etc/hosts")


# What customers are shown (docs/decisions.md, Failure reasons).
ADDRESS_NOT_ALLOWED = "address not allowed"
PORT_NOT_ALLOWED = "port not allowed"
NAME_DID_NOT_RESOLVE = "name did not resolve"
HTTPS_REQUIRED = "https is required"


class OutboundError(Exception):
    """Base class; ``str(exc)`` is the operator's one-line reason, ``public`` the customer's."""

    def __init__(self, detail: str, public: str | None = None) -> None:
        super().__init__(detail)
        self.public = detail if public is None else public


class InvalidURL(OutboundError):
    """Not a URL we can send to: malformed, unsupported scheme, no host, credentials, ...

    The reason describes the customer's own URL, so it is also what they see."""


class BlockedURL(OutboundError):
    """A well-formed URL the outbound policy refuses (http when https is required, denied address or port)."""


class DnsError(OutboundError):
    """The host name does not resolve."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, NAME_DID_NOT_RESOLVE)


@dataclass(frozen=True)
class OutboundPolicy:
    """What we may connect to.

    ``allow_private_networks`` turns the address checks off entirely (local
    development); ``allow_networks`` opens specific ranges (a staging receiver in
    10.20.0.0/16, or 127.0.0.0/8 in tests).  Strings are accepted for the
    networks and converted, so the policy can be built straight from config.
    """

    require_https: bool
    allow_private_networks: bool
    allow_networks: tuple[IPNetwork, ...] = ()
    # The operator's lists; their defaults are the settings' (http.deny_ports, declared in config).
    deny_ports: frozenset[int] = frozenset()
    allow_ports: frozenset[int] = frozenset()  # empty: every port not denied

    def __post_init__(self) -> None:
        nets = tuple(ipaddress.ip_network(n) for n in self.allow_networks)
        object.__setattr__(self, "allow_networks", nets)
        object.__setattr__(self, "deny_ports", frozenset(self.deny_ports))
        object.__setattr__(self, "allow_ports", frozenset(self.allow_ports))

    @classmethod
    def from_config(cls, http: HttpConfig) -> OutboundPolicy:
        """The policy of the ``http`` config section, for every sender (engine, legacy path, CLI)."""
        return cls(require_https=http.require_https, allow_private_networks=http.allow_private_networks,
                   allow_networks=tuple(http.allow_networks), deny_ports=frozenset(http.deny_ports),
                   allow_ports=frozenset(http.allow_ports))

    def port_refusal(self, port: int) -> str | None:
        """Why ``port`` may not be connected to (operator's wording), or None if it may.

        The deny list wins over the allow list."""
        if port in self.deny_ports:
            return f"port {port} is on the operator's deny list (http.deny_ports)"
        if self.allow_ports and port not in self.allow_ports:
            return f"port {port} is not on the operator's allow list (http.allow_ports)"
        return None


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed, normalised destination.  ``host`` is lower-case, IDNA-encoded, without
    brackets or trailing dot; an IP literal is in canonical form (``0x7f.1`` -> ``127.0.0.1``)."""

    scheme: str
    host: str
    port: int
    path: str  # path + "?" + query, never empty, starts with "/"
    literal: bool = False  # host is an IP address: nothing to resolve

    @property
    def authority(self) -> str:
        """The Host header value: host, bracketed for IPv6, with the port unless it is the default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port == DEFAULT_PORTS[self.scheme]:
            return host
        return f"{host}:{self.port}"


# --------------------------------------------------------------------------- deny list
# Ranges are kept as (first, last, reason) integers: a linear scan of ~16 int
# comparisons is cheaper than ipaddress' ``in`` and this runs on every attempt.
_Rule = tuple[int, int, str]


def _rules(table: Iterable[tuple[str, str]]) -> tuple[_Rule, ...]:
    out = []
    for cidr, reason in table:
        net = ipaddress.ip_network(cidr)
        out.append((int(net.network_address), int(net.broadcast_address), reason))
    return tuple(out)


# First match wins, so a specific range precedes the wider one containing it.
_V4_RULES = _rules(
    [
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    ]
)

_V6_RULES = _rules(
    [
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        # Teredo, ORCHID, benchmarking, ...: no webhook receiver lives here, and
        # Teredo embeds an (obfuscated) IPv4 address we would otherwise have to decode.
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("fc00::/7", "private (unique local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    ]
)

# IPv6 prefixes whose low bits carry an IPv4 address the packet ends up at.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIXTOFOUR = ipaddress.IPv6Network("2002::/16")


def _match(value: int, rules: tuple[_Rule, ...]) -> str | None:
    for first, last, reason in rules:
        if first <= value <= last:
            return reason
    return None


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address stands for, and the name of the embedding."""
    if addr in _MAPPED:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "IPv4-mapped"
    if addr in _TRANSLATED:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "IPv4-translated"
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "NAT64"
    if addr in _SIXTOFOUR:
        return ipaddress.IPv4Address((int(addr) >> 80) & 0xFFFFFFFF), "6to4"
    return None


def _deny_reason(addr: IPAddress) -> str | None:
    if isinstance(addr, ipaddress.IPv4Address):
        return _match(int(addr), _V4_RULES)
    embedded = _embedded_v4(addr)
    if embedded is not None:
        v4, kind = embedded
        reason = _match(int(v4), _V4_RULES)
        return f"{reason} ({kind} {v4})" if reason else None
    return _match(int(addr), _V6_RULES)


def _allow_listed(addr: IPAddress, nets: tuple[IPNetwork, ...]) -> bool:
    # An embedded IPv4 address is allowed when its IPv4 form is, so that
    # allow_networks=(127.0.0.0/8,) also covers ::ffff:127.0.0.1.
    candidates: list[IPAddress] = [addr]
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_v4(addr)
        if embedded is not None:
            candidates.append(embedded[0])
    return any(a in net for a in candidates for net in nets if a.version == net.version)


def is_denied(ip: str | IPAddress, policy: OutboundPolicy) -> str | None:
    """Why ``ip`` may not be connected to under ``policy`` (e.g. ``"loopback"``), or None if it may."""
    if policy.allow_private_networks:
        return None
    addr = ip if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address) else ipaddress.ip_address(ip)
    if policy.allow_networks and _allow_listed(addr, policy.allow_networks):
        return None
    return _deny_reason(addr)


# --------------------------------------------------------------------------- URL parsing
# Whitespace and control characters are where URL parsers disagree with each
# other (and with the HTTP request line), so they are refused outright, as is
# the backslash, which WHATWG parsers read as "/" and urlsplit does not.
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x20\x7f\\]|\s")
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
# Characters left as they are when percent-encoding a non-ASCII path.
_PATH_SAFE = "!#$%&'()*+,/:;=?@[]~"


def _split_authority(netloc: str) -> tuple[str, str, str]:
    """``netloc`` -> (host, port string, "v6" if bracketed else "")."""
    if netloc.startswith("["):
        end = netloc.find("]")
        rest = netloc[end + 1 :] if end > 0 else "x"
        if rest and not rest.startswith(":"):
            raise InvalidURL("malformed IPv6 host")
        return netloc[1:end], rest[1:], "v6"
    host, sep, port = netloc.rpartition(":")
    if not sep:
        return netloc, "", ""
    if ":" in host:
        raise InvalidURL("IPv6 host must be in brackets")
    return host, port, ""


def _normalise_host(raw: str, bracketed: bool) -> tuple[str, bool]:
    """Canonical host and whether it is an IP literal."""
    if bracketed:
        if "%" in raw:
            raise InvalidURL("IPv6 zone identifiers are not allowed")
        try:
            return str(ipaddress.IPv6Address(raw)), True
        except ValueError:
            raise InvalidURL("malformed IPv6 host") from None
    host = raw.lower()
    if not host.isascii():
        try:  # IDNA first: it maps e.g. full-width digits to ASCII ones
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidURL("host name is not valid IDNA") from None
    host = host[:-1] if host.endswith(".") else host
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            return str(ipaddress.IPv4Address(socket.inet_aton(host))), True
        except OSError:
            raise InvalidURL("malformed IPv4 address") from None
    if not host or len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidURL("malformed host name")
    return host, False


def _parse_port(text: str, scheme: str) -> int:
    if not text:
        return DEFAULT_PORTS[scheme]
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise InvalidURL("invalid port")
    return int(text)


def _request_path(path: str, query: str) -> str:
    target = (path or "/") + (f"?{query}" if query else "")
    if not target.startswith("/"):
        raise InvalidURL("malformed path")
    # Non-ASCII would otherwise be put on the wire in whatever encoding the
    # HTTP library picks; encode it as UTF-8 the way browsers do.
    return target if target.isascii() else quote(target, safe=_PATH_SAFE)


def parse_target(url: str, policy: OutboundPolicy) -> Target:
    """Parse and validate ``url``; raise :class:`InvalidURL` or :class:`BlockedURL`.

    Only the URL itself is checked here (a literal IP is checked against the deny
    list); names are checked by :func:`resolve_checked` at send time.
    """
    if not isinstance(url, str) or not url:
        raise InvalidURL("empty URL")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidURL(f"URL longer than {MAX_URL_LENGTH} characters")
    if _FORBIDDEN_CHARS.search(url):
        raise InvalidURL("URL contains whitespace, control characters or a backslash")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidURL("malformed URL") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidURL(f"unsupported scheme {scheme!r}: only http and https" if scheme else "URL has no scheme")
    if not parts.netloc:
        raise InvalidURL("URL has no host")
    if "@" in parts.netloc:
        raise InvalidURL("credentials in the URL (user:password@) are not allowed")
    raw_host, port_text, kind = _split_authority(parts.netloc)
    if not raw_host:
        raise InvalidURL("URL has no host")
    host, literal = _normalise_host(raw_host, kind == "v6")
    target = Target(scheme, host, _parse_port(port_text, scheme), _request_path(parts.path, parts.query), literal)
    if scheme == "http" and policy.require_https:
        raise BlockedURL(f"plain http to {host} is refused: https is required", HTTPS_REQUIRED)
    port_refusal = policy.port_refusal(target.port)
    if port_refusal:
        raise BlockedURL(f"{host}: {port_refusal}", PORT_NOT_ALLOWED)
    if literal:
        reason = is_denied(host, policy)
        if reason:
            raise BlockedURL(f"{host} is a {reason} address", ADDRESS_NOT_ALLOWED)
    return target


# --------------------------------------------------------------------------- resolution
def _gai_reason(exc: BaseException) -> str:
    strerror = getattr(exc, "strerror", None)
    return str(strerror) if strerror else type(exc).__name__


def resolve_checked(host: str, port: int, policy: OutboundPolicy, resolver: Resolver | None = None) -> list[str]:
    """Resolve ``host`` once and return its addresses, all of which pass ``policy``.

    If *any* answer is denied the whole name is refused (:class:`BlockedURL`):
    picking the "good" answers would let an attacker mix a public address with
    an internal one and win whenever the public one is unreachable.
    ``resolver`` defaults to ``socket.getaddrinfo`` looked up at call time, so
    that gevent's monkey-patched, cooperative version is used in the workers.
    """
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        addresses = _resolve(host, port, resolver or socket.getaddrinfo)
    return check_addresses(host, addresses, policy)


def check_addresses(host: str, addresses: list[str], policy: OutboundPolicy) -> list[str]:
    """``addresses`` (``host``'s answers) if every one passes ``policy``; else the whole name is refused."""
    for address in addresses:
        reason = is_denied(address, policy)
        if reason:
            raise BlockedURL(f"{host} resolves to {address} ({reason})", ADDRESS_NOT_ALLOWED)
    return addresses


def _resolve(host: str, port: int, resolver: Resolver) -> list[str]:
    try:
        infos = resolver(host, port, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise DnsError(f"{host} does not resolve ({_gai_reason(exc)})") from None
    addresses: list[str] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    if not addresses:
        raise DnsError(f"{host} has no IPv4 or IPv6 address")
    return addresses


def check_registration_url(url: str, policy: OutboundPolicy,
                           hosts: Mapping[str, Sequence[str]] | None = None) -> Target:
    """Validate an endpoint URL when a customer registers it.

    Raises :class:`InvalidURL` or :class:`BlockedURL` (one-line message).  A
    name is not asked of DNS here: registration runs on the API's shared
    threads, where one tenant's names on a black-holed zone would hold every
    other tenant's requests, and customers register endpoints before their
    DNS is live anyway.  Every send checks each resolved address; that is the
    check that counts.  Only the local hosts file (``hosts``, default
    ``/etc/hosts``), which costs no wait, is consulted, so ``localhost`` and
    its like are refused now rather than failing every delivery later.
    """
    target = parse_target(url, policy)
    if not target.literal:
        addresses = (read_hosts() if hosts is None else hosts).get(target.host.lower().rstrip("."))
        if addresses:
            check_addresses(target.host, list(addresses), policy)
    return target


def read_hosts(path: Path = HOSTS_FILE) -> dict[str, tuple[str, ...]]:
    """name -> addresses from a hosts file; a missing or unreadable file is empty."""
    names: dict[str, list[str]] = {}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = str(ipaddress.ip_address(fields[0].split("%", 1)[0]))
        except ValueError:
            continue
        for name in fields[1:]:
            names.setdefault(name.lower().rstrip("."), []).append(address)
    return {name: tuple(dict.fromkeys(addresses)) for name, addresses in names.items()}


def registration_refusal(url: str, policy: OutboundPolicy) -> str | None:
    """Why ``url`` may not be registered, in the customer's words, or None if it may.

    The one registration check of the CLI (``endpoint add``/``update``) and the
    API (create, PATCH): the operator's detail goes to the debug log only.
    """
    try:
        check_registration_url(url, policy)
    except (InvalidURL, BlockedURL) as exc:
        log.debug("endpoint URL refused: %s", exc)
        return exc.public
    return None
