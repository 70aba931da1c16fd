"""Configuration: every setting declared once, loaded into a frozen object.

Each setting is a dataclass field made with :func:`setting`, which carries its
default, its parser (the validation) and its one-line doc.  The YAML file is
walked against these declarations, so an unknown key, a wrong type or a bad
duration is reported by its dotted name.  The result is immutable and is passed
down explicitly; nothing reads configuration from globals.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from dispatcher import durations
from dispatcher.contacts import InvalidContact, check_email
from dispatcher.durations import format_duration
from dispatcher.rules.breaker import BreakerPolicy
from dispatcher.rules.health import BacklogRule, FleetRule
from dispatcher.rules.lifecycle import LifecyclePolicy
from dispatcher.rules.partitions import PartitionPolicy
from dispatcher.rules.retry import RetryPolicies, RetryPolicy
from dispatcher.signing import ROTATION_GRACE

# The retry and breaker settings default to the policies' own values, declared once there.
_RETRY_DEFAULTS = RetryPolicy()
_BREAKER = BreakerPolicy()
_LIFECYCLE = LifecyclePolicy()
# So do the alert thresholds: the rules' own (RFC-014 "Backlog growth"), declared once in dispatcher/rules/health.py.
_BACKLOG_DEFAULTS = BacklogRule()
_FLEET_DEFAULTS = FleetRule()
# And the partition policy's own (issue 25: events kept 90 days, a week of partitions ahead).
_PARTITIONS = PartitionPolicy()

DSN_ENV = "DISPATCHER_DATABASE_DSN"
# The supervisor resolves the DSN once (starting the embedded server if need
# be) and hands the result to its workers through this variable.
WORKER_DSN_ENV = "DISPATCHER_WORKER_DSN"
EMBEDDED = "embedded"
# The SMTP password may stay out of the config file: this variable overrides notifier.smtp_password.
SMTP_PASSWORD_ENV = "DISPATCHER_SMTP_PASSWORD"


class ConfigError(ValueError):
    """A configuration problem, phrased for one line of output."""


Parser = Callable[[Any], Any]

def parse_duration(value: Any) -> float:
    """``250ms``, ``10s``, ``5m``, ``24h``, ``30d`` -> seconds (the syntax: ``dispatcher.durations``)."""
    try:
        return durations.parse_duration(value)
    except durations.DurationError as exc:
        raise ConfigError(str(exc)) from None


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{value!r} is not a positive integer")
    return value


def _port(value: Any) -> int:
    port = _positive_int(value)
    if port > 65535:
        raise ConfigError(f"{value!r} is not a port number")
    return port


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{value!r} is not true or false")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{value!r} is not a non-empty string")
    return value


def _optional(parse: Parser, value: Any) -> Any:
    return None if value is None else parse(value)


def _email(value: Any) -> str:
    try:
        return check_email(_text(value))
    except InvalidContact as exc:
        raise ConfigError(str(exc)) from None


def _confirm_url(value: Any) -> str:
    """Empty, or an http(s) URL with a host and no query or fragment (the link appends ``?token=``)."""
    if value is None or value == "":
        return ""
    try:
        parts = urllib.parse.urlsplit(_text(value))
    except ValueError:
        raise ConfigError(f"{value!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"{value!r} is not an http(s) URL without a query, "
                          "e.g. https://api.example.com/v2/contacts/confirm")
    return str(value)


def _optional_dsn(value: Any) -> str:
    """A libpq DSN, or empty for none; checked by libpq's own parser so a typo stops the start-up."""
    if value is None or value == "":
        return ""
    text = _text(value)
    import psycopg2.extensions  # only a configured DSN needs it

    try:
        psycopg2.extensions.parse_dsn(text)
    except psycopg2.ProgrammingError as exc:
        first_line = (str(exc).strip().splitlines() or ["invalid"])[0]
        raise ConfigError(f"not a libpq DSN ({first_line})") from None
    return text


def _region(value: Any) -> str:
    text = _text(value)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", text):
        raise ConfigError(f"{value!r} is not a region name (lowercase letters, digits, dashes)")
    return text


