"""The ``peer`` scenario's parts that need no database: its receiver's access log, and
the clear refusal when nginx or the bench extra is missing.  (The smoke test runs
the whole scenario at toy size.)"""

from __future__ import annotations

import http.client
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from benchmarks import nginx as nginx_module
from benchmarks import peer
from benchmarks.cli import run_scenario
from benchmarks.nginx import LogFigures, NginxReceiver


def _line(key: str, *, path: str = "/ep0-1", status: int = 204, webhook_id: str | None = None,
          timestamp: str = "1700000000", signature: str = "v1,c2ln") -> str:
    webhook_id = key if webhook_id is None else webhook_id
    return f"1700000000.123 {status} POST {path} 7 1 {key} {webhook_id} {timestamp} {signature}\n"


def test_the_log_counts_unique_deliveries_duplicates_and_requests_without_signature_headers() -> None:
    found = LogFigures()
    for line in (_line("evt-1"), _line("evt-1", path="/ep0-2"), _line("evt-1"),  # same event, 2 endpoints, 1 repeat
                 _line("evt-2", signature="-"), _line("evt-3", timestamp="-"),
                 _line("evt-4", webhook_id="evt-9"), _line("evt-5", status=500)):
        found.add(line)
    assert found.requests == 7 and found.ok == 6
    assert found.pairs == {("/ep0-1", "evt-1"), ("/ep0-2", "evt-1"), ("/ep0-1", "evt-2"), ("/ep0-1", "evt-3"),
                           ("/ep0-1", "evt-4")}
    assert found.duplicates == 1
    assert found.signature_headers_missing == 2 and found.id_mismatch == 1
    assert found.statuses == {"204": 6, "500": 1} and found.endpoints == {"ep0-1": 5, "ep0-2": 1}


def test_a_signature_with_two_keys_is_one_field() -> None:
    found = LogFigures()
    found.add(_line("evt-1", signature="v1,a2V5MQ== v1,a2V5Mg=="))
    assert found.signature_headers_missing == 0 and found.pairs == {("/ep0-1", "evt-1")}


def _hide_nginx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(nginx_module, "SBIN_DIRS", str(tmp_path))


def test_without_nginx_the_scenario_fails_with_the_install_command(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    _hide_nginx(monkeypatch, tmp_path)
    with pytest.raises(peer.ToolMissing, match=r"nginx is not installed.*apt-get install -y nginx"):
        peer.run(tiny=True)
    result = run_scenario("peer", tiny=True)
    assert result["met"] is False and "apt-get install -y nginx" in result["error"]


def test_without_the_bench_extra_the_scenario_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if peer.missing_tools() is not None and "nginx" in (peer.missing_tools() or ""):
        pytest.skip("nginx is not installed here: the extra's message comes after it")
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pgqueuer" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(peer.ToolMissing, match=r"bench extra is not installed \(pgqueuer missing\).*\[bench\]"):
        peer.run(tiny=True)


def test_peer_dsn_becomes_an_asyncpg_url() -> None:
    assert peer.url_dsn("host=127.0.0.1 port=5432 user=postgres dbname=bench_x") == \
        "postgresql://postgres@127.0.0.1:5432/bench_x"
    assert peer.url_dsn("postgresql://u:p%40ss@127.0.0.1:6543/d?sslmode=disable") == \
        "postgresql://u:p%40ss@127.0.0.1:6543/d?sslmode=disable"


def test_a_socket_directory_goes_as_the_host_parameter() -> None:
    """The embedded server listens on a unix socket: its directory must not be read as the database."""
    url = peer.url_dsn("user=postgres password='' dbname=bench_x host='/tmp/a b/pgdata'")
    assert url == "postgresql://postgres@/bench_x?host=%2Ftmp%2Fa+b%2Fpgdata"
    assert peer.url_dsn("host=/run/pg port=5433 dbname=d") == "postgresql:///d?host=%2Frun%2Fpg&port=5433"


@pytest.mark.skipif(peer.missing_tools() is not None and "nginx" in (peer.missing_tools() or ""),
                    reason="nginx is not installed (apt-get install -y nginx)")
def test_nginx_answers_204_on_keep_alive_and_logs_each_request(tmp_path: Path) -> None:
    with NginxReceiver(tmp_path) as receiver:
        url = receiver.url("ok", "ep3-4")
        assert url == f"http://127.0.0.1:{receiver.port}/ep3-4"
        conn = http.client.HTTPConnection(receiver.host, receiver.port, timeout=5)
        for key in ("evt-1", "evt-2", "evt-1"):
            conn.request("POST", "/ep3-4", body=b"{}", headers={
                "Idempotency-Key": key, "webhook-id": key, "webhook-timestamp": "1", "webhook-signature": "v1,eA=="})
            response = conn.getresponse()
            response.read()
            assert response.status == 204
        conn.close()
        assert receiver.wait_logged(3, timeout=10)
        stats = receiver.stats()
    assert stats["requests"] == 3 and stats["unique"] == 2 and stats["duplicates"] == 1
    assert stats["connections"] == 1, "keep-alive: one connection for the three requests"
    assert stats["signature_headers_missing"] == 0 and stats["endpoints"] == {"ep3-4": {"ok": 3}}
    with pytest.raises(ValueError, match="only answers 204"):
        NginxReceiver(tmp_path).url("error", "ep1")
