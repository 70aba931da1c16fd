"""The scrubber for anything a receiver sends back that we store or log.

``last_error`` and the stored 256-byte response excerpt come from customers'
servers, which echo headers and query strings; credentials in them must not
land in our database or logs.  Three layers:

* the row's own workspace secrets, masked exactly wherever they appear (in
  every form a receiver may hold them: ``whsec_<base64>``, the bare base64,
  or a plain legacy secret and its ``whsec_`` form), however they are labelled;
* ``Authorization``/``Bearer`` values and ``password=``/``token=``/``api_key=``
  style pairs, as headers, query strings or JSON (a quoted value is masked up
  to its closing quote, spaces included);
* anything that looks like a key whatever its label: ``whsec_``/``sk_live_``
  prefixes, JWTs, AWS access key ids, long hex or base64 runs, and long runs
  that mix upper case, lower case and digits.

Before any of that the text is normalised, so an encoded or wrapped credential
is recognised like a plain one: JSON escapes of printable characters (``\\/``,
``\\u002f``) and percent-escapes (``%2F``) are decoded, and a line break
(also as ``\\n`` or ``%0A``) after a long key-like run and before another is removed.  A known
secret is also matched with a line break anywhere inside it.  A UTF-16
response body (a byte-order mark, or NULs in every other byte) is decoded as
UTF-16 before it is scrubbed.  What is stored is the normalised text.

The excerpt is scrubbed *before* it is cut to 256 bytes, so a credential that
straddles the cut is recognised whole instead of leaving its first part in
clear.  Text is also made storable: a NUL byte (which Postgres text refuses)
or a lone surrogate becomes U+FFFD, so a receiver's binary answer can never
make the result write fail.
"""

from __future__ import annotations

import functools
import html
import re
import urllib.parse
from collections.abc import Iterable
from typing import TypeAlias, overload

from dispatcher.signing import SECRET_PREFIX, as_standard_secret

MASK = "[REDACTED]"
# Bytes read past the cut: more than the longest prefix any pattern below needs
# to recognise a credential, so one that starts before the cut is masked.
LOOKAHEAD = 256
# A known secret shorter than this is not masked (it would mask common text).
MIN_SECRET = 6

_KEYS = (r"(?:password|passwd|pwd|passphrase|secret|token|access_token|refresh_token|api[_-]?key|apikey|"
         r"client_secret|private_key|session|cookie|signature)")
_SEPARATOR = r"[\"']?\s*(?:[:=]|%3[aAdD])\s*"

# key=value and "key": "value" pairs whose key names a credential; a quoted
# value is masked to its closing quote, an unquoted one to the next delimiter.
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?"
_PAIR = re.compile(r"(?i)(" + _KEYS + _SEPARATOR + r")(" + _QUOTED + r"|[^\s\"'&,;}]+)")

_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Authorization: Bearer xxx / Basic xxx, as a header, a query pair or echoed in JSON
    re.compile(r"(?i)(authorization[\"']?\s*(?:[:=]|%3[aAdD])\s*[\"']?)(?:bearer|basic|token)?\s*[^\s\"',;]+"),
    re.compile(r"(?i)(bearer(?:\s+|%20))[A-Za-z0-9._~+/=%-]+"),
    # things that look like keys whatever their label
    re.compile(r"()\b(?:whsec|sk|pk|rk)_(?:live_|test_)?[A-Za-z0-9+/=_-]{8,}"),
    re.compile(r"()eyJ[A-Za-z0-9_-]{10,}(?:\.[A-Za-z0-9_-]*){0,2}"),             # JWT, even glued to a word
    re.compile(r"()\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),                              # AWS access key id
    re.compile(r"()\b[A-Fa-f0-9]{32,}\b"),
    re.compile(r"()\b[A-Za-z0-9+/_-]{40,}={0,2}"),
    # 24+ characters mixing upper case, lower case and digits: a random token, not a word
    re.compile(r"()\b(?=[A-Za-z_-]*[0-9])(?=[A-Z0-9_-]*[a-z])(?=[a-z0-9_-]*[A-Z])[A-Za-z0-9_-]{24,}"),
)


