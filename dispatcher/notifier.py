"""Q3: endpoint owners hear about it when a breaker opens (not after attempt 5).

Pluggable: ``notifier.kind: log`` (default) writes a WARNING; ``smtp`` mails
``notifier.smtp_to``.  The schema has no per-endpoint owner address yet, so
mail goes to one configured address (support's queue), which forwards.
Notifiers run in their own greenlet and swallow their own failures: a broken
mail relay must never hold up delivery.
"""

from __future__ import annotations

import logging
import smtplib
from email.message import EmailMessage
from typing import Protocol

from dispatcher.breaker import EndpointBreaker
from dispatcher.config import NotifierConfig

log = logging.getLogger("dispatcher.notifier")


class Notifier(Protocol):
    def breaker_opened(self, endpoint_id: int, breaker: EndpointBreaker, error: str | None) -> None: ...


def _text(endpoint_id: int, breaker: EndpointBreaker, error: str | None) -> str:
    return (f"Webhook endpoint {endpoint_id} failed {breaker.consecutive_failures} times in a row "
            f"(last error: {error or 'unknown'}). Deliveries are paused, not lost: they stay pending "
            f"and are retried after the breaker's cool-off.")


class LogNotifier:
    def breaker_opened(self, endpoint_id: int, breaker: EndpointBreaker, error: str | None) -> None:
        log.warning("notify endpoint owner: %s", _text(endpoint_id, breaker, error))


class SmtpNotifier:
    def __init__(self, config: NotifierConfig) -> None:
        self._config = config

    def breaker_opened(self, endpoint_id: int, breaker: EndpointBreaker, error: str | None) -> None:
        message = EmailMessage()
        message["From"] = self._config.smtp_from
        message["To"] = self._config.smtp_to
        message["Subject"] = f"Webhook endpoint {endpoint_id} paused after repeated failures"
        message.set_content(_text(endpoint_id, breaker, error))
        try:
            with smtplib.SMTP(self._config.smtp_host, self._config.smtp_port, timeout=10) as smtp:
                smtp.send_message(message)
        except (OSError, smtplib.SMTPException) as exc:
            log.warning("breaker notification for endpoint %d not sent: %s", endpoint_id, exc)


def make_notifier(config: NotifierConfig) -> Notifier:
    return SmtpNotifier(config) if config.kind == "smtp" else LogNotifier()
