"""What goes on the wire: the JSON body and the headers of every POST.

Shared by the dispatcher and the producer's legacy synchronous path, so both
send byte-identical bodies for the same event and sign them the same way.
"""

from __future__ import annotations

import functools
import json
import json.encoder
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from dispatcher.signing import secret_key, signature_header
from dispatcher.version import __version__

USER_AGENT = f"Larkspur-Webhooks/{__version__}"

# Event ids (docs/decisions.md, Limits: printable, at most 200 characters).  An id
# travels as the value of two headers (Idempotency-Key, webhook-id) and inside
# the signed content, so "printable" is narrowed to visible ASCII: a control
# character (CR/LF) cannot be put in a header at all, receivers strip a leading
# or trailing space from a header value and decode non-ASCII bytes in
# different ways, and either change breaks their signature check.
EVENT_ID_MAX_CHARS = 200
_VISIBLE_ASCII = re.compile(r"[!-~]+")

_quoted = json.encoder.encode_basestring_ascii  # json.dumps' own string encoder (C)


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, the same text the store's claim returns."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event_id: str, event_type: str, workspace_id: str, sequence: int | None,
               occurred_at: str, payload_json: str) -> bytes:
    """The POST body.  ``payload_json`` is inserted verbatim (it is already JSON
    text from the database), so retries and replays send identical bytes."""
    # Byte for byte what json.dumps({...}, separators=(",", ":")) writes for
    # these five keys (same C string encoder), without building a dict and
    # running the general encoder once per attempt.
    number = "null" if sequence is None else int.__repr__(int(sequence))
    return (f'{{"id":{_quoted(event_id)},"type":{_quoted(event_type)},"workspace_id":{_quoted(workspace_id)},'
            f'"sequence":{number},"occurred_at":{_quoted(occurred_at)},"data":{payload_json}}}').encode()


def event_id_problem(event_id: object) -> str | None:
    """Why ``event_id`` cannot be an event's id, or None when it can.

    The one rule: the producer refuses such an id (``ProducerError``) and the
    engine fails a row that carries one (written before the rule, or by an
    outside tool) instead of retrying a request that can never be made.  The
    message names the problem without echoing the id.
    """
    if not isinstance(event_id, str):
        return f"event id is not a string ({type(event_id).__name__})"
    if not event_id:
        return "event id is empty"
    if len(event_id) > EVENT_ID_MAX_CHARS:
        return f"event id is {len(event_id)} characters, over {EVENT_ID_MAX_CHARS}"
    if _VISIBLE_ASCII.fullmatch(event_id):
        return None
    position, char = next((i, c) for i, c in enumerate(event_id) if not "!" <= c <= "~")
    kind = "a space" if char == " " else "a control character" if char < " " or char == "\x7f" \
        else "a non-ASCII character"
    return (f"event id contains {kind} ({ascii(char)} at position {position}); "
            f"ids are 1-{EVENT_ID_MAX_CHARS} visible ASCII characters")


def signing_keys(secrets: Sequence[str]) -> tuple[bytes, ...]:
    """Keys for the current secret and, inside its rotation grace, the previous one."""
    return tuple(_key_of(secret) for secret in secrets)


# A workspace's secret comes with every row of its deliveries: decode it once, not per
# attempt (signing.py keeps an HMAC keyed with it, too).  A secret that does not decode
# raises each time (errors are not cached).
_key_of = functools.lru_cache(maxsize=4096)(secret_key)


def delivery_headers(event_id: str, attempt: int, timestamp: int, body: bytes,
                     keys: Sequence[bytes]) -> dict[str, str]:
    signature = signature_header(keys, event_id, timestamp, body)
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Idempotency-Key": event_id,
        "X-Larkspur-Attempt": str(attempt),
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
        "X-Larkspur-Signature": signature,
    }
