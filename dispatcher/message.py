"""What goes on the wire: the JSON body and the headers of every POST.

Shared by the dispatcher and the producer's legacy synchronous path, so both
send byte-identical bodies for the same event and sign them the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from dispatcher import __version__
from dispatcher.signing import secret_key, signature_header

USER_AGENT = f"Larkspur-Webhooks/{__version__}"


def format_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds, the same text the store's claim returns."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event_id: str, event_type: str, workspace_id: str, sequence: int | None,
               occurred_at: str, payload_json: str) -> bytes:
    """The POST body.  ``payload_json`` is inserted verbatim (it is already JSON
    text from the database), so retries and replays send identical bytes."""
    head = json.dumps({"id": event_id, "type": event_type, "workspace_id": workspace_id,
                       "sequence": sequence, "occurred_at": occurred_at}, separators=(",", ":"))
    return f'{head[:-1]},"data":{payload_json}}}'.encode()


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
