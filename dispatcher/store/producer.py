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
    secrets: tuple[str, ...]             # the workspace's signing secrets (send_event's 24 h grace)
    # (endpoint id, url, its signing secrets: its own once it has one, else the workspace's), flag off only
    legacy_targets: tuple[tuple[int, str, tuple[str, ...]], ...]
    legacy_payload: str | None


def send_event(conn: Connection, params: Mapping[str, Any], grace: float) -> SendResult | None:
    """Run the producer's single statement; None when the workspace does not exist (nothing written).

    Flag off with endpoints to POST to, a second statement reads each one's
    signing secrets (``grace``: secrets.rotation_grace), in the same transaction.
    """
    with conn.cursor() as cur:
        cur.execute(QUERIES["send_event"], params)
        found = cur.fetchone()
        names = [column.name for column in cur.description or ()]
    if found is None:
        return None
    row = dict(zip(names, found, strict=True))
    secrets = tuple(s for s in (row["secret"], row["previous_secret"] if row["in_grace"] else None) if s)
    ids = list(row["legacy_endpoint_ids"] or ())
    signing = _legacy_signing(conn, ids, grace) if ids else {}
    targets = tuple((endpoint_id, url, signing.get(endpoint_id, ()))
                    for endpoint_id, url in zip(ids, row["legacy_urls"] or (), strict=True))
    return SendResult(row["mode"], row["sequence"], int(row["deliveries"]), secrets, targets,
                      row["legacy_payload"])


def _legacy_signing(conn: Connection, endpoint_ids: list[int], grace: float) -> dict[int, tuple[str, ...]]:
    with conn.cursor() as cur:
        cur.execute(QUERIES["legacy_signing_secrets"], {"ids": endpoint_ids, "grace": grace})
        return {int(endpoint_id): tuple(s for s in secrets if s) for endpoint_id, secrets in cur.fetchall()}
