"""``gate phase0 --producer-timings FILE``: the producers' outbox-write histogram, as the operator exported it.

Producers time their outbox write (``webhook_producer_outbox_write_seconds``,
docs/metrics.md) into statsd; the database never sees those timings, so the
gate reads them from an export in one of two forms (docs/rollout.md,
"Producer timings"):

* a Prometheus HTTP API response, from ``/api/v1/query`` or
  ``/api/v1/query_range``, whose result is a matrix of the histogram's
  cumulative buckets (series with an ``le`` label), e.g. the range selector
  ``webhook_producer_outbox_write_seconds_bucket[72h]``;
* a statsd_exporter ``/metrics`` dump (the Prometheus text format): its
  buckets count from the exporter's start (``process_start_time_seconds``) to
  the dump, which is the samples' own timestamp when they carry one, else the
  file's modification time.

Either form becomes :class:`dispatcher.rules.gates.CounterSeries`; the gate
computes the p99 itself (``histogram_quantile``) over the export's span, and
checks that the span covers the window.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dispatcher.rules.gates import CounterSeries

METRIC = "webhook_producer_outbox_write_seconds"
BUCKET = f"{METRIC}_bucket"
START = "process_start_time_seconds"

# name{labels} value [timestamp-ms]  (the text format; comments and blank lines aside)
_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?[0-9]+))?")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class TimingsError(Exception):
    """The export cannot be read as the producers' histogram; the message says why."""


def read_timings(path: Path) -> list[CounterSeries]:
    """The histogram's series from the file at ``path``, in whichever form it holds."""
    try:
        text = path.read_text(encoding="utf-8")
        modified = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except (OSError, UnicodeDecodeError) as exc:
        raise TimingsError(f"cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    if text.lstrip().startswith("{"):
        return parse_prometheus_json(text)
    return parse_exposition(text, modified)


def _number(text: Any, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise TimingsError(f"{what} is not a number: {text!r}") from None
    if math.isnan(value):
        raise TimingsError(f"{what} is NaN")
    return value


def _bound(text: str) -> float:
    bound = _number(text, "bucket bound le")
    if bound < 0:
        raise TimingsError(f"bucket bound le is negative: {text!r}")
    return bound


def _when(seconds: Any) -> datetime:
    value = _number(seconds, "timestamp")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise TimingsError(f"timestamp {seconds!r} is out of range") from None


def parse_prometheus_json(text: str) -> list[CounterSeries]:
    """A ``/api/v1/query`` or ``/api/v1/query_range`` response body."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise TimingsError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("status") != "success":
        error = document.get("error") if isinstance(document, dict) else None
        raise TimingsError(f"not a successful Prometheus API response{f': {error}' if error else ''}")
    data = document.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if kind not in ("matrix", "vector") or not isinstance(result, list):
        raise TimingsError(f"a {kind or 'malformed'} result: the histogram's buckets come as a matrix")
    series = []
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        if not isinstance(labels, dict) or "le" not in labels or labels.get("__name__", BUCKET) != BUCKET:
            continue
        raw = item.get("values") if kind == "matrix" else [item.get("value")]
        if not isinstance(raw, list) or not all(isinstance(p, list) and len(p) == 2 for p in raw):
            raise TimingsError(f"the series {labels} has malformed samples")
        points = tuple((_when(t), _number(v, "count")) for t, v in raw)
        series.append(CounterSeries(_bound(labels["le"]), points))
    if not series:
        raise TimingsError(f"no {BUCKET} series (a series with an le label) in the result")
    return series


def _labels(text: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    rest = text or ""
    while rest.strip():
        match = _LABEL.match(rest)
        if not match:
            raise TimingsError(f"cannot read the labels {{{text}}}")
        found[match.group(1)] = match.group(2)
        rest = rest[match.end():]
    return found


def parse_exposition(text: str, taken_at: datetime) -> list[CounterSeries]:
    """A statsd_exporter ``/metrics`` dump taken at ``taken_at`` (unless its samples say when)."""
    started: datetime | None = None
    counts: list[tuple[float, float, datetime]] = []
    summary = False
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line.strip())
        if not match:
            raise TimingsError(f"line {number} is not a sample: {line.strip()[:80]!r}")
        name, labels, value, stamp = match.groups()
        if name == START:
            started = _when(value)
        elif name == BUCKET:
            le = _labels(labels).get("le")
            if le is None:
                raise TimingsError(f"line {number}: a bucket without an le label")
            when = _when(int(stamp) / 1000) if stamp else taken_at
            counts.append((_bound(le), _number(value, "count"), when))
        elif name == METRIC and "quantile" in _labels(labels):
            summary = True
    if not counts:
        if summary:
            raise TimingsError(f"{METRIC} is a summary here: its quantiles cover only the summary's max age "
                               "(10 min by default); map it as a histogram (deploy/prometheus/statsd_mapping.yml)")
        raise TimingsError(f"no {BUCKET} samples in the dump")
    if started is None:
        raise TimingsError(f"no {START} in the dump: since when its counts run is unknown")
    return [CounterSeries(le, ((started, 0.0), (when, count))) for le, count, when in counts]
