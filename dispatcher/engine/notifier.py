"""Q3: the people who own an endpoint hear of each stage of its lifecycle --
failing (the breaker opened), will be paused, paused, held events expiring,
recovered -- once per episode (docs/decisions.md, Q3; docs/operations.md,
"Breaker notices" and "Endpoint lifecycle"; the stages are
``dispatcher.rules.lifecycle``'s).

* **Who.** The endpoint's ``owner_contact``, else its workspace's, else the
  operator address ``notifier.smtp_to`` (:func:`recipient`); an owner contact
  only once it is confirmed (issue 23 item 6).  Every kind of notice, each
  lifecycle stage alike, goes to that recipient.
* **Confirmed.** Customers name owner contacts, so an address is asked first:
  each contact in use gets one mail with a link (``notifier.confirm_url``
  ``?token=``; only the token's SHA-256 is stored), and the API's confirm route
  marks it confirmed (:class:`ContactConfirmations`).  Until then its notices
  go to the workspace's confirmed owner, else the operator.
* **How many.** No address gets more than ``notifier.mails_per_recipient_hour``
  mails an hour, notices of every kind and confirmation requests alike; more
  wait, none is dropped (:class:`dispatcher.rules.mail_rate.MailRate`).
* **Once.** A notice is a row of ``breaker_notices`` keyed by (endpoint,
  lifecycle episode, kind): each kind is written once per episode by the one
  process holding the round (INSERT ... ON CONFLICT DO NOTHING besides), and
  each mail is claimed by one sender at a time.  The same round pauses an
  endpoint whose breaker kept reopening for ``endpoints.disable_after``.
* **How.** ``notifier.kind``: ``log`` (default) writes a WARNING, ``smtp`` mails
  through the relay (TLS and AUTH per ``notifier.smtp_*``).  A failed mail is
  tried again ``notifier.smtp_attempts`` times in all, with doubling waits
  (:class:`MailRetry`), then dropped with an ERROR line.  A sender that dies
  between sending and recording may send a mail twice: at least once, not
  exactly once.
* **Operational webhook.** A workspace with a ``notify_webhook_url`` also gets
  each notice as an event (``webhook.endpoint.breaker_opened`` /
  ``...breaker_recovered``) and one delivery row to its operational endpoint,
  written in the notice's own transaction: signed, retried and policed like
  every delivery.  Never to the failing endpoint itself (:func:`same_target`).
* **Off the delivery path.** :class:`OwnerNotices` runs in a greenlet of its own
  with a connection of its own (``dispatcher.engine.worker``), woken by this
  process's breaker transitions and, on the upkeep leader, every
  ``alerts.check_interval``; every failure is logged and swallowed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import smtplib
import ssl
from collections.abc import Container
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any, Protocol

import gevent

from dispatcher.config import Config, NotifierConfig
from dispatcher.contacts import InvalidContact, check_email, token_hash
from dispatcher.outbound.netguard import OutboundError, OutboundPolicy, parse_target
from dispatcher.redact import scrub
from dispatcher.rules.backoff import Backoff
from dispatcher.rules.lifecycle import Decision, Facts, LifecyclePolicy, decide
from dispatcher.rules.mail_rate import MailRate
from dispatcher.store.notices import (
    ClaimedConfirmation,
    ClaimedNotice,
    Decide,
    NewNotice,
    NoticeStore,
    OperationalWebhook,
)

log = logging.getLogger("dispatcher.notifier")

# Mails claimed per round: a round sends them one after another, so this and
# notifier.smtp_timeout bound how long a round can take.
MAILS_PER_ROUND = 20
EVENT_TYPES = {"opened": "webhook.endpoint.breaker_opened", "will_pause": "webhook.endpoint.will_pause",
               "paused": "webhook.endpoint.paused", "expiring": "webhook.endpoint.held_expiring",
               "recovered": "webhook.endpoint.breaker_recovered"}
# Parses any URL for comparison only; sending applies the real policy.
_ANY_URL = OutboundPolicy(require_https=False, allow_private_networks=True)


class NoticeNotSent(Exception):
    """A mail that did not go out; the message is safe to log (no secrets)."""


def recipient(endpoint_owner: str | None, workspace_owner: str | None, operator: str,
              confirmed: Container[str] = frozenset()) -> tuple[str, str]:
    """(address, whose): the endpoint's owner, else the workspace's, else the operator.

    An owner contact not in ``confirmed`` (its address has not answered the
    mailed link) is passed over: a customer could have named anybody.  So is a
    contact that is not a plain address (written around the CLI's check, by raw
    SQL): it could not be mailed, and must never reach a mail header."""
    for contact, whose in ((endpoint_owner, "endpoint"), (workspace_owner, "workspace")):
        if not contact:
            continue
        try:
            address = check_email(contact)
        except InvalidContact:
            log.warning("the %s owner contact %r is not an email address; passed over", whose, contact)
            continue
        if address in confirmed:
            return address, whose
    return operator, "operator"


def confirmation_mail(workspace_id: str, link: str) -> tuple[str, str]:
    """(subject, body) of the mail that asks an owner contact to confirm it wants notices."""
    return (f"Confirm webhook notices for workspace {workspace_id}",
            f"Workspace {workspace_id} named this address to hear when one of its webhook endpoints fails, "
            f"will be or is paused, and recovers.\n\nTo get these notices, open this link and confirm:\n\n{link}\n\n"
            f"If you did not expect this mail, ignore it: nothing more is sent to this address until it is "
            f"confirmed.\n")


def same_target(first: str, second: str) -> bool:
    """Do two URLs name the same place (scheme, host, port, path and query, after
    normalisation: ``HTTPS://Example.com:443/x`` is ``https://example.com/x``)?"""
    try:
        a, b = parse_target(first, _ANY_URL), parse_target(second, _ANY_URL)
    except OutboundError:
        return first.strip() == second.strip()
    return (a.scheme, a.host, a.port, a.path) == (b.scheme, b.host, b.port, b.path)


@dataclass(frozen=True, slots=True)
class MailRetry:
    """When a failed mail is tried again: by ``backoff`` (``notifier.retry_base``,
    doubling, no cap, no jitter) until ``attempts`` tries were made; then never (None)."""

    attempts: int
    backoff: Backoff

    def delay_after(self, attempts_made: int) -> float | None:
        if attempts_made >= self.attempts:
            return None
        # No jitter: a notice's next try is a stored due time, and notices are few.
        return self.backoff.delay(attempts_made, 0.0)


def operational_webhook(notice: NewNotice) -> OperationalWebhook | None:
    """The event the workspace's notify URL gets for ``notice``, or None: no URL,
    or the URL is the failing endpoint's own (it would only fail there too)."""
    if not notice.notify_url:
        return None
    if same_target(notice.notify_url, notice.url):
        log.warning("operational webhook for endpoint %d (%s, episode %d) skipped: the workspace's notify URL is "
                    "the failing endpoint itself", notice.endpoint_id, notice.kind, notice.episode)
        return None
    payload = json.dumps({"endpoint_id": notice.endpoint_id, "episode": notice.episode,
                          "breaker": "closed" if notice.kind == "recovered" else "open",
                          "stage": notice.kind, **notice.detail,
                          "consecutive_failures": notice.consecutive_failures,
                          "last_error": notice.last_error}, separators=(",", ":"))
    return OperationalWebhook(
        workspace_id=notice.workspace_id, url=notice.notify_url,
        event_id=f"breaker_{notice.kind}_{notice.endpoint_id}_{notice.episode}",
        event_type=EVENT_TYPES[notice.kind], payload=payload,
        payload_hash=hashlib.sha256(payload.encode("utf-8")).hexdigest())


def lifecycle_step(policy: LifecyclePolicy) -> Decide:
    """The round's decision for one endpoint: the rule's, with the dates each notice states."""
    def step(facts: Facts, now: float) -> tuple[Decision, dict[str, dict[str, Any]]]:
        decision = decide(policy, facts, now)
        at = _iso(decision.next_step_at)
        details: dict[str, dict[str, Any]] = {
            "opened": {"pause_at": at} if decision.next_step == "paused" else {},
            "will_pause": {"pause_at": at},
            "paused": {"expires_at": at},
            "expiring": {"expires_at": at},
        }
        return decision, details
    return step


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def mail_text(notice: ClaimedNotice) -> tuple[str, str]:
    """(subject, body) of a notice's mail.  The URL is shown as its host only: paths often carry credentials."""
    host = _host(notice.url)
    where = f"Webhook endpoint {notice.endpoint_id} ({host}) of workspace {notice.workspace_id}"
    detail = notice.detail or {}
    if notice.kind == "opened":
        pause_at = detail.get("pause_at")
        later = (f" If it keeps failing until {pause_at}, it will be paused (its events held, not lost)."
                 if pause_at else "")
        return (f"Webhook endpoint {notice.endpoint_id} is failing; its deliveries wait",
                f"{where} failed {notice.consecutive_failures} times in a row (last error: "
                f"{notice.last_error or 'unknown'}).\n\nDeliveries to it wait, not lost: they stay pending "
                f"and one is sent as a probe after the breaker's cool-off.{later} You will get one more mail when "
                f"it recovers.\n")
    if notice.kind == "will_pause":
        return (f"Webhook endpoint {notice.endpoint_id} will be paused at {detail.get('pause_at')}",
                f"{where} has kept failing (last error: {notice.last_error or 'unknown'}). If it still fails at "
                f"{detail.get('pause_at')}, it will be paused: new events are kept for it, not sent and not "
                f"lost, until it is resumed. Fix the receiver, or pause it yourself.\n")
    if notice.kind == "paused":
        return (f"Webhook endpoint {notice.endpoint_id} is paused; its events are held",
                f"{where} is paused ({detail.get('cause')}). Its events are held, not sent and not lost, until "
                f"it is resumed (API: POST /v2/webhooks/endpoints/{notice.endpoint_id}/resume, or the console). "
                f"Events held longer than the hold period become dead from {detail.get('expires_at')}.\n")
    if notice.kind == "expiring":
        return (f"Webhook endpoint {notice.endpoint_id}: held events expire at {detail.get('expires_at')}",
                f"{where} is still paused. Its held events become dead from {detail.get('expires_at')} unless "
                f"it is resumed before.\n")
    return (f"Webhook endpoint {notice.endpoint_id} recovered",
            f"{where} answered again (or was resumed): its breaker closed and the deliveries held while it "
            f"was failing or paused are flowing again.\n")


def _host(url: str | None) -> str:
    if url is None:
        return "deleted"
    try:
        return parse_target(url, _ANY_URL).authority
    except OutboundError:
        return "unparsable URL"


class Notifier(Protocol):
    def deliver(self, to: str, subject: str, text: str) -> None:
        """Send one notice; raises :class:`NoticeNotSent`."""


class LogNotifier:
    def deliver(self, to: str, subject: str, text: str) -> None:
        log.warning("notify endpoint owner %s: %s: %s", to, subject, " ".join(text.split()))


class SmtpNotifier:
    """One SMTP session per mail, with TLS per ``smtp_security`` and AUTH when a user is set.

    Bounded by ``smtp_timeout`` as a whole (gevent.Timeout), not only per socket operation."""

    def __init__(self, config: NotifierConfig, ca_file: str | None = None) -> None:
        self._config = config
        self._tls = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        if ca_file:
            self._tls.load_default_certs()

    def deliver(self, to: str, subject: str, text: str) -> None:
        c = self._config
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = c.smtp_from, to, subject
        message.set_content(text)
        try:
            with gevent.Timeout(c.smtp_timeout, NoticeNotSent(f"no answer within {c.smtp_timeout:g}s")):
                self._session(message)
        except (OSError, smtplib.SMTPException) as exc:
            raise NoticeNotSent(scrub(f"{type(exc).__name__}: {exc}", [c.smtp_password])) from None

    def _session(self, message: EmailMessage) -> None:
        c = self._config
        smtp: smtplib.SMTP
        if c.smtp_security == "tls":
            smtp = smtplib.SMTP_SSL(c.smtp_host, c.smtp_port, timeout=c.smtp_timeout, context=self._tls)
        else:
            smtp = smtplib.SMTP(c.smtp_host, c.smtp_port, timeout=c.smtp_timeout)
        with smtp:
            if c.smtp_security == "starttls":
                smtp.starttls(context=self._tls)
            if c.smtp_username:
                smtp.login(c.smtp_username, c.smtp_password or "")
            smtp.send_message(message)


def make_notifier(config: Config) -> Notifier:
    if config.notifier.kind == "smtp":
        return SmtpNotifier(config.notifier, config.http.ca_file)
    return LogNotifier()


class OwnerNotices:
    """One round: write new notices (and their operational webhooks), ask new owner contacts to
    confirm, then send the due mails."""

    def __init__(self, config: Config, store: NoticeStore, notifier: Notifier | None = None) -> None:
        self._config = config.notifier
        self._store = store
        self._notifier = notifier or make_notifier(config)
        self._retry = MailRetry(config.notifier.smtp_attempts, Backoff(base=config.notifier.retry_base))
        self._rate = MailRate(config.notifier.mails_per_recipient_hour)
        self._step = lifecycle_step(config.endpoints.lifecycle_policy())
        self._retention = config.retention.dead
        # A claimed mail is due again after this: long enough for a whole round of sends.
        self._lease = config.notifier.smtp_timeout * (MAILS_PER_ROUND + 1) + 60.0
        self._confirmations = ContactConfirmations(self._config, store, self._notifier, self._retry, self._rate,
                                                   self._lease)

    def run_once(self, prune: bool = False) -> None:
        written, paused = self._store.lifecycle(self._step, operational_webhook)
        for endpoint_id in paused:
            log.warning("endpoint %d paused: its breaker kept reopening for endpoints.disable_after; its events "
                        "are held until it is resumed event=endpoint_paused", endpoint_id)
        for notice in written:
            log.info("breaker notice %s endpoint_id=%d episode=%d written event=breaker_notice",
                     notice.kind, notice.endpoint_id, notice.episode)
        self._confirmations.run_once()
        for claimed in self._store.claim(MAILS_PER_ROUND, self._lease):
            self._send(claimed)
        if prune:
            self._store.prune(self._retention)

    def _send(self, notice: ClaimedNotice) -> None:
        confirmed = {contact for contact, ok in ((notice.endpoint_owner, notice.endpoint_owner_confirmed),
                                                 (notice.workspace_owner, notice.workspace_owner_confirmed))
                     if ok and contact}
        to, whose = recipient(notice.endpoint_owner, notice.workspace_owner, self._config.smtp_to, confirmed)
        wait = self._rate.wait(self._store.recent_mails(to))
        if wait is not None:
            log.warning("breaker notice %s for endpoint %d to %s held for %.0fs: %d mails an hour at most "
                        "(notifier.mails_per_recipient_hour)", notice.kind, notice.endpoint_id, to, wait,
                        self._rate.per_hour)
            self._store.defer(notice, wait)
            return
        subject, text = mail_text(notice)
        try:
            self._notifier.deliver(to, subject, text)
        except NoticeNotSent as exc:
            retry_in = self._retry.delay_after(notice.attempts)
            if retry_in is None:
                log.error("breaker notice %s for endpoint %d to %s dropped after %d attempts: %s",
                          notice.kind, notice.endpoint_id, to, notice.attempts, exc)
            else:
                log.warning("breaker notice %s for endpoint %d to %s not sent (attempt %d, next in %.0fs): %s",
                            notice.kind, notice.endpoint_id, to, notice.attempts, retry_in, exc)
            self._store.finish(notice, to, sent=False, error=str(exc), retry_in=retry_in)
            return
        log.info("breaker notice %s for endpoint %d sent to the %s owner %s", notice.kind, notice.endpoint_id,
                 whose, to)
        self._store.finish(notice, to, sent=True)


class ContactConfirmations:
    """Mails each owner contact in use one link to confirm it (issue 23 item 6).

    Only with ``kind: smtp`` and a ``confirm_url``: without them no contact can
    answer, so none is asked and every notice goes to the operator."""

    def __init__(self, config: NotifierConfig, store: NoticeStore, notifier: Notifier, retry: MailRetry,
                 rate: MailRate, lease: float) -> None:
        self._config, self._store, self._notifier = config, store, notifier
        self._retry, self._rate, self._lease = retry, rate, lease

    def run_once(self) -> None:
        if self._config.kind != "smtp" or not self._config.confirm_url:
            return
        self._store.discover_contacts()
        for claimed in self._store.claim_confirmations(MAILS_PER_ROUND, self._lease):
            self._ask(claimed)

    def _ask(self, claimed: ClaimedConfirmation) -> None:
        try:
            to = check_email(claimed.address)
        except InvalidContact:
            log.warning("owner contact %r of workspace %s is not an email address; not asked", claimed.address,
                        claimed.workspace_id)
            self._store.finish_confirmation(claimed, error="not an email address")
            return
        wait = self._rate.wait(self._store.recent_mails(to))
        if wait is not None:
            log.warning("confirmation request to %s held for %.0fs: %d mails an hour at most "
                        "(notifier.mails_per_recipient_hour)", to, wait, self._rate.per_hour)
            self._store.defer_confirmation(claimed, wait)
            return
        token = secrets.token_urlsafe(32)
        subject, text = confirmation_mail(claimed.workspace_id, f"{self._config.confirm_url}?token={token}")
        try:
            self._notifier.deliver(to, subject, text)
        except NoticeNotSent as exc:
            retry_in = self._retry.delay_after(claimed.attempts)
            log.warning("confirmation request to %s of workspace %s not sent (attempt %d, next in %s): %s", to,
                        claimed.workspace_id, claimed.attempts, "never" if retry_in is None else f"{retry_in:.0f}s",
                        exc)
            self._store.finish_confirmation(claimed, error=str(exc), retry_in=retry_in)
            return
        log.info("confirmation request sent to owner contact %s of workspace %s", to, claimed.workspace_id)
        self._store.finish_confirmation(claimed, token_hash=token_hash(token))
