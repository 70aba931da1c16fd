"""The producer's one statement (``send_event``), run inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.store import QUERIES, Connection


@dataclass(frozen=True, slots=True)
class SendResult:
    """What ``send_event`` wrote, and what the legacy path needs when the outbox is off."""

    mode: str | None                     # 'live', 'shadow' or None (nothing written)
    sequence: int | None
    deliveries: int
    secrets: tuple[str, ...]             # the workspace's signing secrets
    # (endpoint id, url, its signing secrets: its own once it has one, else the workspace's), flag off only
    legacy_targets: tuple[tuple[int, str, tuple[str, ...]], ...]
    legacy_payload: str | None


def send_event(conn: Connection, params: Mapping[str, Any]) -> SendResult | None:
    """Run the producer's single statement; None when the workspace does not exist (nothing written)."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["send_event"], params)
        found = cur.fetchone()
        names = [column.name for column in cur.description or ()]
    if found is None:
        return None
    row = dict(zip(names, found, strict=True))
    secrets = tuple(s for s in (row["secret"], row["previous_secret"] if row["in_grace"] else None) if s)
    own = zip(row["legacy_secrets"] or (), row["legacy_previous_secrets"] or (), strict=True)
    signing = [tuple(s for s in pair if s) if pair[0] is not None else secrets for pair in own]
    targets = tuple(zip(row["legacy_endpoint_ids"] or (), row["legacy_urls"] or (), signing, strict=True))
    return SendResult(row["mode"], row["sequence"], int(row["deliveries"]), secrets, targets,
                      row["legacy_payload"])