def _processes(value: Any) -> int:
    if value == "auto":
        return os.cpu_count() or 1
    return _positive_int(value)


def _one_of(*choices: str) -> Parser:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ConfigError(f"{value!r} is not one of {', '.join(choices)}")
        return str(value)

    return parse


def _networks(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{value!r} is not a list of CIDR networks")
    try:
        return tuple(ipaddress.ip_network(str(item), strict=False) for item in value)
    except ValueError as exc:
        raise ConfigError(f"bad CIDR network: {exc}") from exc


def _ports(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{value!r} is not a list of port numbers")
    return tuple(sorted({_port(item) for item in value}))


def _dns_servers(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{value!r} is not a list of nameservers (ip or ip:port)")
    servers = []
    for item in value:
        text = _text(item)
        host, sep, port = text.rpartition(":") if text.count(":") == 1 or text.startswith("[") else ("", "", "")
        try:
            ipaddress.ip_address((host if sep else text).strip("[]"))
            if sep:
                _port(int(port))
        except (ValueError, ConfigError):
            raise ConfigError(f"{text!r} is not a nameserver address (ip or ip:port)") from None
        servers.append(text)
    return tuple(servers)


def _ca_file(value: Any) -> str | None:
    """A PEM bundle to trust besides the system store; loaded here so a bad one
    stops the start-up with its name, not every TLS attempt later."""
    if value is None:
        return None
    path = _text(value)
    import ssl  # only a configured bundle needs it

    try:
        loaded = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        loaded.load_verify_locations(cafile=path)
    except ssl.SSLError:  # an OSError too: caught first
        raise ConfigError(f"{path} holds no PEM certificate") from None
    except OSError as exc:
        raise ConfigError(f"cannot read CA bundle {path}: {exc.strerror or exc}") from None
    if not loaded.cert_store_stats()["x509"]:
        raise ConfigError(f"{path} holds no PEM certificate")
    return path


def _listen(value: Any) -> tuple[str, int]:
    host, sep, port = _text(value).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{value!r} is not host:port")
    return host.strip("[]"), _port(int(port)) if int(port) else 0


def setting(default: Any, parse: Parser, doc: str, shown: str | None = None, secret: bool = False) -> Any:
    """Declare a setting: its default, its parser/validator and its doc.

    ``shown`` is the default as written in YAML, for the docs, when the value
    itself would print differently (``auto`` for a core count, ``host:port``).
    A ``secret`` setting stays out of the config object's repr.
    """
    metadata: dict[str, Any] = {"parse": parse, "doc": doc}
    if shown is not None:
        metadata["shown"] = shown
    return field(default=default, metadata=metadata, repr=not secret)


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str = setting(EMBEDDED, _text, "libpq DSN, or 'embedded' for a local pgserver Postgres")
    embedded_dir: str = setting(".dispatcher/pgdata", _text, "data directory of the embedded Postgres")
    connect_timeout: float = setting(5.0, parse_duration, "how long one connection attempt may take")
    reconnect_max: float = setting(30.0, parse_duration, "cap of the reconnect backoff after a lost connection")
    statement_deadline: float = setting(30.0, parse_duration,
                                        "longest a worker waits for one database answer, and an API request "
                                        "for all of its database work, before the connection is dropped as "
                                        "lost (a hung primary, a host gone silent; the API answers 503)")
    prepared_statements: bool = setting(True, _boolean, "server-side prepared statements for the hot queries; "
                                                        "false behind a transaction pooler (PgBouncer)")


@dataclass(frozen=True)
class WorkersConfig:
    processes: int = setting(_processes("auto"), _processes, "worker processes; 'auto' = one per core",
                             shown="auto")
    claim_batch: int = setting(200, _positive_int,
                               "rows one claim's endpoint walk takes at most (lanes' refills come on top)")
    per_endpoint_concurrency: int = setting(4, _positive_int,
                                            "requests in flight to one endpoint, across every process and host")
    poll_interval: float = setting(0.5, parse_duration, "how often an idle worker looks for due rows")
    wake_interval: float = setting(0.05, parse_duration,
                                   "how often an idle worker, between polls, reads whether new rows may have "
                                   "come (one cheap read, not a claim); at poll_interval or more: never")
    lease: float = setting(60.0, parse_duration, "how long a claim is owned before another worker may take it")
    max_in_flight: int = setting(512, _positive_int, "deliveries a process holds (queued + sending) at most")
    flush_interval: float = setting(0.02, parse_duration, "how long results wait before their batched write")
    lane_hold: bool = setting(True, _boolean,
                              "keep an endpoint's slots while this process has rows for it (docs/claim.md)")
    lane_horizon: float = setting(0.25, parse_duration,
                                  "seconds of an endpoint's work a process queues ahead of the slots it holds")
    lane_turn: float = setting(5.0, parse_duration,
                               "how long a process keeps an endpoint's slots before it lets them go round")
    heartbeat_interval: float = setting(1.0, parse_duration, "how often a worker proves it is alive")
    heartbeat_timeout: float = setting(30.0, parse_duration, "silence after which a worker is killed and replaced")
    status_interval: float = setting(5.0, parse_duration,
                                     "how often a worker records its heartbeat row in the database (status, check)")
    graceful_timeout: float = setting(15.0, parse_duration, "how long TERM waits for in-flight sends")
    boot_timeout: float = setting(30.0, parse_duration, "how long a new worker may take to report ready")


@dataclass(frozen=True)
class HttpConfig:
    timeout: float = setting(10.0, parse_duration, "total deadline of one attempt, connect to last byte")
    require_https: bool = setting(True, _boolean, "refuse endpoint URLs that are not https")
    allow_private_networks: bool = setting(False, _boolean, "allow loopback/private/link-local targets")
    allow_networks: tuple[Any, ...] = setting((), _networks, "CIDR networks allowed even when private")
    # SSH, telnet, SMTP, MySQL, Postgres, Redis, memcached: nothing a webhook receiver listens on.
    deny_ports: tuple[int, ...] = setting((22, 23, 25, 3306, 5432, 6379, 11211), _ports,
                                          "ports never connected to (registration and send time)")
    allow_ports: tuple[int, ...] = setting((), _ports, "if not empty, the only ports connected to (deny_ports wins)")
    dns_servers: tuple[str, ...] = setting((), _dns_servers, "nameservers (ip or ip:port) for endpoint names; "
                                                             "empty: the system's (/etc/resolv.conf)")
    dns_timeout: float = setting(2.0, parse_duration, "longest one name lookup may take; then it fails as dns")
    dns_max_ttl: float = setting(300.0, parse_duration, "longest an answer (or a missing name) is cached, "
                                                        "whatever its TTL")
    dns_per_workspace: int = setting(4, _positive_int, "name lookups one workspace may have in flight per process")
    max_response_bytes: int = setting(65536, _positive_int, "response bytes read at most")
    client: str = setting("geventhttpclient", _one_of("urllib3", "geventhttpclient"), "HTTP client library")
    ca_file: str | None = setting(None, _ca_file, "PEM bundle of CAs trusted in addition to the system store "
                                  "(private CAs, tests)", shown="null")


@dataclass(frozen=True)
class StatsdConfig:
    host: str = setting("127.0.0.1", _text, "statsd host (UDP); unreachable is ignored")
    port: int = setting(8125, _port, "statsd UDP port")
    prefix: str = setting("dispatcher", _text, "prefix of every metric name in tags: none (tag mode: no prefix)")
    enabled: bool = setting(True, _boolean, "send metrics at all")
    tags: str = setting("dogstatsd", _one_of("dogstatsd", "none"),
                        "dogstatsd: the RFC's names with labels as |#tags; none: labels folded into dotted names")


@dataclass(frozen=True)
class AlertsConfig:
    backlog_rows: int = setting(_BACKLOG_DEFAULTS.rows, _positive_int,
                                "alert when more pending rows than this are due for longer than backlog_row_age")
    backlog_row_age: float = setting(_BACKLOG_DEFAULTS.row_age, parse_duration,
                                     "age that makes a pending row count toward backlog_rows")
    oldest_pending_age: float = setting(_BACKLOG_DEFAULTS.oldest_age, parse_duration,
                                        "alert when the oldest due pending row is older")
    check_interval: float = setting(10.0, parse_duration, "how often the elected process evaluates alerts and sweeps")
    heartbeat_age: float = setting(_FLEET_DEFAULTS.heartbeat_age, parse_duration,
                                   "check: CRITICAL (dead fleet) when no worker heartbeat is newer than this")
    leader_age: float = setting(_FLEET_DEFAULTS.leader_age, parse_duration,
                                "check: WARNING when no upkeep leader ran a round for this long")

    def backlog_rule(self) -> BacklogRule:
        return BacklogRule(rows=self.backlog_rows, row_age=self.backlog_row_age, oldest_age=self.oldest_pending_age)

    def fleet_rule(self) -> FleetRule:
        return FleetRule(heartbeat_age=self.heartbeat_age, leader_age=self.leader_age)


@dataclass(frozen=True)
class RetentionConfig:
    dead: float = setting(30 * 86400.0, parse_duration,
                          "keep dead and failed deliveries, and finished bulk replay jobs, this long (Q2)")
    delivered: float = setting(7 * 86400.0, parse_duration,
                               "keep delivered (and marked shadow) deliveries this long; a day's partition "
                               "goes once every row in it is past its retention")
    attempts: float = setting(30 * 86400.0, parse_duration, "keep attempt history this long")
    events: float = setting(_PARTITIONS.events, parse_duration,
                            "keep events (payloads) this long, and while a delivery row refers to them")
    batch: int = setting(5000, _positive_int, "rows deleted per pruning statement (the DEFAULT partitions only)")


@dataclass(frozen=True)
class PartitionsConfig:
    # docs/operations.md, "Partition maintenance"; the rule: dispatcher/rules/partitions.py.
    days_ahead: int = setting(_PARTITIONS.days_ahead, _positive_int,
                              "day partitions the upkeep leader keeps created ahead of today")
    lock_timeout: float = setting(0.2, parse_duration,
                                  "longest a partition's CREATE or DETACH waits for its table's lock; then it "
                                  "is retried next round (a waiting ACCESS EXCLUSIVE request would queue "
                                  "producers behind it)")


@dataclass(frozen=True)
class ApiConfig:
    listen: tuple[str, int] = setting(("127.0.0.1", 8080), _listen, "host:port of the HTTP API",
                                      shown="127.0.0.1:8080")
    replays_per_hour: int = setting(100, _positive_int, "replay requests per workspace per hour")
    max_body_bytes: int = setting(65536, _positive_int, "largest request body accepted")
    pool_size: int = setting(8, _positive_int, "database connections per API process (one per request in flight)")
    statement_timeout: float = setting(5.0, parse_duration,
                                       "longest an API query may run; past it the request gets 503")
    recover_max_age: float = setting(30 * 86400.0, parse_duration, "how far back endpoint recover may reach (since)")
    region_replays_per_hour: int = setting(2000, _positive_int,
                                           "replay units per hour for all workspaces of the region together")
    # Hostile clients (docs/security.md, "The API under hostile clients"): a connection costs a greenlet
    # and a descriptor, never a database slot, and each of these bounds how long a client that sends
    # nothing useful keeps even those.
    idle_timeout: float = setting(10.0, parse_duration, "a new connection's wait for its first request byte")
    read_timeout: float = setting(10.0, parse_duration,
                                  "a request head's deadline from its first byte, and its body's deadline from "
                                  "the head's end; each answer write's wait too")
    keepalive_timeout: float = setting(5.0, parse_duration,
                                       "how long a kept-alive connection may idle between requests")
    connection_lifetime: float = setting(300.0, parse_duration,
                                         "a kept-alive connection takes no new request once this old")
    # Issue 23 item 2: one workspace's clients may hold at most this many of the pool_size
    # connections at once, so half the pool (4 of the default 8) stays for every other tenant.
    requests_in_flight_per_workspace: int = setting(
        4, _positive_int, "requests of one workspace an API process works on at once (counted from the token "
        "check, or the body's end, to the answer); one more gets 429 with Retry-After: 1 at once. Keep it "
        "below pool_size")
    max_connections: int = setting(4096, _positive_int, "client connections open at once; more wait to be accepted")
    read_dsn: str = setting("", _optional_dsn, "libpq DSN of a streaming standby for the history reads (GET routes "
                            "but tokens, and the console); empty: the primary. Token checks and writes stay on "
                            "the primary; while the standby is down reads fall back to the primary", shown='""')


@dataclass(frozen=True)
class ProducerConfig:
    shadow_writes: bool = setting(False, _boolean, "flag off: also write mode='shadow' rows (rollout phase 0)")
    legacy_timeout: float = setting(5.0, parse_duration, "timeout of the synchronous path used when the flag is off")
    # Every claimed delivery holds its event's payload in a worker's memory (one 50 MB event to
    # 10 endpoints takes a worker to ~1 GB); 256 KiB is docs/decisions.md, Limits.
    max_payload_bytes: int = setting(256 * 1024, _positive_int,
                                     "largest event payload send() accepts: its compact JSON, in UTF-8 bytes")


@dataclass(frozen=True)
class NotifierConfig:
    # Who gets the mail: the endpoint's owner_contact, else its workspace's, else smtp_to
    # (dispatcher/engine/notifier.py, docs/operations.md "Breaker notices").
    kind: str = setting("log", _one_of("log", "smtp"),
                        "how endpoint owners hear that a breaker opened or closed again (Q3): log or smtp")
    smtp_host: str = setting("127.0.0.1", _text, "SMTP relay host, for kind: smtp")
    smtp_port: int = setting(587, _port, "SMTP relay port (587 submission, 465 implicit TLS, 25 relay)")
    smtp_security: str = setting("starttls", _one_of("starttls", "tls", "none"),
                                 "starttls: upgrade the connection; tls: TLS from the start (465); none: plain "
                                 "(refused unless smtp_host is loopback). TLS verifies the relay against the "
                                 "system CAs and http.ca_file")
    smtp_username: str | None = setting(None, lambda v: _optional(_text, v),
                                        "SMTP AUTH user name; null: no AUTH", shown="null")
    smtp_password: str | None = setting(None, lambda v: _optional(_text, v),
                                        f"SMTP AUTH password (never logged); {SMTP_PASSWORD_ENV} overrides it",
                                        shown="null", secret=True)
    smtp_from: str = setting("webhooks@larkspur.invalid", _email, "sender address of notifications")
    smtp_to: str = setting("webhook-support@larkspur.invalid", _email,
                           "operator address: gets the notices of endpoints whose endpoint and workspace "
                           "name no owner")
    smtp_timeout: float = setting(10.0, parse_duration,
                                  "longest one mail may take, connect to QUIT; then it counts as failed")
    smtp_attempts: int = setting(5, _positive_int, "tries of one mail in all; after the last failure it is "
                                                   "dropped (logged as an error)")
    retry_base: float = setting(60.0, parse_duration, "wait before a failed mail is tried again; doubles each time")
    # Owner contacts are customers' words: each is confirmed by a mailed link before it gets a notice
    # (issue 23 item 6), and no address gets more than mails_per_recipient_hour mails an hour.
    confirm_url: str = setting("", _confirm_url,
                               "the API's contact confirmation route as owners reach it (e.g. https://api.example"
                               ".com/v2/contacts/confirm), put in the mailed link with ?token=; empty: no "
                               "confirmation mail is sent, so every owner's notices go to smtp_to", shown='""')
    mails_per_recipient_hour: int = setting(10, _positive_int,
                                            "mails (notices and confirmation requests) one address gets in an "
                                            "hour at most; more wait, none is dropped")


@dataclass(frozen=True)
class LoggingConfig:
    level: str = setting("INFO", _one_of("DEBUG", "INFO", "WARNING", "ERROR"), "log level")
    file: str = setting("-", _text, "log file path, '-' for stderr")


PolicyOverrides = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]


def _policy_overrides(value: Any) -> PolicyOverrides:
    if not isinstance(value, dict):
        raise ConfigError(f"{value!r} is not a mapping of event type to policy")
    allowed = {"max_attempts": _positive_int, "base": parse_duration,
               "max_interval": parse_duration, "ceiling": parse_duration}
    parsed: list[tuple[str, tuple[tuple[str, Any], ...]]] = []
    for event_type, body in value.items():
        if not isinstance(body, dict):
            raise ConfigError(f"policy for {event_type!r} is not a mapping")
        unknown = set(body) - set(allowed)
        if unknown:
            raise ConfigError(f"policy for {event_type!r} has unknown key(s) {', '.join(sorted(unknown))}")
        try:
            parsed.append((str(event_type), tuple((k, allowed[k](v)) for k, v in body.items())))
        except ConfigError as exc:
            raise ConfigError(f"policy for {event_type!r}: {exc}") from None
    return tuple(parsed)


@dataclass(frozen=True)
class RetryConfig:
    # The defaults are the policy's own (docs/decisions.md, Retry schedule), declared once there.
    base: float = setting(_RETRY_DEFAULTS.base, parse_duration, "first retry gap; each later gap doubles")
    max_interval: float = setting(_RETRY_DEFAULTS.max_interval, parse_duration, "largest gap between two attempts")
    ceiling: float = setting(_RETRY_DEFAULTS.ceiling, parse_duration,
                             "last attempt at most this long after creation, then dead; behind an open "
                             "breaker, once a probe after it fails")
    jitter: float = setting(_RETRY_DEFAULTS.jitter, lambda v: _fraction(v), "a gap is drawn from [gap*(1-jitter), gap]")
    policies: PolicyOverrides = setting((), _policy_overrides,
                                        "per event type overrides, e.g. max_attempts: 1", shown="{}")

    def retry_policies(self) -> RetryPolicies:
        default = RetryPolicy(base=self.base, max_interval=self.max_interval,
                              ceiling=self.ceiling, jitter=self.jitter)
        by_type = {name: dataclasses.replace(default, **dict(overrides)) for name, overrides in self.policies}
        return RetryPolicies(default=default, by_event_type=MappingProxyType(by_type))


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{value!r} is not a number in [0, 1)")
    return float(value)


@dataclass(frozen=True)
class BreakerConfig:
    # The defaults are the rule's own (RFC-014: 20 failures, 5 minutes), declared once there.
    failure_threshold: int = setting(_BREAKER.failure_threshold, _positive_int, "consecutive failures that open it")
    open_for: float = setting(_BREAKER.open_for, parse_duration, "how long an open breaker waits before one probe")

    def policy(self) -> BreakerPolicy:
        return BreakerPolicy(failure_threshold=self.failure_threshold, open_for=self.open_for)


@dataclass(frozen=True)
class EndpointsConfig:
    # The defaults are the rule's own, declared once there (issue 24; docs/operations.md, "Endpoint lifecycle").
    disable_after: float = setting(_LIFECYCLE.disable_after, parse_duration,
                                   "a breaker that keeps reopening this long pauses its endpoint (events held)")
    warn_before: float = setting(_LIFECYCLE.warn_before, parse_duration,
                                 "how long before the automatic pause, and before held events expire, the owner "
                                 "is told")
    hold_for: float = setting(_LIFECYCLE.hold_for, parse_duration,
                              "how long a paused endpoint's events are held before they become dead")
    flap_window: float = setting(_LIFECYCLE.flap_window, parse_duration,
                                 "a closed breaker must stay closed this long to end its episode (recovered "
                                 "notice); a reopen sooner continues it, silently")

    def lifecycle_policy(self) -> LifecyclePolicy:
        return LifecyclePolicy(disable_after=self.disable_after, warn_before=self.warn_before,
                               hold_for=self.hold_for, flap_window=self.flap_window)


@dataclass(frozen=True)
class SecretsConfig:
    rotation_grace: float = setting(ROTATION_GRACE, parse_duration,
                                    "after a secret rotation, how long the previous secret also signs every delivery")


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{value!r} is not a number in [0, 1]")
    return float(value)


@dataclass(frozen=True)
class TracingConfig:
    # docs/operations.md, "Tracing"; the optional `otel` extra.  The standard OTEL_* variables
    # override these (config_from_mapping, _tracing_from_env): the environment wins.
    enabled: bool = setting(False, _boolean,
                            "OpenTelemetry spans from the producer's send() to the receiver "
                            "(needs the otel extra; off: nothing of it is imported)")
    exporter: str = setting("otlp", _one_of("otlp", "console", "none"),
                            "otlp (OTLP over HTTP/protobuf), console (stdout) or none; OTEL_TRACES_EXPORTER wins")
    endpoint: str = setting("http://127.0.0.1:4318/v1/traces", _text,
                            "the OTLP/HTTP traces URL; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or "
                            "OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, wins")
    sample_ratio: float = setting(1.0, _ratio,
                                  "share of new traces kept, 0 to 1 (a child follows its parent's decision); "
                                  "OTEL_TRACES_SAMPLER_ARG wins")


@dataclass(frozen=True)
class Config:
    region: str = setting("local", _region, "region name; each region runs its own dispatchers and database (Q4)")
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    # How the workers send; dry_run (phase 0) decides whether they send at all.
    dry_run: bool = setting(False, _boolean,
                            "rollout phase 0: shadow rows are marked shadow, unsent; live rows are always sent")
    http: HttpConfig = field(default_factory=HttpConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    statsd: StatsdConfig = field(default_factory=StatsdConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    partitions: PartitionsConfig = field(default_factory=PartitionsConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    notifier: NotifierConfig = field(default_factory=NotifierConfig)
    secrets: SecretsConfig = field(default_factory=SecretsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    source: str = field(default="<defaults>", compare=False)

    def ended_by(self) -> float:
        """How long after its creation a row may still end dead or failed: the longest retry ceiling,
        then one ``breaker.open_for`` (the last chance behind an open breaker, docs/decisions.md)."""
        policies = self.retry.retry_policies()
        ceiling = max([policies.default.ceiling, *(p.ceiling for p in policies.by_event_type.values())])
        return ceiling + self.breaker.open_for

    def partition_policy(self) -> PartitionPolicy:
        retention = self.retention
        return PartitionPolicy(days_ahead=self.partitions.days_ahead, delivered=retention.delivered,
                               dead=retention.dead, ended_by=self.ended_by(), attempts=retention.attempts,
                               events=retention.events)


# The sections are Config's fields made with a default_factory, each its section's class.
_SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)  # type: ignore[misc]
                              if f.default_factory is not dataclasses.MISSING}


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'top level'}: expected a mapping, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(str(key) for key in set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        section = _SECTIONS.get(name) if cls is Config else None
        if section is not None:
            values[name] = _build(section, value if value is not None else {}, f"{name}.")
            continue
        try:
            values[name] = fields[name].metadata["parse"](value)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}{name}: {exc}") from None
    return cls(**values)


def config_from_mapping(raw: Mapping[str, Any], env: Mapping[str, str] | None = None,
                        source: str = "<mapping>") -> Config:
    """Build a validated Config from parsed YAML, applying environment overrides."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"top level: expected a mapping of settings, got {type(raw).__name__}")
    config = _build(Config, dict(raw), "")
    environ = os.environ if env is None else env
    dsn = environ.get(DSN_ENV)
    if dsn:
        config = dataclasses.replace(config, database=dataclasses.replace(config.database, dsn=dsn))
    smtp_password = environ.get(SMTP_PASSWORD_ENV)
    if smtp_password:
        config = dataclasses.replace(config, notifier=dataclasses.replace(config.notifier,
                                                                          smtp_password=smtp_password))
    config = dataclasses.replace(config, source=source, tracing=_tracing_from_env(config.tracing, environ))
    _check_consistency(config)
    return config


def _tracing_from_env(tracing: TracingConfig, environ: Mapping[str, str]) -> TracingConfig:
    """The standard OTEL_* variables over the file's tracing settings (the environment wins, as
    DISPATCHER_DATABASE_DSN does): OTEL_SDK_DISABLED=true turns tracing off (never on)."""
    changes: dict[str, Any] = {}
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        changes["enabled"] = False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        changes["exporter"] = _env_setting("OTEL_TRACES_EXPORTER", _one_of("otlp", "console", "none"), exporter)
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        changes["endpoint"] = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        changes["endpoint"] = environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    ratio = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if ratio:
        changes["sample_ratio"] = _env_setting("OTEL_TRACES_SAMPLER_ARG", _ratio, _number(ratio))
    return dataclasses.replace(tracing, **changes) if changes else tracing


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _env_setting(name: str, parse: Parser, value: Any) -> Any:
    try:
        return parse(value)
    except ConfigError as exc:
        raise ConfigError(f"environment variable {name}: {exc}") from None


def _check_consistency(config: Config) -> None:
    # A row may wait one full deadline in the local queue and one while sending;
    # a shorter lease would let a second worker take it while it is still ours.
    floor = 2 * config.http.timeout
    if config.workers.lease <= floor:
        raise ConfigError(f"workers.lease ({config.workers.lease:g}s) must exceed 2 x http.timeout ({floor:g}s)")
    if config.retry.max_interval < config.retry.base:
        raise ConfigError("retry.max_interval must not be shorter than retry.base")
    # A probe threshold within one beat or one round would report a healthy fleet as dead.
    if config.alerts.heartbeat_age <= config.workers.status_interval:
        raise ConfigError("alerts.heartbeat_age must exceed workers.status_interval")
    if config.alerts.leader_age <= config.alerts.check_interval:
        raise ConfigError("alerts.leader_age must exceed alerts.check_interval")
    # With no TLS, SMTP AUTH sends the relay's password in clear: only the local host may see it.
    if config.notifier.smtp_security == "none" and not _is_loopback(config.notifier.smtp_host):
        raise ConfigError(f"notifier.smtp_security: none is for a relay on loopback only, not "
                          f"{config.notifier.smtp_host!r}; use starttls or tls")


def _is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address literal (an IPv4-mapped one included)."""
    name = host.lower().rstrip(".")
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Read a YAML file into a Config; raises ConfigError with a one-line reason."""
    return config_from_text(read_config_text(path), env, source=str(Path(path)))


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A config file's text; raises ConfigError naming the file when it cannot be read."""
    file = Path(path)
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {file} is not UTF-8 text") from None


def config_from_text(text: str, env: Mapping[str, str] | None = None, source: str = "<text>") -> Config:
    """A config file's text (YAML) into a Config; errors name ``source``."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {source} is not valid YAML{where}") from None
    return config_from_mapping(raw or {}, env, source=source)


def _shown(f: dataclasses.Field[Any]) -> str:
    """A setting's default as it would be written in the YAML file."""
    if "shown" in f.metadata:
        return str(f.metadata["shown"])
    if f.metadata["parse"] is parse_duration:
        return format_duration(float(f.default))  # type: ignore[arg-type]
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    if isinstance(f.default, tuple):
        return "[" + ", ".join(str(item) for item in f.default) + "]"
    if isinstance(f.default, str) and not _plain_yaml_scalar(f.default):
        return '"' + f.default.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(f.default)


def _plain_yaml_scalar(text: str) -> bool:
    """Whether ``text`` reads back as the same string when written unquoted."""
    try:
        return bool(yaml.safe_load(f"v: {text}") == {"v": text})
    except yaml.YAMLError:
        return False


def describe_settings() -> list[tuple[str, str, str]]:
    """(dotted name, default as written in YAML, doc) of every setting, for the docs."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            if f.name in _SECTIONS and cls is Config:
                walk(_SECTIONS[f.name], f"{f.name}.")
            elif "doc" in f.metadata:
                rows.append((prefix + f.name, _shown(f), f.metadata["doc"]))

    walk(Config, "")
    return rows


def settings_markdown() -> str:
    """The settings reference of docs/configuration.md (``python -m dispatcher.config``)."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for name, default, doc in describe_settings():
        cells = (f"`{name}`", f"`{default}`", doc)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
