"""What goes on the wire: the JSON body and the headers of every POST.

Shared by the dispatcher and the producer's legacy synchronous path, so both
send byte-identical bodies for the same event and sign them the same way.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Sequence
from datetime import UTC, datetime

from dispatcher import __version__
from dispatcher.signing import secret_key, signature_header

USER_AGENT = f"Larkspur-Webhooks/{__version__}"

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


def signing_keys(secrets: Sequence[str]) -> tuple[bytes, ...]:
    """Keys for the current secret and, inside its rotation grace, the previous one."""
    return tuple(secret_key(secret) for secret in secrets)


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
