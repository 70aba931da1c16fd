"""statsd metrics with the RFC's names (docs/metrics.md is the contract; a test
checks every line sent against its table).

Two wire forms, chosen by ``statsd.tags``:

* ``dogstatsd`` (the default): the RFC's names exactly, labels as DogStatsD
  tags (``webhook_delivery_attempts_total:3|c|#result:delivered,region:eu-west-1``),
  which Telegraf, the Datadog agent and Prometheus' statsd_exporter read as
  labels.  Latency is a histogram (``|h``) in seconds, as its name says.
* ``none``: plain statsd for Graphite -- ``statsd.prefix`` and each label
  folded into a dotted name, latency as statsd timers (``|ms``, milliseconds,
  as statsd defines them); deploy/prometheus/statsd_mapping.yml maps these
  back to the RFC's names and labels (statsd_exporter turns ms into seconds).

Sending is UDP, fire and forget: an unreachable or unresolvable statsd costs
nothing and never raises into delivery.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import Any

from dispatcher.config import StatsdConfig

log = logging.getLogger("dispatcher.metrics")

# Datagram size lines are packed into: statsd's recommendation for a network
# with a 1500-byte MTU, so a flush of 200 attempts is ~20 sendto calls.
MAX_DATAGRAM = 1432

# Names whose plain (``none``) form differs from the RFC form beyond the
# folded labels: the names existing Graphite dashboards chart.
_PLAIN_NAMES = {"webhook_breakers_open": "webhook_breaker_open_total"}
_LATENCY = "webhook_delivery_latency_seconds"

Tags = tuple[tuple[str, str], ...]


class Metrics:
    def __init__(self, config: StatsdConfig, region: str | None = None) -> None:
        self._tagged = config.tags == "dogstatsd"
        self._prefix = config.prefix.rstrip(".") + "."
        self._region: Tags = (("region", region),) if region and self._tagged else ()
        self._seconds_kind = "h" if self._tagged else "ms"
        self._templates: dict[tuple[str, str, Tags], tuple[str, str]] = {}
        self._sock: socket.socket | None = None
        self._address: Any = ()
        if not config.enabled:
            return
        try:
            family, kind, proto, _, address = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_DGRAM)[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)  # a full send buffer drops the datagram rather than waiting
        except OSError as exc:  # socket.gaierror included
            log.warning("statsd at %s:%d unusable, metrics disabled: %s", config.host, config.port, exc)
            return
        self._sock, self._address = sock, address

    # -- what the dispatcher reports -----------------------------------------

    def attempts(self, results: Iterable[tuple[str, float | None, float | None]]) -> None:
        """One (result, attempt seconds, commit-to-2xx seconds) per attempt, in one batch; a None
        duration is no sample (a shadow row's mark: counted under its own result, never timed)."""
        if self._sock is None:
            return
        counts: dict[str, int] = {}
        lines = []
        # Two lines per attempt: their fixed parts are looked up once per batch.
        kind = self._seconds_kind
        value = self._seconds_value
        attempt_head, attempt_tail = self._template(_LATENCY, kind, (("stage", "attempt"),))
        commit_head, commit_tail = self._template(_LATENCY, kind, (("stage", "commit_to_2xx"),))
        for result, duration, commit_to_2xx in results:
            counts[result] = counts.get(result, 0) + 1
            if duration is not None:
                lines.append(attempt_head + value(duration) + attempt_tail)
            if commit_to_2xx is not None:
                lines.append(commit_head + value(commit_to_2xx) + commit_tail)
        # A counter sent once with n is the same to statsd as n sends of 1.
        lines.extend(self._line("webhook_delivery_attempts_total", count, "c", (("result", result),))
                     for result, count in counts.items())
        self._send(lines)

    def breakers(self, states: Iterable[tuple[int, str]]) -> None:
        """Per-endpoint breaker gauges (:func:`breaker_gauge`), plus the count of breakers not closed."""
        lines, not_closed = [], 0
        for endpoint_id, state in states:
            value = breaker_gauge(state)
            not_closed += value
            lines.append(self._line("webhook_breaker_open", value, "g", (("endpoint", str(endpoint_id)),)))
        lines.append(self._line("webhook_breakers_open", not_closed, "g"))
        self._send(lines)

    def breaker(self, endpoint_id: int, state: str) -> None:
        """One endpoint's breaker gauge, on a transition."""
        self._send([self._line("webhook_breaker_open", breaker_gauge(state), "g", (("endpoint", str(endpoint_id)),))])

    def producer_send(self, mode: str, total: float, write: float | None) -> None:
        """``send()``'s own time (G2, the phase 0 gate), by path; and the outbox write alone."""
        lines = [self._seconds("webhook_producer_send_seconds", total, (("mode", mode),))]
        if write is not None:
            lines.append(self._seconds("webhook_producer_outbox_write_seconds", write))
        self._send(lines)

    def producer_shadow_skipped(self, reason: str) -> None:
        """A flag-off send that wrote no shadow rows where they were due (docs/producer.md)."""
        self._send([self._line("webhook_producer_shadow_skipped_total", 1, "c", (("reason", reason),))])

    def gauges(self, values: Iterable[tuple[str, float]]) -> None:
        """Unlabelled gauges, in one datagram (the upkeep leader's figures)."""
        self._send([self._line(name, value, "g") for name, value in values])

    # -- wire format ---------------------------------------------------------

    def _seconds(self, name: str, seconds: float, labels: Tags = ()) -> str:
        """A duration: a histogram in seconds with tags, a statsd timer in ms without."""
        head, tail = self._template(name, self._seconds_kind, labels)
        return head + self._seconds_value(seconds) + tail

    def _seconds_value(self, seconds: float) -> str:
        if self._tagged:
            return _number(round(seconds, 6))
        return _number(round(seconds * 1000.0, 3))

    def _line(self, name: str, value: float, kind: str, labels: Tags = ()) -> str:
        head, tail = self._template(name, kind, labels)
        return head + _number(value) + tail

    def _template(self, name: str, kind: str, labels: Tags) -> tuple[str, str]:
        """A line's text before and after its value: built once per name, kind and labels."""
        key = (name, kind, labels)
        template = self._templates.get(key)
        if template is None:
            if self._tagged:
                tags = ",".join(f"{k}:{v}" for k, v in labels + self._region)
                template = (f"{name}:", f"|{kind}" + (f"|#{tags}" if tags else ""))
            else:
                dotted = "".join(f".{v}" for _, v in labels)
                template = (f"{self._prefix}{_PLAIN_NAMES.get(name, name)}{dotted}:", f"|{kind}")
            if len(self._templates) >= 4096:  # per-endpoint gauges: bounded, not a leak
                self._templates.clear()
            self._templates[key] = template
        return template

    def _send(self, lines: list[str]) -> None:
        if self._sock is None or not lines:
            return
        packet: list[str] = []
        size = 0
        for line in lines:
            if packet and size + 1 + len(line) > MAX_DATAGRAM:
                self._sendto("\n".join(packet))
                packet, size = [], 0
            packet.append(line)
            size += len(line) + (1 if size else 0)
        self._sendto("\n".join(packet))

    def _sendto(self, data: str) -> None:
        assert self._sock is not None
        try:
            self._sock.sendto(data.encode("ascii", "replace"), self._address)
        except OSError:
            pass  # metrics never break delivery


def breaker_gauge(state: str) -> int:
    """``webhook_breaker_open``: 1 while the breaker is open or half-open (a
    probe is not a recovery), 0 once it is closed."""
    return 0 if state == "closed" else 1


def _number(value: float) -> str:
    """Plain decimal, never an exponent (statsd servers do not all read ``1e+07``)."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"
