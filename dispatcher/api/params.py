"""Parsing untrusted request input: ids, query filters, cursors, JSON bodies.

Everything here turns bad input into a 4xx problem; nothing lets a malformed
value reach SQL (where it would surface as a 500).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from typing import Any

import falcon

from dispatcher.api.problems import Problem, bad_request, not_found
from dispatcher.contacts import InvalidContact, check_email
from dispatcher.durations import DurationError, parse_duration
from dispatcher.message import event_id_problem
from dispatcher.outbound.netguard import MAX_URL_LENGTH as MAX_URL_CHARS

MAX_ID = 2**63 - 1  # bigint
MAX_LIMIT = 100
DEFAULT_LIMIT = 50
# GET /v2/webhooks/endpoints/stats: how far back, and in how many buckets.
DEFAULT_STATS_WINDOW = 86400
MIN_STATS_WINDOW, MAX_STATS_WINDOW = 3600, 7 * 86400
DEFAULT_STATS_BUCKETS, MAX_STATS_BUCKETS = 24, 96
# Endpoints per stats page: 25 endpoints of 96 buckets answer about 300 KB (100 took 1.1 MB).
DEFAULT_STATS_LIMIT = MAX_STATS_LIMIT = 25
STATUSES = ("pending", "held", "delivered", "failed", "dead", "shadow")

_INT = re.compile(r"[0-9]{1,19}")
# RFC 3339 date-time: a full date, 'T', a time and a mandatory offset.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CURSOR_BODY = re.compile(r"d1:([0-9]{1,19})")


def path_id(text: str, what: str) -> int:
    """A path id; anything that is not a positive bigint names nothing, hence 404."""
    if _INT.fullmatch(text) and 0 < int(text) <= MAX_ID:
        return int(text)
    raise not_found(f"{what} {text[:40]!r} does not exist")


def event_id(text: str) -> str:
    """A path event id; one the event-id rule (``message.event_id_problem``) refuses names nothing, hence
    404, without a lookup."""
    if event_id_problem(text) is not None:
        raise not_found("event does not exist")
    return text


def only(req: falcon.Request, *allowed: str) -> None:
    """Refuse unknown query parameters: a typo like ?statuss=dead must not silently list everything."""
    unknown = sorted(set(req.params) - set(allowed))
    if unknown:
        names = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise bad_request(f"unknown query parameter(s) {names}; this route takes {', '.join(allowed) or 'none'}")


def single(req: falcon.Request, name: str) -> str | None:
    """A query parameter given at most once."""
    values = req.get_param_as_list(name)
    if values is None:
        return None
    if len(values) != 1:
        raise bad_request(f"query parameter {name!r} may be given only once")
    return values[0]


def query_int(req: falcon.Request, name: str) -> int | None:
    text = single(req, name)
    if text is None:
        return None
    if not _INT.fullmatch(text) or not 0 < int(text) <= MAX_ID:
        raise bad_request(f"{name} must be a positive integer")
    return int(text)


def _int_from_one(req: falcon.Request, name: str, highest: int, default: int) -> int:
    text = single(req, name)
    if text is None:
        return default
    if not _INT.fullmatch(text) or not 1 <= int(text) <= highest:
        raise bad_request(f"{name} must be an integer from 1 to {highest}")
    return int(text)


def limit(req: falcon.Request) -> int:
    return _int_from_one(req, "limit", MAX_LIMIT, DEFAULT_LIMIT)


def stats_limit(req: falcon.Request) -> int:
    return _int_from_one(req, "limit", MAX_STATS_LIMIT, DEFAULT_STATS_LIMIT)


def stats_buckets(req: falcon.Request) -> int:
    return _int_from_one(req, "buckets", MAX_STATS_BUCKETS, DEFAULT_STATS_BUCKETS)


def stats_window(req: falcon.Request) -> int:
    """The ``window`` parameter in whole seconds: a duration (``dispatcher.durations``) with a whole
    number, from 1h to 7d."""
    text = single(req, "window")
    if text is None:
        return DEFAULT_STATS_WINDOW
    try:
        seconds = parse_duration(text, whole=True)
    except DurationError:
        seconds = 0.0
    if not (MIN_STATS_WINDOW <= seconds <= MAX_STATS_WINDOW and seconds.is_integer()):
        raise bad_request("window must be a duration from 1h to 7d written as a whole number and a unit, "
                          "e.g. 90m, 24h or 7d")
    return int(seconds)


def status(req: falcon.Request) -> str | None:
    text = single(req, "status")
    if text is not None and text not in STATUSES:
        raise bad_request(f"status must be one of {', '.join(STATUSES)}")
    return text


def query_event_id(req: falcon.Request) -> str | None:
    """The ``event_id`` filter; one the event-id rule refuses is a 400 (its reason, never the id), not a lookup."""
    text = single(req, "event_id")
    if text is not None and (problem := event_id_problem(text)) is not None:
        raise bad_request(f"event_id: {problem}")
    return text


def timestamp(text: Any, name: str) -> datetime:
    """An RFC 3339 date-time with an offset; naive or partial times are refused."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        raise bad_request(f"{name} must be an RFC 3339 date-time with offset, e.g. 2026-09-01T12:00:00Z")
    try:
        parsed = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:  # e.g. month 13, or an offset beyond 24 h
        raise bad_request(f"{name} is not a valid date-time") from None
    # Normalise to UTC: Postgres refuses offsets beyond 15:59 that RFC 3339
    # allows. At the edges of Python's range (year 1 or 9999 with an offset)
    # clamp instead; no row is that old or that new, so the filter is exact.
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return (datetime.min if parsed.year == 1 else datetime.max).replace(tzinfo=UTC)


