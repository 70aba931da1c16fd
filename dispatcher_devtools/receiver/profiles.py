"""How an endpoint of the mock receiver answers: :class:`Profile`, the base
profiles a URL names, and parsing them from URLs, JSON and YAML."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Final

# The standard normal's 99th percentile: a log-normal's p99 is median * exp(Z_99 * sigma).
Z_99: Final = NormalDist().inv_cdf(0.99)


def _header_safe(text: str) -> bool:
    return text.isprintable() and text.isascii()  # no CR/LF: no header injection


@dataclass(frozen=True, slots=True)
class Profile:
    """How an endpoint answers.  The field names are the YAML/JSON keys."""

    status: int = 200               # the answer when no error is drawn
    latency_ms: float = 0.0         # fixed delay before answering
    median_ms: float = 0.0          # > 0 adds a log-normal delay with this median
    sigma: float = 0.5              # shape of that log-normal delay
    p99_ms: float = 0.0             # > 0 (with median_ms): the delay's p99 instead; sigma follows from it
    error_rate: float = 0.0         # probability of answering error_status instead
    error_status: int = 500
    retry_after: str | None = None  # sent with every non-2xx answer
    location: str | None = None     # sent when set (redirects)
    hang: bool = False              # never answer; hold the connection until the client leaves
    body_bytes: int = 0             # size of the response body
    drip_ms: float = 0.0            # > 0: send the answer one byte per drip_ms (a slow-drip endpoint)

    def __post_init__(self) -> None:
        if not (200 <= self.status <= 599 and 200 <= self.error_status <= 599):
            raise ValueError("status codes must be within 200..599")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be within 0..1")
        numbers = (self.latency_ms, self.median_ms, self.sigma, self.p99_ms, self.drip_ms)
        if not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise ValueError("latency_ms, median_ms, sigma, p99_ms and drip_ms must be finite and not negative")
        if self.p99_ms and not self.p99_ms >= self.median_ms > 0:
            raise ValueError("p99_ms needs a median_ms, and must not be below it")
        for text in (self.retry_after, self.location):
            if text is not None and not _header_safe(text):
                raise ValueError(f"not usable as a header value: {text!r}")
        if not 0 <= self.body_bytes <= 1024 * 1024:
            raise ValueError("body_bytes must be within 0..1048576")

    def delay(self, rng: random.Random) -> float:
        """Seconds to wait before answering."""
        seconds = self.latency_ms / 1000.0
        if self.median_ms > 0:
            seconds += rng.lognormvariate(math.log(self.median_ms / 1000.0), self.lognormal_sigma())
        return seconds

    def lognormal_sigma(self) -> float:
        """The log-normal delay's shape: ``sigma``, or the one that puts its p99 at ``p99_ms``."""
        if self.p99_ms:
            return math.log(self.p99_ms / self.median_ms) / Z_99
        return self.sigma

    def pick_status(self, rng: random.Random) -> int:
        if self.error_rate >= 1.0 or (self.error_rate > 0 and rng.random() < self.error_rate):
            return self.error_status
        return self.status


BASE_PROFILES: Final[Mapping[str, Profile]] = {
    "ok": Profile(),
    "latency": Profile(),
    "error": Profile(error_rate=1.0),
    "ratelimit": Profile(error_rate=1.0, error_status=429, retry_after="1"),
    "unavailable": Profile(error_rate=1.0, error_status=503, retry_after="1"),
    "hang": Profile(hang=True),
    "slow": Profile(latency_ms=4800.0),
    # An answer that trickles out a byte a second: only a whole-attempt deadline ends it.
    "drip": Profile(drip_ms=1000.0),
    "redirect": Profile(status=302, location="/ok/redirected"),
    "status": Profile(status=404),
}

# Short query-string names.  "status" means the *error* status in a URL, as in
# /error/k?rate=0.02&status=500, while "code" is the plain status.
QUERY_ALIASES: Final[Mapping[str, str]] = {
    "ms": "latency_ms", "rate": "error_rate", "status": "error_status", "code": "status",
    "to": "location", "body": "body_bytes", "p99": "p99_ms", "drip": "drip_ms",
}


def as_bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on", ""):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    return bool(value)


def _as_optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


_CONVERTERS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "status": int, "latency_ms": float, "median_ms": float, "sigma": float, "p99_ms": float, "drip_ms": float,
    "error_rate": float, "error_status": int, "retry_after": _as_optional_str,
    "location": _as_optional_str, "hang": as_bool, "body_bytes": int,
}


def build_profile(base: str, params: Mapping[str, Any]) -> Profile:
    """``BASE_PROFILES[base]`` with canonical-named ``params`` applied; ValueError if invalid."""
    try:
        profile = BASE_PROFILES[base]
    except KeyError:
        raise ValueError(f"unknown profile {base!r}") from None
    changes: dict[str, Any] = {}
    for name, value in params.items():
        convert = _CONVERTERS.get(name)
        if convert is None:
            raise ValueError(f"unknown profile field {name!r}")
        try:
            changes[name] = convert(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad value for {name}: {value!r}") from exc
    return replace(profile, **changes)


def profile_from_mapping(spec: Mapping[str, Any] | str) -> Profile:
    """A profile from YAML/JSON: ``{"profile": "error", "error_rate": 0.5}`` or just ``"ok"``."""
    if isinstance(spec, str):
        return build_profile(spec, {})
    if not isinstance(spec, Mapping):
        raise ValueError("a profile must be a mapping or a base profile name")
    params = dict(spec)
    base = params.pop("profile", "ok")
    return build_profile(str(base), params)


def load_profile_file(path: str) -> dict[str, Profile]:
    import yaml  # only the CLI with --profiles needs it

    with open(path, encoding="utf-8") as handle:
        document = yaml.safe_load(handle) or {}
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a mapping of endpoint key to profile")
    return {str(key): profile_from_mapping(spec) for key, spec in document.items()}

