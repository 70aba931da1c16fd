"""The public JSON shapes of deliveries, endpoints, tokens, the workspace
settings, audit entries and endpoint stats.

The API answers with them and the CLI prints them (``endpoint show``,
``endpoint list --json``), so an operator and a client see one shape.  Each
takes store rows (``store.deliveries``, ``store.endpoints``, ...) and returns
plain JSON values: timestamps as ISO 8601 strings, URLs masked unless the
reader may write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from dispatcher.redact import mask_url
from dispatcher.rules.breaker import BreakerPolicy, EndpointBreaker
from dispatcher.store import deliveries as delivery_store
from dispatcher.store.endpoints import StatsWindow


def timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def delivery_json(row: dict[str, Any]) -> dict[str, Any]:
    """The public shape of a delivery; claim internals (locks, tokens) are never read."""
    out = {key: row[key] for key in delivery_store.DELIVERY_COLUMNS}
    for key in ("created_at", "next_attempt_at", "delivered_at", "finished_at"):
        out[key] = timestamp(out[key])
    if "attempts" in row:
        out["attempts"] = [
            {**a, "started_at": timestamp(a["started_at"])} for a in row["attempts"]
        ]
    return out


def breaker_state(row: dict[str, Any], policy: BreakerPolicy) -> str:
    breaker = EndpointBreaker(row["state"], row["consecutive_failures"], row["open_until_epoch"])
    return policy.shown_state(breaker, row["db_now"])


def endpoint_json(row: dict[str, Any], policy: BreakerPolicy, whole_url: bool) -> dict[str, Any]:
    """The public shape of an endpoint.  ``whole_url``: the token may write, so it sees the URL unmasked."""
    age = row["oldest_pending_age_seconds"]
    attempts, delivered = int(row["attempts_24h"]), int(row["delivered_24h"])
    return {
        "id": row["id"], "url": row["url"] if whole_url else mask_url(row["url"]), "url_masked": not whole_url,
        "active": row["active"], "description": row["description"], "owner_contact": row["owner_contact"],
        "event_types": list(row["event_types"] or []), "created_at": timestamp(row["created_at"]),
        "max_per_second": row["max_per_second"],
        "signing": {"secret": "endpoint" if row["own_secret"] else "workspace",
                    "rotated_at": timestamp(row["secret_rotated_at"]),
                    "previous_valid_until": timestamp(row["previous_valid_until"])},
        "breaker": {"state": breaker_state(row, policy), "consecutive_failures": row["consecutive_failures"],
                    "open_until": timestamp(row["open_until"]), "opened_at": timestamp(row["opened_at"])},
        "pending": {"count": row["pending_count"], "oldest_created_at": timestamp(row["oldest_pending_at"]),
                    "oldest_age_seconds": None if age is None else max(0.0, round(float(age), 3))},
        "success_rate_24h": {"attempts": attempts, "delivered": delivered,
                             "rate": round(delivered / attempts, 4) if attempts else None},
        "last_success_at": timestamp(row["last_success_at"]),
        "last_failure_at": timestamp(row["last_failure_at"]),
        "last_error": row["last_error"],
        **lifecycle_json(row),
    }


def lifecycle_json(row: dict[str, Any]) -> dict[str, Any]:
    """The pause (who and since when), the rows it holds, and the lifecycle's stage and next step
    (docs/operations.md, "Pausing an endpoint" and "Endpoint lifecycle")."""
    return {
        "paused": {"paused": row["paused_at"] is not None, "paused_at": timestamp(row["paused_at"]),
                   "cause": row["pause_cause"]},
        "held": {"count": row["held_count"], "oldest_created_at": timestamp(row["oldest_held_at"])},
        "lifecycle": {"stage": "paused" if row["paused_at"] is not None else row["lifecycle_stage"],
                      "next_step": row["next_step"], "next_step_at": timestamp(row["next_step_at"])},
    }


def token_json(row: dict[str, Any]) -> dict[str, Any]:
    """A token as its workspace sees it: never the token or its hash."""
    return {"id": row["id"], "prefix": row["prefix"], "scopes": list(row["scopes"]),
            "created_at": timestamp(row["created_at"]), "expires_at": timestamp(row["expires_at"]),
            "last_used_at": timestamp(row["last_used_at"]), "revoked_at": timestamp(row["revoked_at"])}


def workspace_json(owner: str | None, notify_url: str | None, whole_url: bool) -> dict[str, Any]:
    """Who hears of this workspace's breakers; the notify URL masked for read-only tokens, like endpoint URLs."""
    shown = notify_url if whole_url or notify_url is None else mask_url(notify_url)
    return {"owner_contact": owner, "notify_webhook_url": shown, "url_masked": not whole_url}


def audit_json(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "at": timestamp(row["at"]), "token_id": row["token_id"], "action": row["action"],
            "endpoint_id": row["endpoint_id"], "delivery_ids": list(row["delivery_ids"]), "detail": row["detail"]}


def _rate(succeeded: int, attempts: int) -> float | None:
    return None if attempts == 0 else round(succeeded / attempts, 4)


def _stats_numbers(row: dict[str, Any] | None) -> dict[str, Any]:
    attempts, succeeded = (int(row["attempts"]), int(row["succeeded"])) if row else (0, 0)
    return {"attempts": attempts, "succeeded": succeeded, "success_rate": _rate(succeeded, attempts),
            "p95_ms": None if row is None or row["p95_ms"] is None else int(row["p95_ms"])}


def endpoint_stats_json(stats: StatsWindow, buckets: int) -> dict[str, Any]:
    """Every endpoint of ``stats``, in its order, with its totals and exactly ``buckets`` buckets, oldest
    first (empty ones as zeros)."""
    totals: dict[int, dict[str, Any]] = {}
    by_bucket: dict[int, dict[int, dict[str, Any]]] = {}
    for row in stats.rows:
        if row["bucket"] is None:
            totals[row["endpoint_id"]] = row
        else:
            # A float quotient can land an attempt just before `until` in bucket n.
            by_bucket.setdefault(row["endpoint_id"], {})[min(row["bucket"], buckets - 1)] = row
    step = timedelta(seconds=stats.bucket_seconds)
    data = [{"endpoint_id": endpoint_id, **_stats_numbers(total),
             "buckets": [{"start": (stats.since + step * n).isoformat(),
                          **_stats_numbers(by_bucket.get(endpoint_id, {}).get(n))} for n in range(buckets)]}
            for endpoint_id, total in totals.items()]
    return {"since": stats.since.isoformat(), "until": stats.until.isoformat(),
            "window_seconds": round((stats.until - stats.since).total_seconds()),
            "bucket_seconds": stats.bucket_seconds, "data": data}
