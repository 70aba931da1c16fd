"""A real SMTP server in the test process (aiosmtpd), recording every mail it accepts.

Plain by default; with ``tls`` it offers STARTTLS, and with ``login`` it
requires AUTH (after STARTTLS) with that user and password.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: Message

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def body(self) -> str:
        payload = self.message.get_payload(decode=True)
        return payload.decode("utf-8") if isinstance(payload, bytes) else str(payload)


@dataclass
class SmtpSink:
    port: int
    mails: list[Mail] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's naming
        with self.lock:
            self.mails.append(Mail(envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"

    def received(self, subject_part: str = "") -> list[Mail]:
        with self.lock:
            return [mail for mail in self.mails if subject_part in mail.subject]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def smtp_server(tls: ssl.SSLContext | None = None, login: tuple[str, str] | None = None) -> Iterator[SmtpSink]:
    """An SMTP server on 127.0.0.1; fails loudly if it cannot start."""
    sink = SmtpSink(free_port())

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and login is not None and (
            data.login.decode(), data.password.decode()) == login
        return AuthResult(success=ok, handled=False)

    options: dict[str, Any] = {}
    if tls is not None:
        options.update(tls_context=tls, require_starttls=True)
    if login is not None:
        options.update(authenticator=authenticate, auth_required=True, auth_require_tls=tls is not None)
    controller = Controller(sink, hostname="127.0.0.1", port=sink.port, **options)
    controller.start()
    try:
        yield sink
    finally:
        controller.stop()
