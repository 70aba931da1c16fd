"""Bulk replay by filter: ``POST /v2/webhooks/replays`` (a dry run, or a job) and
``GET /v2/webhooks/replays/{job_id}`` (its progress).  Issue 24, section 3.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import falcon

from dispatcher.api import auth, params
from dispatcher.api.problems import bad_request, unprocessable
from dispatcher.api.resources.base import Resource, connection, principal, read
from dispatcher.rules.bulk_replay import DEFAULT_STATUSES, DEFAULT_WINDOW, ReplayFilter, filter_problem
from dispatcher.store import Connection
from dispatcher.store import replays as replay_store
from dispatcher.views import replay_job_json, replay_preview_json

FIELDS = {"since", "until", "types", "endpoints", "statuses", "dry_run", "request_id"}
# An idempotency key: what clients send (UUIDs, hashes, ids), printable and short.
_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def _strings(body: dict[str, Any], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"{name} must be an array of strings")
    return tuple(value)


def _ids(body: dict[str, Any]) -> tuple[int, ...]:
    value = body.get("endpoints")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise bad_request("endpoints must be an array of endpoint ids (integers)")
    return tuple(value)


def parse_filter(body: Any, max_age: float) -> tuple[ReplayFilter, bool, str | None]:
    """The filter, the dry-run flag and the body's request id; 400 for a malformed body,
    422 for a filter the rule refuses (``rules.bulk_replay.filter_problem``)."""
    if not isinstance(body, dict):
        raise bad_request('the body must be a JSON object like {"since": "2026-09-01T02:00:00Z", "dry_run": true}')
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s): {', '.join(unknown)[:200]}; allowed: {', '.join(sorted(FIELDS))}")
    now = datetime.now(UTC)
    since = params.timestamp(body["since"], "since") if body.get("since") is not None else now - DEFAULT_WINDOW
    until = params.timestamp(body["until"], "until") if body.get("until") is not None else None
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise bad_request("dry_run must be true or false")
    request_id = body.get("request_id")
    if request_id is not None and not (isinstance(request_id, str) and _KEY.fullmatch(request_id)):
        raise bad_request("request_id must be 1 to 200 printable ASCII characters")
    rf = ReplayFilter(since=since, until=until, types=_strings(body, "types", ()), endpoints=_ids(body),
                      statuses=_strings(body, "statuses", DEFAULT_STATUSES), since_defaulted=body.get("since") is None)
    problem = filter_problem(rf, now + timedelta(seconds=1), max_age)
    if problem is not None:
        raise unprocessable(problem)
    return rf, dry_run, request_id


def _request_key(req: falcon.Request, request_id: str | None) -> str:
    """The Idempotency-Key header, else the body's request_id, else a fresh key (then a
    repeated request makes a second job, which skips every pair the first one queued)."""
    header = req.get_header("Idempotency-Key")
    if header is not None and not _KEY.fullmatch(header):
        raise bad_request("the Idempotency-Key header must be 1 to 200 printable ASCII characters")
    if header is not None and request_id is not None and header != request_id:
        raise bad_request("the Idempotency-Key header and request_id differ; send one of them")
    return header or request_id or f"auto:{uuid.uuid4()}"


class Replays(Resource):
    """POST /v2/webhooks/replays: a dry run (count, cost, sample) or a bulk replay job."""

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        config = self.ctx.config
        who = principal(self.ctx, req, auth.WRITE)
        params.only(req)
        # Read and checked before a connection is taken, as for recover.
        rf, dry_run, request_id = parse_filter(params.json_body(req, config.max_body_bytes), config.recover_max_age)
        key = _request_key(req, request_id)
        with connection(self.ctx, req, who) as conn:
            if dry_run:
                found = replay_store.preview(conn, who.workspace_id, rf, self.ctx.replay_budget,
                                             self.ctx.replay_policy.sample)
                resp.media = replay_preview_json(found, rf)
                return
            job, created = replay_store.create_job(conn, who.workspace_id, rf, key, self.ctx.replay_budget,
                                                   who.token_id)
        resp.status = falcon.HTTP_202 if created else falcon.HTTP_200
        resp.location = f"/v2/webhooks/replays/{job['id']}"
        resp.media = replay_job_json(job)


class ReplayJob(Resource):
    """GET /v2/webhooks/replays/{job_id}: a job's filter and progress."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        def query(conn: Connection, who: auth.Principal) -> dict[str, Any]:
            ident = params.path_id(job_id, "replay job")
            params.only(req)
            return replay_store.get_job(conn, who.workspace_id, ident)

        resp.media = replay_job_json(read(self.ctx, req, auth.READ, query))