# JSON escapes and percent-escapes of printable ASCII: decoded before matching,
# so "whsec_ab\/cd" and "whsec_ab%2Fcd" read as "whsec_ab/cd".
_ESCAPE = re.compile(r"\\u00([2-7][0-9a-fA-F])|\\(/)|%([2-7][0-9a-fA-F])")
# A line break as a receiver may write it: raw, JSON-escaped or percent-encoded, with indentation.
_BREAK = r"(?:\r?\n[ \t]*|\\r\\n|\\n|%0[dD]%0[aA]|%0[aA])"
_KEY_CHAR = r"[A-Za-z0-9+/=_-]"
# A break after a long run of key characters and before another: a wrapped key
# (base64 at 64 or 76 columns).  The first run must be long, so that ordinary
# lines ("Bearer abc" / "password=...") are never glued into one credential.
_WRAPPED = re.compile(r"(?<=" + _KEY_CHAR + "{32})" + _BREAK + "(?=" + _KEY_CHAR + "{8})")


def _unescape(match: re.Match[str]) -> str:
    if match.group(2):
        return "/"
    value = chr(int(match.group(1) or match.group(3), 16))
    return value if value.isprintable() else match.group(0)


def normalise(text: str) -> str:
    """``text`` with encoded printable characters decoded and wrapped key-like runs joined."""
    return _WRAPPED.sub("", _ESCAPE.sub(_unescape, text))


def _mask_pair(match: re.Match[str]) -> str:
    value = match.group(2)
    quote = value[0]
    if quote in "\"'":
        closed = len(value) > 1 and value.endswith(quote)
        return match.group(1) + quote + MASK + (quote if closed else "")
    return match.group(1) + MASK


def secret_forms(secrets: Iterable[str | None]) -> tuple[str, ...]:
    """Every spelling of these workspace secrets a receiver might echo, longest first."""
    return _secret_forms(tuple(secrets))


@functools.lru_cache(maxsize=1024)
def _secret_forms(secrets: tuple[str | None, ...]) -> tuple[str, ...]:
    forms: set[str] = set()
    for secret in secrets:
        if not secret:
            continue
        standard = as_standard_secret(secret)
        forms.update((secret, standard, standard[len(SECRET_PREFIX):]))
    return tuple(sorted((f for f in forms if len(f) >= MIN_SECRET), key=len, reverse=True))


@functools.lru_cache(maxsize=1024)
def _wrapped_form(form: str) -> re.Pattern[str]:
    """``form`` with an optional line break between any two of its characters."""
    return re.compile((_BREAK + "?").join(re.escape(char) for char in form))


@overload
def storable(text: str) -> str: ...
@overload
def storable(text: None) -> None: ...
def storable(text: str | None) -> str | None:
    """Text Postgres can store: no NUL character, no lone surrogate.  Used on
    everything of a receiver's that is stored (errors, excerpts), here and by
    the engine's result write, where one bad string would fail the whole batch."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text


def scrub(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Mask credentials in ``text`` (and the given workspace secrets); what remains
    is safe to store and log."""
    text = normalise(storable(text))
    for form in secret_forms(secrets):
        text = _wrapped_form(form).sub(MASK, text.replace(form, MASK))
    text = _PAIR.sub(_mask_pair, text)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


# RFC-014 security section: what is stored and shown of a response carries at most 256 bytes of its body.
EXCERPT_BYTES = 256


