"""The one duration syntax: a number and a unit, ``250ms``, ``10s``, ``1.5m``, ``24h``, ``30d``.

Used by the configuration file (``config``: a bad one is a ``ConfigError``), the
CLI's ``gate --since`` (a ``UsageError``) and the API's stats ``window`` (a
400).  Each caller adds its own range; this module only reads the text, and
refuses anything else with a :class:`DurationError`.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["DurationError", "UNIT_SECONDS", "format_duration", "parse_duration"]

# ASCII digits only: \d would also take other scripts' digits, which no other
# reader of these files and URLs expects.
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class DurationError(ValueError):
    """Text that is not a duration; the message quotes it and shows the syntax."""


def parse_duration(value: Any, *, whole: bool = False) -> float:
    """Seconds of a duration, > 0 and finite.

    ``value`` must be a string: YAML's bare ``10`` has no unit and is refused.
    ``whole`` also refuses a fractional number (``1.5h``).
    """
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match and not (whole and "." in match.group(1)):
        seconds = float(match.group(1)) * UNIT_SECONDS[match.group(2)]
        if 0 < seconds < math.inf:
            return seconds
    example = "250ms, 10s, 5m, 24h" if not whole else "90m, 24h, 7d (whole numbers)"
    raise DurationError(f"{value!r} is not a duration (write e.g. {example})")


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration`, in the largest whole unit (``24h``, ``500ms``)."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        count = seconds / size
        if count >= 1 and count == int(count) and not (unit == "d" and count < 2):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"
