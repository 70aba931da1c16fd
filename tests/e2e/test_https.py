"""HTTPS through the engine: a real dispatcher, a TLS receiver, a CA made in the test (issue 14 item 1).

``require_https`` is on and the outbound policy admits 127.0.0.0/8 only through
``http.allow_networks``, so these deliveries take the production path: https
URL, pinned dial, SNI and certificate checked against the name.  The receiver's
certificate comes from a throw-away ``trustme`` CA that only ``http.ca_file``
makes trusted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from dispatcher.config import ConfigError, config_from_mapping
from dispatcher_devtools.kit import SECRET, Dispatcher, produce, query, seed_workspace, status_counts, wait_until
from dispatcher_devtools.receiver import ReceiverProcess

pytestmark = pytest.mark.timeout(120)

CLIENTS = ["geventhttpclient", "urllib3"]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": directory / "ca.pem", "cert": directory / "cert.pem", "key": directory / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    for index, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(str(files["cert"]), append=index > 0)
    return files


@pytest.fixture
def tls_receiver(tls_files: dict[str, Path]) -> Iterator[ReceiverProcess]:
    with ReceiverProcess(secrets=[SECRET], tls_cert=tls_files["cert"], tls_key=tls_files["key"]) as rx:
        yield rx


def _https_http(ca_file: Path | None, client: str) -> dict[str, object]:
    http: dict[str, object] = {"require_https": True, "allow_private_networks": False,
                               "allow_networks": ["127.0.0.0/8"], "client": client, "timeout": "2s"}
    if ca_file is not None:
        http["ca_file"] = str(ca_file)
    return http


@pytest.mark.parametrize("client", CLIENTS)
def test_delivers_over_tls_with_the_configured_ca(db, write_config, tmp_path: Path, tls_files: dict[str, Path],
                                                  tls_receiver: ReceiverProcess, client: str) -> None:
    url = tls_receiver.url("ok", "secure")
    assert url.startswith("https://")
    seed_workspace(db.dsn, "ws", [url])
    config = write_config(db, http=_https_http(tls_files["ca"], client))
    event_ids = produce(config, db.dsn, "ws", 6)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: status_counts(db.dsn).get("delivered") == 6, message="6 deliveries over TLS")
    seen = tls_receiver.endpoint("secure")
    assert seen["unique"] == 6 and seen["bad_signatures"] == 0
    assert sorted(d.webhook_id for d in tls_receiver.deliveries()) == sorted(event_ids)


@pytest.mark.parametrize("client", CLIENTS)
def test_without_the_ca_the_certificate_is_refused_and_nothing_goes_out_in_plain_http(
        db, write_config, tmp_path: Path, tls_receiver: ReceiverProcess, client: str) -> None:
    url = tls_receiver.url("ok", "untrusted")
    seed_workspace(db.dsn, "ws", [url])
    config = write_config(db, http=_https_http(None, client), retry={"base": "30s"})
    produce(config, db.dsn, "ws", 3)
    with Dispatcher(config, tmp_path / "d.log"):
        wait_until(lambda: query(db.dsn, "SELECT count(*) FROM webhook_delivery_attempts")[0][0] >= 3,
                   message="3 failed attempts")
    attempts = query(db.dsn, "SELECT result, status_code, error FROM webhook_delivery_attempts")
    assert {(result, code) for result, code, _ in attempts} == {("tls", None)}
    assert all("certificate verify failed" in error for _, _, error in attempts), attempts
    assert status_counts(db.dsn) == {"pending": 3}
    # The receiver saw no request at all: no plain-HTTP fallback, nothing sent before the handshake.
    assert tls_receiver.stats()["requests"] == 0


def test_a_ca_file_that_is_missing_or_not_pem_is_a_clear_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"http\.ca_file: .*nowhere\.pem"):
        config_from_mapping({"http": {"ca_file": str(tmp_path / "nowhere.pem")}}, env={})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"http\.ca_file: .*no PEM certificate"):
        config_from_mapping({"http": {"ca_file": str(garbage)}}, env={})