def cut_bytes(text: str, limit: int = EXCERPT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, dropping a split multi-byte tail."""
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def excerpt(body: bytes, limit: int = EXCERPT_BYTES, secrets: Iterable[str | None] = ()) -> str:
    """The first ``limit`` bytes of a response body, decoded leniently and scrubbed.

    Scrubbed before the cut (see the module docstring); the cut is on bytes and
    drops a split multi-byte character.
    """
    if not body:
        return ""
    return cut_bytes(scrub(_decode(body[: 2 * (limit + LOOKAHEAD)], limit + LOOKAHEAD), secrets), limit)


def _decode(body: bytes, chars: int) -> str:
    """At most ``chars`` characters of ``body``: UTF-16 when it says so (a byte-order mark)
    or looks so (NUL in most odd or most even bytes), else lenient UTF-8."""
    codec = "utf-8"
    if body[:2] in (b"\xff\xfe", b"\xfe\xff"):
        codec = "utf-16"
    elif len(body) >= 8:
        even, odd = body[0::2], body[1::2]
        if odd.count(0) * 4 >= len(odd) * 3:
            codec = "utf-16-le"
        elif even.count(0) * 4 >= len(even) * 3:
            codec = "utf-16-be"
    if codec == "utf-8":
        return body[:chars].decode("utf-8", errors="replace")
    return body[: 2 * chars + 2].decode(codec, errors="replace")[:chars]


MASKED_PART = "***"
# A parsed JSON document (an event payload as the database's jsonb gives it back).
JsonValue: TypeAlias = "dict[str, JsonValue] | list[JsonValue] | str | int | float | bool | None"


def mask_url(url: str) -> str:
    """An endpoint URL as a read-only token (and the console) sees it: scheme,
    host and port kept; userinfo dropped; every path segment, the query and
    the fragment masked.  Endpoint URLs often carry credentials (Slack-style
    paths, ``user:pass@``), so only a token that may change the URL sees it whole.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return MASKED_PART
    if not parts.scheme or not host:
        return MASKED_PART
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    segments = [segment for segment in parts.path.split("/") if segment]
    path = "/" + "/".join(MASKED_PART for _ in segments) if segments else parts.path
    query = "?" + MASKED_PART if parts.query else ""
    fragment = "#" + MASKED_PART if parts.fragment else ""
    return f"{parts.scheme}://{netloc}{path}{query}{fragment}"


def mask_url_parts(text: str, url: str | None) -> str:
    """``text`` with the parts of ``url`` that :func:`mask_url` masks (its path and query, their
    segments and values, the userinfo) replaced by ``***``, as a read-only token sees a receiver's
    answer: a receiver that echoes the request (Express's 404: ``Cannot POST /path?query``) would
    otherwise show it the masked URL in clear.

    Each part is matched as sent, percent-decoded, percent-encoded and HTML-escaped; a part shorter
    than ``MIN_SECRET`` characters is left (it would mask common text).  A part cut off at the end
    of ``text`` (an excerpt is cut at 256 bytes) is masked from where it starts.  ``url`` None (the
    endpoint was deleted): nothing is known to mask, so the caller decides what to withhold.
    """
    if not text or not url:
        return text
    forms = _url_part_forms(url)
    text = _mask_cut_tail(text, forms)
    for form in forms:
        text = text.replace(form, MASKED_PART)
    return text


def _mask_cut_tail(text: str, forms: tuple[str, ...]) -> str:
    """``text`` with a trailing start of one of ``forms`` (the longest one found) masked."""
    for form in forms:
        for cut in range(len(form) - 1, MIN_SECRET - 1, -1):
            if text.endswith(form[:cut]):
                return text[: len(text) - cut] + MASKED_PART
    return text


@functools.lru_cache(maxsize=1024)
def _url_part_forms(url: str) -> tuple[str, ...]:
    """Every spelling of ``url``'s masked parts a receiver may echo, longest first."""
    try:
        parts = urllib.parse.urlsplit(url)
        userinfo = (parts.username, parts.password)
    except ValueError:
        return ()
    path, query = parts.path, parts.query
    pieces: set[str] = {path, query, f"{path}?{query}" if query else path, *(u for u in userinfo if u)}
    pieces.update(segment for segment in path.split("/") if segment)
    for pair in query.split("&"):
        pieces.update((pair, pair.partition("=")[2]))
    forms: set[str] = set()
    for piece in pieces:
        for plain in {piece, urllib.parse.unquote_plus(piece), normalise(piece)}:
            forms.update((plain, html.escape(plain), urllib.parse.quote(plain, safe=""),
                          urllib.parse.quote(plain, safe="/")))
    return tuple(sorted((f for f in forms if len(f) >= MIN_SECRET), key=len, reverse=True))


def mask_json(value: JsonValue) -> JsonValue:
    """An event payload as a read-only token (and the console) sees it: objects keep
    their keys and arrays their length, every other value but null becomes ``***``.
    Payloads carry customers' data; only a token that may write (and so replay it)
    sees the values, as only it sees whole endpoint URLs (:func:`mask_url`)."""
    if isinstance(value, dict):
        return {key: mask_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_json(item) for item in value]
    return None if value is None else MASKED_PART
