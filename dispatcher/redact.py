"""The scrubber for anything a receiver sends back that we store or log.

``last_error`` and the stored 256-byte response excerpt come from customers'
servers, which echo headers and query strings; credentials in them must not
land in our database or logs.
"""

from __future__ import annotations

import re

MASK = "[REDACTED]"

_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Authorization: Bearer xxx / Basic xxx, as a header or echoed in JSON
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:bearer|basic|token)?\s*[^\s\"',;]+"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"),
    # key=value and "key": "value" pairs whose key names a credential
    re.compile(
        r"(?i)((?:password|passwd|pwd|secret|token|access_token|refresh_token|api[_-]?key|apikey|"
        r"client_secret|private_key|session|cookie|signature)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"
    ),
    # things that look like keys whatever their label: whsec_, sk_live_, long hex/base64 runs
    re.compile(r"()\b(?:whsec|sk|pk|rk)_(?:live_|test_)?[A-Za-z0-9+/=_-]{8,}"),
    re.compile(r"()\b[A-Fa-f0-9]{32,}\b"),
    re.compile(r"()\b[A-Za-z0-9+/_-]{40,}={0,2}"),
)


def scrub(text: str) -> str:
    """Mask credentials in ``text``; what remains is safe to store and log."""
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def excerpt(body: bytes, limit: int = 256) -> str:
    """The first ``limit`` bytes of a response body, decoded leniently and scrubbed."""
    return scrub(body[:limit].decode("utf-8", errors="replace"))
