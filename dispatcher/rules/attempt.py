"""The attempt vocabulary that the transport and the retry rule share: what one POST came to.

The transport produces a :class:`TransportResult`; the retry rule (``rules.retry``) classifies it.  It lives
among the rules so that neither imports the other's layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorClass = Literal[
    "timeout",      # the total deadline passed (connect through last body byte)
    "connection",   # refused, reset, closed mid-response
    "tls",          # handshake / certificate failure
    "dns",          # the host name does not resolve
    "blocked",      # refused by the outbound network policy (SSRF guard, require_https)
    "invalid_url",  # not a URL we can send to (malformed, unknown scheme, no host)
    "protocol",     # the peer did not speak HTTP/1.1 (malformed status line, bad headers);
                    # also a request we refuse to put on the wire (CR/LF in a header)
]


@dataclass(frozen=True, slots=True)
class TransportResult:
    status: int | None          # HTTP status, None when no response was read
    body: bytes                 # at most max_response_bytes of the body, never decompressed
    error: ErrorClass | None    # None when a status line and headers were read
    detail: str                 # short human-readable reason ("" on success)
    retry_after: str | None     # raw Retry-After header, if any
    duration: float             # seconds spent in the attempt