def query_timestamp(req: falcon.Request, name: str) -> datetime | None:
    text = single(req, name)
    return None if text is None else timestamp(text, name)


def encode_cursor(last_id: int) -> str:
    """Opaque to clients; today it is the last id seen, versioned for change."""
    return base64.urlsafe_b64encode(f"d1:{last_id}".encode()).decode("ascii").rstrip("=")


def cursor(req: falcon.Request) -> int | None:
    text = single(req, "cursor")
    if text is None:
        return None
    if _CURSOR.fullmatch(text):
        try:
            decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            decoded = ""
        match = _CURSOR_BODY.fullmatch(decoded)
        if match and 0 < int(match.group(1)) <= MAX_ID:
            return int(match.group(1))
    raise bad_request("cursor is not valid; use the next_cursor of a previous page")


def json_body(req: falcon.Request, max_bytes: int) -> Any:
    """The request body parsed as JSON, read up to ``max_bytes``."""
    if req.content_length is not None and req.content_length > max_bytes:
        raise Problem(413, "body-too-large", "Body too large", f"request bodies are limited to {max_bytes} bytes")
    try:
        raw = req.bounded_stream.read(max_bytes + 1)
    except OSError:  # the server's read timeout (api.read_timeout) or a dropped client
        raise Problem(408, "request-timeout", "Request Timeout", "the request body did not arrive in time") from None
    if len(raw) > max_bytes:
        raise Problem(413, "body-too-large", "Body too large", f"request bodies are limited to {max_bytes} bytes")
    if not raw.strip():
        raise bad_request("a JSON body is required")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise bad_request("the body is not valid JSON") from None


def discard_body(req: falcon.Request, max_bytes: int) -> None:
    """Bodyless routes still bound what a client may send them."""
    if req.content_length is not None and req.content_length > max_bytes:
        raise Problem(413, "body-too-large", "Body too large", f"request bodies are limited to {max_bytes} bytes")


MAX_DESCRIPTION_CHARS = 500
MAX_EVENT_TYPES = 100
MAX_EVENT_TYPE_CHARS = 200
_ENDPOINT_FIELDS = ("url", "event_types", "description", "active", "owner_contact", "trace_headers")


def _text(value: Any, name: str, max_chars: int) -> str:
    # NUL is refused here: Postgres text cannot hold it (it would surface as a 500).
    if not isinstance(value, str) or not value or len(value) > max_chars or "\x00" in value:
        raise bad_request(f"{name} must be a string of 1 to {max_chars} characters without NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape
        raise bad_request(f"{name} is not valid Unicode text") from None
    return value


def _owner_contact(value: Any) -> str | None:
    """An email address (breaker notices go there, docs/operations.md), or null to clear it."""
    if value is None:
        return None
    try:
        return check_email(value)
    except InvalidContact as exc:
        raise bad_request(f"owner_contact: {exc}") from None


_WORKSPACE_FIELDS = ("owner_contact", "notify_webhook_url")


def workspace_fields(body: Any) -> dict[str, str]:
    """The checked fields of a workspace PATCH: each given one as text, '' where null clears it."""
    if not isinstance(body, dict) or not body:
        raise bad_request('the body must be a JSON object with owner_contact and/or notify_webhook_url, '
                          'e.g. {"owner_contact": "ops@example.com"}')
    unknown = sorted(set(body) - set(_WORKSPACE_FIELDS))
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(repr(n[:40]) for n in unknown[:5])}; "
                          f"this route takes {', '.join(_WORKSPACE_FIELDS)}")
    fields: dict[str, str] = {}
    if "owner_contact" in body:
        fields["owner_contact"] = _owner_contact(body["owner_contact"]) or ""
    if "notify_webhook_url" in body:
        url = body["notify_webhook_url"]
        fields["notify_webhook_url"] = "" if url is None else _text(url, "notify_webhook_url", MAX_URL_CHARS)
    return fields


def endpoint_fields(body: Any, creating: bool) -> dict[str, Any]:
    """The checked fields of an endpoint create (``url`` required) or PATCH (at least one field)."""
    if not isinstance(body, dict):
        raise bad_request('the body must be a JSON object like {"url": "https://example.com/hook"}')
    unknown = sorted(set(body) - set(_ENDPOINT_FIELDS))
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(repr(n[:40]) for n in unknown[:5])}; "
                          f"this route takes {', '.join(_ENDPOINT_FIELDS)}")
    if creating and "url" not in body:
        raise bad_request("url is required")
    if not body:
        raise bad_request(f"give at least one of {', '.join(_ENDPOINT_FIELDS)}")
    fields: dict[str, Any] = {}
    if "url" in body:
        fields["url"] = _text(body["url"], "url", MAX_URL_CHARS)
    if "event_types" in body:
        types = body["event_types"]
        if not isinstance(types, list) or len(types) > MAX_EVENT_TYPES:
            raise bad_request(f"event_types must be a list of at most {MAX_EVENT_TYPES} strings")
        fields["event_types"] = [_text(item, "each event type", MAX_EVENT_TYPE_CHARS) for item in types]
    if "description" in body:
        described = body["description"]
        fields["description"] = None if described is None else _text(described, "description",
                                                                      MAX_DESCRIPTION_CHARS)
    if "owner_contact" in body:
        fields["owner_contact"] = _owner_contact(body["owner_contact"])
    for flag in ("active", "trace_headers"):
        if flag in body:
            if not isinstance(body[flag], bool):
                raise bad_request(f"{flag} must be true or false")
            fields[flag] = body[flag]
    return fields
