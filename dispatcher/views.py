"""The public JSON shapes of deliveries, endpoints, tokens, the workspace
settings, audit entries, endpoint stats and bulk replays.

The API answers with them and the CLI prints them (``endpoint show``,
``endpoint list --json``), so an operator and a client see one shape.  Each
takes store rows (``store.deliveries``, ``store.endpoints``, ...) and returns
plain JSON values: timestamps as ISO 8601 strings, URLs masked unless the
reader may write.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from dispatcher.redact import MASKED_PART, mask_json, mask_url, mask_url_parts
from dispatcher.rules.breaker import BreakerPolicy, EndpointBreaker
from dispatcher.rules.bulk_replay import ReplayFilter, percent
from dispatcher.store import deliveries as delivery_store
from dispatcher.store.endpoints import StatsWindow
from dispatcher.store.replays import Preview


def timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def delivery_json(row: dict[str, Any], policy: BreakerPolicy, whole_url: bool) -> dict[str, Any]:
    """The public shape of a delivery; claim internals (locks, tokens) are never read.

    ``breaker_hold``: for a pending row its endpoint's breaker keeps waiting
    (``BreakerPolicy.holds``), the breaker's shown state and until when; else null.
    ``whole_url`` False (a read-only token): the receiver's texts (errors, response excerpts) are
    shown with the endpoint URL's masked parts masked in them too (:func:`receiver_text`).
    """
    out = {key: row[key] for key in delivery_store.DELIVERY_COLUMNS}
    for key in ("created_at", "next_attempt_at", "delivered_at", "finished_at"):
        out[key] = timestamp(out[key])
    breaker = EndpointBreaker(row["breaker_state"], row["breaker_failures"], row["breaker_open_until_epoch"])
    held = row["status"] == "pending" and policy.holds(breaker, row["next_attempt_epoch"], row["db_now"])
    out["breaker_hold"] = ({"state": policy.shown_state(breaker, row["db_now"]),
                            "until": timestamp(row["breaker_open_until"])} if held else None)
    url = row.get("endpoint_url")
    if not whole_url:
        out["last_error"] = receiver_text(out["last_error"], url)
    if "attempts" in row:
        out["attempts"] = [
            {**a, "started_at": timestamp(a["started_at"])} if whole_url else
            {**a, "started_at": timestamp(a["started_at"]), "error": receiver_text(a["error"], url),
             "response_excerpt": receiver_text(a["response_excerpt"], url)}
            for a in row["attempts"]
        ]
    if "attempts_omitted" in row:
        out["attempts_omitted"] = row["attempts_omitted"]
    return out


def receiver_text(text: str | None, url: str | None) -> str | None:
    """A stored error or excerpt as a read-only token sees it: a receiver that echoes the request (Express's
    404) must not show it the URL it sees masked.  The endpoint deleted (``url`` None): what to mask is not
    known any more, so the whole text is withheld."""
    if not text:
        return text
    return MASKED_PART if url is None else mask_url_parts(text, url)


def delivery_detail_json(row: dict[str, Any], policy: BreakerPolicy, may_write: bool) -> dict[str, Any]:
    """One delivery with its attempts and the payload that was sent (the POST body's ``data``; null once
    the event aged out).  ``may_write``: the token may write, so it sees the payload and the receiver's
    texts whole; else the payload's values are masked, and the texts as :func:`delivery_json` says."""
    payload = row["payload"]
    masked = not may_write and payload is not None
    return {**delivery_json(row, policy, may_write), "payload": mask_json(payload) if masked else payload,
            "payload_redacted": masked}


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
        "owner_contact_confirmed": row["owner_contact_confirmed"],
        "event_types": list(row["event_types"] or []), "created_at": timestamp(row["created_at"]),
        "max_per_second": row["max_per_second"], "trace_headers": row["trace_headers"],
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
        "last_error": row["last_error"] if whole_url else receiver_text(row["last_error"], row["url"]),
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


def workspace_json(workspace_id: str, owner: str | None, notify_url: str | None, whole_url: bool,
                   confirmed: bool) -> dict[str, Any]:
    """The workspace (its id names it) and who hears of its breakers; the notify URL masked for
    read-only tokens, like endpoint URLs.  ``confirmed``: the owner answered the mailed link, so
    notices go to it."""
    shown = notify_url if whole_url or notify_url is None else mask_url(notify_url)
    return {"workspace_id": workspace_id, "owner_contact": owner, "owner_contact_confirmed": confirmed,
            "notify_webhook_url": shown,
            "url_masked": not whole_url}


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


def replay_preview_json(found: Preview, rf: ReplayFilter) -> dict[str, Any]:
    """A bulk replay's dry run: what the filter matches now; nothing was queued or spent."""
    return {"dry_run": True, "filter": rf.as_json(), "count": found.total, "count_capped": found.capped,
            "replay_units": found.units,
            "sample": [{"delivery_id": r["id"], "event_id": r["event_id"], "event_type": r["event_type"],
                        "endpoint_id": r["endpoint_id"], "status": r["status"],
                        "created_at": timestamp(r["created_at"])} for r in found.sample]}


def replay_job_json(row: dict[str, Any]) -> dict[str, Any]:
    """A bulk replay job: its filter and progress (``percent`` reaches 100 when it is done)."""
    done = row["state"] == "done"
    return {"id": row["id"], "state": row["state"],
            "filter": {"since": timestamp(row["since"]), "until": timestamp(row["until"]),
                       "types": list(row["event_types"]), "endpoints": list(row["endpoint_ids"]),
                       "statuses": list(row["statuses"])},
            "total": row["total"], "queued": row["queued"], "percent": percent(row["total"], row["queued"], done),
            "replay_units": row["replay_units"], "created_at": timestamp(row["created_at"]),
            "updated_at": timestamp(row["updated_at"]), "finished_at": timestamp(row["finished_at"])}
