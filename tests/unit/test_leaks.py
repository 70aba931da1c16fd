"""What leaks (issue 13 item 4): ports an operator denies, and tracebacks of
unclassified transport errors.  The customer-facing reasons are checked in
``tests/e2e/faults/test_engine_ssrf.py``, ``test_bad_input.py`` and ``tests/e2e/test_cli.py``;
redaction of encoded secrets in ``tests/unit/test_redaction.py``.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from dispatcher.config import ConfigError, config_from_mapping
from dispatcher.outbound.netguard import BlockedURL, OutboundPolicy, check_registration_url, parse_target
from dispatcher.outbound.transport import GeventHttpClientTransport, Urllib3Transport

OPEN = OutboundPolicy(require_https=False, allow_private_networks=True)


@pytest.mark.parametrize("port", [22, 23, 25, 3306, 5432, 6379, 11211])
def test_default_denied_ports_are_refused_at_registration_and_send_time(port: int) -> None:
    policy = OutboundPolicy.from_config(config_from_mapping({}, env={}).http)
    with pytest.raises(BlockedURL) as refused:
        check_registration_url(f"https://93.184.215.14:{port}/hook", policy)
    assert refused.value.public == "port not allowed"
    assert str(port) in str(refused.value)  # the operator's detail names it
    assert parse_target("https://93.184.215.14/hook", policy).port == 443
    assert parse_target("https://93.184.215.14:8443/hook", policy).port == 8443


def test_an_allow_list_admits_only_its_ports_and_the_deny_list_still_wins() -> None:
    config = config_from_mapping({"http": {"allow_ports": [443, 8443, 22], "deny_ports": [22],
                                          "require_https": False}}, env={})
    policy = OutboundPolicy.from_config(config.http)
    assert parse_target("https://hooks.example.test:8443/x", policy).port == 8443
    for url in ("https://hooks.example.test:9000/x", "https://hooks.example.test:22/x",
                "http://hooks.example.test/x"):
        with pytest.raises(BlockedURL, match="port"):
            parse_target(url, policy)
    with pytest.raises(ConfigError, match="http.deny_ports"):
        config_from_mapping({"http": {"deny_ports": [0]}}, env={})


@pytest.mark.parametrize("kind", [Urllib3Transport, GeventHttpClientTransport])
def test_a_denied_port_is_refused_at_send_time_without_dialing(kind: type) -> None:
    dials: list[tuple[str, int]] = []

    def dialer(ip: str, port: int, timeout: float) -> socket.socket:
        dials.append((ip, port))
        raise ConnectionRefusedError

    transport = kind(timeout=2.0, policy=OutboundPolicy(require_https=False, allow_private_networks=True,
                                                        deny_ports=(6379,)), dialer=dialer)
    try:
        result = transport.post("http://127.0.0.1:6379/x", {}, b"{}")
    finally:
        transport.close()
    assert (result.error, result.detail) == ("blocked", "port not allowed")
    assert dials == []


@pytest.mark.parametrize("kind", [Urllib3Transport, GeventHttpClientTransport])
def test_an_unclassified_transport_error_is_logged_scrubbed(kind: type, caplog: pytest.LogCaptureFixture,
                                                           tmp_path: Path) -> None:
    secret = "sk_live_9fQm2LxVb7RtYp4KdW8s"

    def dialer(ip: str, port: int, timeout: float) -> socket.socket:
        raise RuntimeError(f"driver broke on https://u.example.test/in?token={secret} Bearer {secret}")

    transport = kind(timeout=2.0, policy=OPEN, dialer=dialer)
    try:
        with caplog.at_level(logging.WARNING, logger="dispatcher.transport"):
            result = transport.post("http://127.0.0.1:9/x", {}, b"{}")
    finally:
        transport.close()
    assert result.error == "connection" and secret not in result.detail
    assert "unclassified transport error" in caplog.text and "RuntimeError" in caplog.text
    assert "Traceback" in caplog.text  # still there for the operator, scrubbed
    assert secret not in caplog.text and secret[8:20] not in caplog.text
