"""Standard Webhooks signing (https://www.standardwebhooks.com/).

The signed content is ``{event_id}.{timestamp}.{body}``: the RFC's "timestamp,
event ID and body", in the order Standard Webhooks fixes so that customers can
verify with the stock ``standardwebhooks``/``svix`` libraries.

Secrets: a secret written ``whsec_<base64>`` is used exactly as Standard
Webhooks defines it (the key is the base64-decoded part).  A plain secret (any
other string) is used as its UTF-8 bytes; the
equivalent Standard Webhooks secret a customer configures is
``"whsec_" + base64(secret.encode())`` -- see :func:`as_standard_secret`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
from collections.abc import Iterable

SECRET_PREFIX = "whsec_"
# Every secret a customer or operator sets carries at least this many key
# bytes (docs/decisions.md, Secrets): whsec_ with 24 bytes of base64 is the weakest accepted.
MIN_SECRET_BYTES = 24
# Secrets this module makes carry 32 random bytes (Svix's size).
NEW_SECRET_BYTES = 32
# How long, by default, the previous secret also signs after a rotation
# (the setting secrets.rotation_grace).
ROTATION_GRACE = 24 * 3600.0


class InvalidSecret(ValueError):
    """A ``whsec_`` secret whose key part is not valid base64."""


class WeakSecret(ValueError):
    """A secret refused where one is set: empty, undecodable or shorter than MIN_SECRET_BYTES."""


def new_secret() -> str:
    """A fresh random ``whsec_`` secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(NEW_SECRET_BYTES)).decode("ascii")


def check_strength(secret: str) -> None:
    """Raise WeakSecret unless ``secret`` yields at least MIN_SECRET_BYTES key bytes.

    The message never quotes the secret: it may reach a terminal or a log.
    """
    try:
        key = secret_key(secret)
    except InvalidSecret:
        raise WeakSecret("the secret starts with whsec_ but the rest is not valid base64") from None
    if len(key) < MIN_SECRET_BYTES:
        what = "base64-decoded bytes after whsec_" if secret.startswith(SECRET_PREFIX) else "bytes"
        raise WeakSecret(f"the secret is too weak: {len(key)} {what}, at least {MIN_SECRET_BYTES} are required")


def secret_key(secret: str) -> bytes:
    """The HMAC key bytes for a workspace secret."""
    if secret.startswith(SECRET_PREFIX):
        try:
            return base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
        except ValueError as exc:
            raise InvalidSecret("secret starts with whsec_ but is not valid base64") from exc
    return secret.encode("utf-8")


def as_standard_secret(secret: str) -> str:
    """The ``whsec_`` form of a secret, for customers' verification libraries."""
    if secret.startswith(SECRET_PREFIX):
        return secret
    return SECRET_PREFIX + base64.b64encode(secret.encode("utf-8")).decode("ascii")


@functools.lru_cache(maxsize=4096)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 already keyed with ``key``, to copy: keying costs a third of a signature."""
    return hmac.new(key, digestmod=hashlib.sha256)


def sign(key: bytes, event_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature."""
    mac = _keyed(key).copy()
    mac.update(b"%s.%d." % (event_id.encode("utf-8"), timestamp))
    mac.update(body)
    return "v1," + base64.b64encode(mac.digest()).decode("ascii")


def signature_header(keys: Iterable[bytes], event_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per key, space-separated.

    During a secret rotation's grace period the caller passes both keys, so a
    customer still verifying with the old secret keeps accepting deliveries.
    """
    return " ".join(sign(key, event_id, timestamp, body) for key in keys)


def verify(keys: Iterable[bytes], event_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """True when any ``v1`` signature in ``header`` matches any key."""
    offered = [part for part in header.split() if part.startswith("v1,")]
    for key in keys:
        expected = sign(key, event_id, timestamp, body)
        if any(hmac.compare_digest(expected, candidate) for candidate in offered):
            return True
    return False
