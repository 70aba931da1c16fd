"""The producer's one statement (``send_event``), run inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.store import QUERIES, Connection


@dataclass(frozen=True, slots=True)
class LegacyTarget:
    """An endpoint the flag-off path POSTs to, with its signing secrets (its own once it has one, else its
    workspace's; the previous one too while a rotation is younger than secrets.rotation_grace)."""

    endpoint_id: int
    url: str
    secrets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``send_event`` wrote, and what the legacy path needs when the outbox is off."""

    # 'live', 'shadow', None (outbox off: nothing written) or 'duplicate' (outbox on and the
    # workspace already has an event with this id: nothing written)
    mode: str | None
    sequence: int | None      # None for a refused duplicate, or a flag-off send in a read-only transaction
    deliveries: int
    legacy_targets: tuple[LegacyTarget, ...]  # outbox off or shadow only
    legacy_payload: str | None
    # Outbox off: what the statement could not write, and the POST is made all the same.
    # 'duplicate_id' (shadow writes on, the id is taken: no shadow rows) or 'read_only'
    # (a read-only transaction: no sequence, no shadow rows); None: nothing skipped.
    skipped: str | None = None


def send_event(conn: Connection, params: Mapping[str, Any], grace: float) -> SendResult | None:
    """Run the producer's single statement; None when the workspace does not exist (nothing written).

    ``grace`` is secrets.rotation_grace, for the legacy targets' signing secrets.
    """
    with conn.cursor() as cur:
        cur.execute(QUERIES["send_event"], {**params, "grace": grace})
        found = cur.fetchone()
    if found is None:
        return None
    mode, sequence, deliveries, targets, payload, skipped = found
    legacy = tuple(LegacyTarget(int(t["id"]), t["url"], tuple(s for s in t["secrets"] if s))
                   for t in targets or ())
    return SendResult(mode, sequence, int(deliveries), legacy, payload, skipped)
