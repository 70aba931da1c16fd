"""statsd metrics with the RFC's names, mapped onto plain statsd (no tags).

Mapping (``<p>`` is ``statsd.prefix``)::

    webhook_delivery_attempts_total{result}   -> <p>.webhook_delivery_attempts_total.<result>   (counter)
    webhook_delivery_latency_seconds          -> <p>.webhook_delivery_latency_seconds.attempt    (timer, ms)
                                                 <p>.webhook_delivery_latency_seconds.commit_to_2xx (timer, ms)
    webhook_backlog_age_seconds               -> <p>.webhook_backlog_age_seconds                 (gauge, s)
    webhook_breaker_open{endpoint}            -> <p>.webhook_breaker_open.<endpoint_id>           (gauge 0/1)
                                                 <p>.webhook_breaker_open_total                   (gauge, count)
    backlog alert                             -> <p>.webhook_backlog_alert                        (gauge 0/1)

Timers are in milliseconds, as statsd defines them; the names keep the RFC's
``_seconds`` so dashboards match the design.  Sending is UDP, fire and
forget: an unreachable or unresolvable statsd costs nothing and never raises
into delivery.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable

import statsd

from dispatcher.config import StatsdConfig

log = logging.getLogger("dispatcher.metrics")

# Datagram size the pipeline packs lines into: statsd's recommendation for a
# network with a 1500-byte MTU (the library's default, 512, is its advice for
# the open internet), so a flush of 200 attempts is ~20 sendto calls, not ~60.
MAX_DATAGRAM = 1432


class Metrics:
    def __init__(self, config: StatsdConfig) -> None:
        self._client: statsd.StatsClient | None = None
        if not config.enabled:
            return
        try:
            self._client = statsd.StatsClient(config.host, config.port, prefix=config.prefix,
                                              maxudpsize=MAX_DATAGRAM)
        except (OSError, socket.gaierror) as exc:
            log.warning("statsd at %s:%d unusable, metrics disabled: %s", config.host, config.port, exc)

    def attempts(self, results: Iterable[tuple[str, float, float | None]]) -> None:
        """One (result, attempt seconds, commit-to-2xx seconds or None) per attempt, in one batch."""
        if self._client is None:
            return
        try:
            counts: dict[str, int] = {}
            with self._client.pipeline() as pipe:
                for result, duration, commit_to_2xx in results:
                    counts[result] = counts.get(result, 0) + 1
                    pipe.timing("webhook_delivery_latency_seconds.attempt", duration * 1000.0)
                    if commit_to_2xx is not None:
                        pipe.timing("webhook_delivery_latency_seconds.commit_to_2xx", commit_to_2xx * 1000.0)
                # A counter sent once with n is the same to statsd as n sends of 1.
                for result, count in counts.items():
                    pipe.incr(f"webhook_delivery_attempts_total.{result}", count)
        except OSError:
            pass  # metrics never break delivery

    def gauge(self, name: str, value: float) -> None:
        if self._client is None:
            return
        try:
            self._client.gauge(name, value)
        except OSError:
            pass

    def timing(self, name: str, seconds: float) -> None:
        """One timer sample (statsd timers are in ms)."""
        if self._client is None:
            return
        try:
            self._client.timing(name, seconds * 1000.0)
        except OSError:
            pass

    def breakers(self, states: Iterable[tuple[int, bool]]) -> None:
        """Per-endpoint breaker gauges, plus the count of open ones."""
        if self._client is None:
            return
        try:
            with self._client.pipeline() as pipe:
                open_count = 0
                for endpoint_id, is_open in states:
                    pipe.gauge(f"webhook_breaker_open.{endpoint_id}", 1 if is_open else 0)
                    open_count += int(is_open)
                pipe.gauge("webhook_breaker_open_total", open_count)
        except OSError:
            pass
