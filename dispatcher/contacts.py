"""Owner contacts (docs/decisions.md, Q3): the one check of an email address,
and the hash of the token in a contact's confirmation link.

No email library is a dependency, and a notification address needs less than
RFC 5322 allows, so this is a small strict check of our own: ASCII only, a
dot-atom local part (no quoted strings, no comments, no spaces), a domain of
at least two LDH labels, at most 254 characters.  Above all it refuses CR, LF
and every other control or separator character, so an address can never
inject a header into the notification mail it ends up in.
"""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 254  # RFC 5321's path limit minus the angle brackets

_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class InvalidContact(ValueError):
    """An owner contact that is not a plain email address; the message names why."""


def check_email(text: str) -> str:
    """``text`` if it is a plain email address (``user@example.com``), else :class:`InvalidContact`."""
    if not isinstance(text, str) or not text:
        raise InvalidContact("an owner contact must be an email address, e.g. ops@example.com")
    if len(text) > MAX_LENGTH:
        raise InvalidContact(f"an email address has at most {MAX_LENGTH} characters")
    local, sep, domain = text.rpartition("@")
    if not sep or not local or not domain:
        raise InvalidContact(f"{text!r} is not an email address (user@example.com)")
    if len(local) > 64 or not _LOCAL.fullmatch(local):
        raise InvalidContact(f"{text!r} is not an email address: bad part before the @")
    labels = domain.split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise InvalidContact(f"{text!r} is not an email address: bad domain (e.g. example.com)")
    return text


def token_hash(token: str) -> str:
    """What is stored of a confirmation link's token (migration 0019): its SHA-256, in hex.  The
    notifier stores it when it mails the link; the API's confirm route looks the link up by it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
