"""Redaction: what receivers send back is scrubbed before it is stored, logged or served.

Unit tests of ``dispatcher/redact.py``; the engine end to end is in
``tests/e2e/faults/test_redaction_engine.py``.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import pytest

from dispatcher.redact import MASK, excerpt, mask_json, scrub
from dispatcher.signing import as_standard_secret
from dispatcher_devtools.kit import SECRET

pytestmark = pytest.mark.timeout(60)

BARE = SECRET.removeprefix("whsec_")  # the key part alone, as a receiver's config file may hold it

# --------------------------------------------------------------------------- the scrubber

# (text, what must be gone, what must stay)
MASKED = [
    ("Authorization: Bearer abc.DEF-123_xyz", "abc.DEF-123_xyz", "Authorization: "),
    ("authorization:Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA", "authorization:"),
    ('{"Authorization": "Bearer tok_98765"}', "tok_98765", '{"Authorization": "'),
    ("Proxy-Authorization: Basic Zm9vOmJhcg==", "Zm9vOmJhcg", "Proxy-"),
    ("got bearer s3cr3tvalue in the request", "s3cr3tvalue", "in the request"),
    ("GET /cb?bearer%20abc123 HTTP/1.1", "abc123", "GET /cb?"),
    ("password=hunter2&user=bob", "hunter2", "&user=bob"),
    ("passwd=hunter2 pwd=hunter3", "hunter", "passwd="),
    ('{"password": "correct horse battery staple", "user": "bob"}', "horse", '"user": "bob"'),
    ("{'password': 'p w', 'ok': 1}", "p w", "'ok': 1"),
    ('{"password": "with \\"escaped\\" quotes", "n": 2}', "escaped", '"n": 2'),
    ("?token=abc123&api_key=xyz789&page=2", "xyz789", "&page=2"),
    ("/hook?access_token=AT-1&refresh_token=RT-2", "RT-2", "/hook?"),
    ("redirect_uri=x&access_token%3DAT-3", "AT-3", "redirect_uri=x"),
    ("X-Api-Key: k-123-456", "k-123-456", "X-Api-Key: "),
    ("apiKey=zzz999 region=eu", "zzz999", "region=eu"),
    ("client_secret: cs_555", "cs_555", "client_secret: "),
    ("Set-Cookie: session=abcdef; Path=/", "abcdef", "Path=/"),
    ('"secret": "shh"', "shh", '"secret": "'),
    ("webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=", "K5oZfzN95Z9UVu1", "webhook-"),
    # looks like a key, whatever the label
    (f"configured with {SECRET}", BARE, "configured with "),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc said no", "4eC39HqLyjWDarjtT1zdp7dc", "said no"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U end",
     "eyJzdWIiOiIxMjM0In0", " end"),
    ("aws AKIAIOSFODNN7EXAMPLE denied", "AKIAIOSFODNN7EXAMPLE", " denied"),
    ("hex 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 seen", "9f86d081884c7d65", " seen"),
    ("b64 dGhpcyBpcyBhIHZlcnkgbG9uZyBzZWNyZXQgdmFsdWUgaW5kZWVk.", "dGhpcyBpcyBhIHZlcnkg", "b64 "),
    ("random MfKQ9r8GKYqrTwjUPD8ILPZIo2La token", "MfKQ9r8GKYqrTwjUPD8ILPZIo2La", "random "),
]


@pytest.mark.parametrize(("text", "gone", "kept"), MASKED)
def test_scrub_masks_credentials(text: str, gone: str, kept: str) -> None:
    out = scrub(text)
    assert gone not in out, out
    assert kept in out and MASK in out, out


@pytest.mark.parametrize("text", [
    "Internal Server Error",
    "HTTP 503: upstream timed out after 30s, try again later",
    '{"error": "validation failed", "field": "user_name", "code": 422}',
    "request id 7f3e9a2c-1b2d-4c5e-8f90-123456789abc failed",
    "tokens: 5 remaining; sessions closed",
])
def test_scrub_leaves_ordinary_text_alone(text: str) -> None:
    assert scrub(text) == text


def test_the_rows_own_secrets_are_masked_in_every_form() -> None:
    legacy = "plain-legacy-secret"  # today's workspaces: not whsec_, no key-like shape
    standard = as_standard_secret(legacy)
    text = (f"a={SECRET} b={BARE} c: {legacy} d {standard} e {standard.removeprefix('whsec_')} "
            f"f {BARE.lower()}")
    out = scrub(text, [SECRET, legacy, None])
    for form in (SECRET, BARE, legacy, standard, standard.removeprefix("whsec_")):
        assert form not in out, (form, out)
    assert out.count(MASK) >= 5
    assert scrub("short ab", ["ab"]) == "short ab", "a secret too short to mask is not sprayed over the text"


CUT_SECRETS = [
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",   # hex
    SECRET,                                                                # whsec_
    "dGhpcyBpcyBhIHZlcnkgbG9uZyBzZWNyZXQgdmFsdWUgaW5kZWVkIHllcw==",      # base64
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",  # JWT
]


@pytest.mark.parametrize("secret", CUT_SECRETS, ids=["hex", "whsec", "base64", "jwt"])
def test_a_secret_straddling_the_256_byte_cut_leaves_no_part_in_clear(secret: str) -> None:
    for start in range(200, 257):
        body = (("ab " * 100)[:start] + secret + " tail").encode()
        out = excerpt(body)
        assert len(out.encode()) <= 256
        # no 6-character piece of the secret survives, wherever the cut falls
        pieces = {secret[i:i + 6] for i in range(len(secret) - 5)}
        leaked = [p for p in pieces if p in out and p not in "ab ab "]
        assert not leaked, (start, out[-60:])


ODD_SECRET = "legacy/secret+with=odd/chars-1"  # a plain legacy secret with the characters encodings change
ODD_RUN = "dGhpcyBpcyBhIHZlcnkg/bG9uZyBzZWNyZXQgdmFsdWUgaW5k+ZWVkIHllcw/YWdhaW4="  # an unknown key (base64)


def _pieces_left(secret: str, out: str) -> list[str]:
    pieces = {secret[i:i + 6] for i in range(len(secret) - 5)}
    return sorted(p for p in pieces if p in out)


@pytest.mark.parametrize(("form", "encode"), [
    ("json-escaped", lambda s: s.replace("/", "\\/")),
    ("percent-encoded", lambda s: urllib.parse.quote(s, safe="")),
    ("percent-encoded-lower", lambda s: re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(),
                                               urllib.parse.quote(s, safe=""))),
    # A wrapped key: the known secret anywhere, an unknown key after a long first line.
    ("split-by-a-line-break", lambda s: s[:len(s) * 2 // 3] + "\n" + s[len(s) * 2 // 3:]),
    ("split-by-crlf-and-indent", lambda s: s[:len(s) * 2 // 3] + "\r\n    " + s[len(s) * 2 // 3:]),
    ("split-by-an-escaped-line-break", lambda s: s[:len(s) * 2 // 3] + "\\n" + s[len(s) * 2 // 3:]),
    ("split-early", lambda s: s[:3] + "\n" + s[3:]),
])
def test_encoded_and_split_secrets_are_masked(form: str, encode: Any) -> None:
    text = f'{{"echo": "{encode(ODD_SECRET)}", "key": "{encode(ODD_RUN)}", "ok": "ordinary words"}}'
    for out in (scrub(text, [ODD_SECRET]), excerpt(text.encode(), secrets=[ODD_SECRET])):
        assert not _pieces_left(ODD_SECRET, out), (form, out)
        assert not _pieces_left(ODD_RUN.replace("/", "").replace("+", ""), out.replace("\\", "")), (form, out)
        assert "ordinary words" in out


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_bodies_are_scrubbed(codec: str) -> None:
    body = f'{{"echo": "{ODD_SECRET}", "key": "{ODD_RUN}", "ok": "ordinary words"}}'.encode(codec)
    out = excerpt(body, secrets=[ODD_SECRET])
    readable = out.replace("\ufffd", "")  # undecoded UTF-16 would read as the text with U+FFFD between
    assert not _pieces_left(ODD_SECRET, readable) and not _pieces_left(ODD_RUN, readable), out
    assert "ordinary words" in out and "\x00" not in out


def test_a_pair_straddling_the_cut_is_masked() -> None:
    for start in range(230, 256):
        body = (("ab " * 100)[:start] + 'password="correct horse battery staple"').encode()
        out = excerpt(body)
        assert not any(word in out for word in ("orse", "battery", "staple")), out[-40:]


def test_excerpt_is_storable_and_bounded() -> None:
    assert excerpt(b"") == ""
    nul = excerpt(b"\x00" * 100_000)
    assert "\x00" not in nul and len(nul.encode()) <= 256
    broken = excerpt(b"ok \xff\xfe " + "é".encode() * 200)
    assert "\x00" not in broken and len(broken.encode()) <= 256
    broken.encode("utf-8")  # no lone surrogate, no split character
    assert scrub("a\x00b\ud800c") == "a\ufffdb?c"


def test_a_payload_keeps_its_shape_and_loses_its_values() -> None:
    """What a read-only token sees of a payload (docs/api.md, Payloads)."""
    deep: Any = "card 4242"
    for _ in range(64):
        deep = {"k": [deep]}
    masked = mask_json({"a": 1, "b": [True, None, 2.5, {"c": "x"}], "d": {}, "e": [], "deep": deep})
    assert masked["a"] == "***" and masked["b"] == ["***", None, "***", {"c": "***"}]
    assert masked["d"] == {} and masked["e"] == []
    assert "4242" not in repr(masked) and repr(masked).count("'k'") == 64
    assert mask_json(None) is None and mask_json("x") == "***"
