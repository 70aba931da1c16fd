"""The command line, run as a user runs it: a subprocess, its exit code and its output.

Every failure must be one line on stderr naming the problem, never a
traceback: 2 for usage and configuration errors, 3 for an unreachable
database (dispatcher.runtime.exitcodes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from dispatcher import __version__, store
from dispatcher.config import DSN_ENV
from dispatcher.runtime.exitcodes import ExitCode
from dispatcher.signing import secret_key
from tests.conftest import TestDatabase as Database

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_DSN = "host=127.0.0.1 port=1 dbname=nowhere user=postgres connect_timeout=3"
WriteConfig = Callable[..., Path]


def run(args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None,
        cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != DSN_ENV}
    environ.update(env or {})
    return subprocess.run([str(a) for a in args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=90)


def cli(*args: str | os.PathLike[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "dispatcher.cli", *args], env=env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    """The process failed with ``code`` and said so in one clean line naming each of ``names``."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def usage_error(result: subprocess.CompletedProcess[str], *names: str) -> None:
    """argparse's usage error: a usage synopsis, then one ``error:`` line; exit 2."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == ExitCode.USAGE, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    for name in names:
        assert name in errors[0], errors[0]


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture
def config(db: Database, write_config: WriteConfig) -> Path:
    return write_config(db)


# ---------------------------------------------------------------- help and version


class TestHelpAndVersion:
    def test_help(self) -> None:
        out = ok(cli("--help"))
        assert out.startswith("usage: dispatcher")
        for word in ["-c CONFIG", "--version", "migrate", "workspace", "endpoint"]:
            assert word in out

    @pytest.mark.parametrize("command", [["workspace", "create"], ["endpoint", "add"]])
    def test_subcommand_help(self, command: list[str]) -> None:
        out = ok(cli(*command, "--help"))
        assert f"dispatcher {' '.join(command)}" in out

    def test_version(self) -> None:
        assert ok(cli("--version")).strip() == f"dispatcher {__version__}"

    def test_bin_launcher_works_from_another_directory(self, tmp_path: Path) -> None:
        result = run([sys.executable, REPO / "bin" / "dispatcher", "--version"], cwd=tmp_path)
        assert ok(result).strip() == f"dispatcher {__version__}"

    def test_console_script(self) -> None:
        script = shutil.which("dispatcher", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        if script is None:
            pytest.skip("the dispatcher console script is not installed in this environment")
        assert ok(run([script, "--version"])).strip() == f"dispatcher {__version__}"


# ---------------------------------------------------------------- configuration errors

BAD_CONFIGS = [
    ("bad-yaml", "workers: [oops\n", "not valid YAML"),
    ("unknown-key", "regoin: eu\n", "unknown key regoin"),
    ("unknown-nested-key", "http:\n  timout: 10s\n", "unknown key http.timout"),
    ("bad-duration", "http:\n  timeout: 10\n", "http.timeout"),
    ("bad-duration-unit", "workers:\n  lease: 10x\n", "workers.lease"),
    ("lease-too-short", "workers:\n  lease: 15s\n", "workers.lease"),
    ("bad-cidr", "http:\n  allow_networks: [300.1.2.3/8]\n", "http.allow_networks"),
    ("top-level-list", "- migrate\n", "top level"),
]


class TestConfigErrors:
    @pytest.mark.parametrize(("text", "names"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
    def test_one_line_and_exit_2(self, tmp_path: Path, text: str, names: str) -> None:
        path = tmp_path / "bad.yaml"
        path.write_text(text, encoding="utf-8")
        line = assert_one_line_error(cli("-c", path, "migrate"), ExitCode.CONFIG, names)
        assert line.startswith(f"dispatcher: config error ({path})")

    def test_missing_config_file(self, tmp_path: Path) -> None:
        assert_one_line_error(cli("-c", tmp_path / "absent.yaml", "migrate"), ExitCode.CONFIG,
                              "cannot read config file", "absent.yaml")

    def test_config_that_is_not_utf8(self, tmp_path: Path) -> None:
        path = tmp_path / "latin1.yaml"
        path.write_bytes(b"region: caf\xe9\n")
        assert_one_line_error(cli("-c", path, "migrate"), ExitCode.CONFIG, "not UTF-8")


class TestUsageErrors:
    def test_unknown_command(self, config: Path) -> None:
        usage_error(cli("-c", config, "frobnicate"), "frobnicate")

    @pytest.mark.parametrize("flag", ["webhook_outbox", "webhook_outbox=maybe", "=on"])
    def test_bad_flag_value(self, config: Path, flag: str) -> None:
        usage_error(cli("-c", config, "workspace", "create", "--id", "w", "--flag", flag), "--flag", "NAME=on|off")

    def test_empty_events(self, config: Path) -> None:
        usage_error(cli("-c", config, "endpoint", "add", "--workspace", "w", "--url", "http://127.0.0.1:9/",
                        "--events", ","), "--events")

    def test_missing_required_argument(self, config: Path) -> None:
        usage_error(cli("-c", config, "endpoint", "add", "--workspace", "w"), "--url")


# ---------------------------------------------------------------- the database


class TestDatabaseErrors:
    def test_unreachable_database_exits_3(self, write_config: WriteConfig, db: Database) -> None:
        path = write_config(db, database={"dsn": UNREACHABLE_DSN})
        assert_one_line_error(cli("-c", path, "migrate"), ExitCode.DATABASE_UNAVAILABLE, "cannot connect")

    def test_environment_dsn_is_used(self, config: Path) -> None:
        # The file's DSN is fine; the environment's wins and is unreachable.
        assert_one_line_error(cli("-c", config, "workspace", "create", "--id", "w", env={DSN_ENV: UNREACHABLE_DSN}),
                              ExitCode.DATABASE_UNAVAILABLE, "cannot connect")

    def test_unmigrated_database(self, empty_db: Database, write_config: WriteConfig) -> None:
        path = write_config(empty_db)
        assert_one_line_error(cli("-c", path, "workspace", "create", "--id", "w"), ExitCode.SCHEMA_OUTDATED,
                              "migrate")


class TestMigrate:
    def test_migrate_then_again(self, empty_db: Database, write_config: WriteConfig) -> None:
        path = write_config(empty_db)
        versions = [m.version for m in store.migrations()]
        assert ok(cli("-c", path, "migrate")).strip() == f"migrated: applied {len(versions)} migration(s) {versions}"
        assert "schema up to date" in ok(cli("-c", path, "migrate"))
        assert [v for (v,) in empty_db.query("SELECT version FROM schema_migrations ORDER BY 1")] == versions

    def test_migrate_up_to_a_version_then_the_rest(self, empty_db: Database, write_config: WriteConfig) -> None:
        path = write_config(empty_db)
        versions = [m.version for m in store.migrations()]
        first, rest = [v for v in versions if v <= 25], [v for v in versions if v > 25]
        assert ok(cli("-c", path, "migrate", "--up-to", "25")).strip() == \
            f"migrated: applied {len(first)} migration(s) {first}"
        assert ok(cli("-c", path, "migrate")).strip() == f"migrated: applied {len(rest)} migration(s) {rest}"
        usage_error(cli("-c", path, "migrate", "--up-to", "0"), "--up-to")

    def test_two_migrates_at_once(self, empty_db: Database, write_config: WriteConfig) -> None:
        path = write_config(empty_db)
        environ = {k: v for k, v in os.environ.items() if k != DSN_ENV}
        command = [sys.executable, "-m", "dispatcher.cli", "-c", str(path), "migrate"]
        procs = [subprocess.Popen(command, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        outputs = [proc.communicate(timeout=90) for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outputs
        assert all("Traceback" not in err for _, err in outputs)
        versions = [m.version for m in store.migrations()]
        assert [v for (v,) in empty_db.query("SELECT version FROM schema_migrations ORDER BY 1")] == versions


# ---------------------------------------------------------------- workspaces and endpoints


def workspace_row(db: Database, workspace_id: str) -> tuple[Any, ...] | None:
    rows = db.query("SELECT secret, flags FROM workspaces WHERE id = %s", (workspace_id,))
    return rows[0] if rows else None


class TestWorkspace:
    def test_create_with_flag(self, db: Database, config: Path) -> None:
        result = cli("-c", config, "workspace", "create", "--id", "W", "--flag", "webhook_outbox=on")
        created, shown = ok(result).splitlines()
        assert created == "workspace W created"
        row = workspace_row(db, "W")
        assert row is not None
        secret, flags = row
        assert flags == {"webhook_outbox": True}
        assert secret.startswith("whsec_") and len(secret_key(secret)) >= 24  # a valid, random key
        # The secret it made is shown, once, and it says so.
        assert shown == secret and "shown this once" in result.stderr
        assert ok(cli("-c", config, "workspace", "create", "--id", "W")).strip() == "workspace W updated"

    def test_generated_secrets_differ(self, db: Database, config: Path) -> None:
        ok(cli("-c", config, "workspace", "create", "--id", "a"))
        ok(cli("-c", config, "workspace", "create", "--id", "b"))
        assert workspace_row(db, "a") != workspace_row(db, "b")

    def test_given_secret_and_flag_update(self, db: Database, config: Path) -> None:
        ok(cli("-c", config, "workspace", "create", "--id", "W", "--secret", "s3cret-of-at-least-24-bytes",
               "--flag", "webhook_outbox=on"))
        out = ok(cli("-c", config, "workspace", "create", "--id", "W", "--flag", "webhook_outbox=off"))
        assert out.strip() == "workspace W updated"
        assert workspace_row(db, "W") == ("s3cret-of-at-least-24-bytes", {"webhook_outbox": False})


    def test_secret_from_stdin_or_a_file_stays_out_of_the_process_list(self, db: Database, config: Path,
                                                                          tmp_path: Path) -> None:
        # --secret puts the secret in every `ps` listing; stdin and a file do not.
        environ = {k: v for k, v in os.environ.items() if k != DSN_ENV}
        piped = subprocess.run([sys.executable, "-m", "dispatcher.cli", "-c", str(config), "workspace", "create",
                                "--id", "P", "--secret-stdin"], input="from-stdin-secret-24-bytes-long\n", cwd=REPO,
                               env=environ, capture_output=True, text=True, timeout=90)
        ok(piped)
        assert workspace_row(db, "P") == ("from-stdin-secret-24-bytes-long", {})
        secret_file = tmp_path / "secret"
        secret_file.write_text("from-file-secret-24-bytes-long\n")
        ok(cli("-c", config, "workspace", "create", "--id", "F", "--secret-file", secret_file))
        assert workspace_row(db, "F") == ("from-file-secret-24-bytes-long", {})
        usage_error(cli("-c", config, "workspace", "create", "--id", "X", "--secret", "a", "--secret-file",
                        secret_file), "not allowed with")
        assert_one_line_error(cli("-c", config, "workspace", "create", "--id", "X", "--secret-file",
                                  tmp_path / "missing"), ExitCode.USAGE, "cannot read the secret file")
        empty = tmp_path / "empty"
        empty.write_text("\n")
        assert_one_line_error(cli("-c", config, "workspace", "create", "--id", "X", "--secret-file", empty),
                              ExitCode.USAGE, "secret is empty")
        assert workspace_row(db, "X") is None
        help_text = ok(cli("-c", config, "workspace", "create", "--help"))
        assert "--secret-stdin" in help_text and "--secret-file" in help_text and "ps" in help_text


class TestWorkspaceContacts:
    """``workspace set``: the owner email and notify webhook URL of breaker notices (issue 12 item 4)."""

    def set(self, config: Path, *extra: str, workspace: str = "W") -> subprocess.CompletedProcess[str]:
        return cli("-c", config, "workspace", "set", "--id", workspace, *extra)

    def contacts(self, db: Database) -> list[tuple[Any, ...]]:
        return db.query("SELECT owner_contact, notify_webhook_url FROM workspaces WHERE id = 'W'")

    def test_set_change_and_clear(self, db: Database, config: Path) -> None:
        ok(cli("-c", config, "workspace", "create", "--id", "W"))
        out = ok(self.set(config, "--owner", "team@example.com", "--notify-url", "http://127.0.0.1:9/ops"))
        assert "team@example.com" in out and "http://127.0.0.1:9/ops" in out
        assert self.contacts(db) == [("team@example.com", "http://127.0.0.1:9/ops")]
        ok(self.set(config, "--owner", "other@example.com"))  # the URL stays
        assert self.contacts(db) == [("other@example.com", "http://127.0.0.1:9/ops")]
        ok(self.set(config, "--owner", "", "--notify-url", ""))
        assert self.contacts(db) == [(None, None)]

    def test_bad_input_changes_nothing(self, db: Database, config: Path, write_config: WriteConfig) -> None:
        ok(cli("-c", config, "workspace", "create", "--id", "W"))
        ok(self.set(config, "--owner", "team@example.com"))
        usage_error(self.set(config, "--owner", "team@localhost"), "--owner")
        assert_one_line_error(self.set(config), ExitCode.USAGE, "--owner and/or --notify-url")
        region_like = write_config(db, http={"require_https": True, "allow_private_networks": False})
        for url, reason in [("http://hooks.example.com/x", "https is required"),
                            ("https://169.254.169.254/latest", "address not allowed")]:
            assert_one_line_error(self.set(region_like, "--notify-url", url), ExitCode.USAGE,
                                  "notify URL refused", reason)
        assert_one_line_error(self.set(config, "--owner", "a@example.com", workspace="nope"), ExitCode.FAILURE,
                              "workspace 'nope' does not exist")
        assert self.contacts(db) == [("team@example.com", None)]


class TestEndpoint:
    def add(self, config: Path, *extra: str, url: str = "http://127.0.0.1:9/x",
            workspace: str = "W") -> subprocess.CompletedProcess[str]:
        return cli("-c", config, "endpoint", "add", "--workspace", workspace, "--url", url, *extra)

    @pytest.fixture
    def workspace(self, config: Path) -> None:
        ok(cli("-c", config, "workspace", "create", "--id", "W", "--flag", "webhook_outbox=on"))

    @staticmethod
    def added(result: subprocess.CompletedProcess[str]) -> int:
        """The id `endpoint add` printed (its first line; the second is the endpoint's secret)."""
        return int(ok(result).splitlines()[0])

    def test_add_prints_the_id_and_stores_the_types(self, db: Database, config: Path, workspace: None) -> None:
        endpoint_id = self.added(self.add(config, "--events", "job.created,job.completed"))
        assert db.query("SELECT workspace_id, url, event_types, active FROM webhook_endpoints WHERE id = %s",
                        (endpoint_id,)) == [("W", "http://127.0.0.1:9/x", ["job.created", "job.completed"], True)]

    def test_add_gives_the_endpoint_its_own_secret_shown_once(self, db: Database, config: Path,
                                                             workspace: None) -> None:
        result = self.add(config)
        lines = ok(result).splitlines()
        assert len(lines) == 2, lines
        endpoint_id, secret = int(lines[0]), lines[1]
        assert secret.startswith("whsec_") and len(secret_key(secret)) >= 24
        assert "shown this once" in result.stderr and secret not in result.stderr
        other = ok(self.add(config, url="http://127.0.0.1:9/y")).splitlines()[1]
        assert other != secret, "each endpoint a secret of its own"
        # Deliveries sign with it alone, never with the workspace's (dispatcher_signing_secrets, as the claim).
        signing = db.query("SELECT dispatcher_signing_secrets(e.secret, e.previous_secret, e.secret_rotated_at, "
                           "w.secret, w.previous_secret, w.secret_rotated_at, 86400) FROM webhook_endpoints e "
                           "JOIN workspaces w ON w.id = e.workspace_id WHERE e.id = %s", (endpoint_id,))
        assert signing == [([secret, None],)]
        shown = ok(cli("-c", config, "endpoint", "show", str(endpoint_id)))
        assert secret not in shown and '"secret": "endpoint"' in shown

    def test_no_events_means_all(self, db: Database, config: Path, workspace: None) -> None:
        endpoint_id = self.added(self.add(config))
        assert db.query("SELECT event_types FROM webhook_endpoints WHERE id = %s", (endpoint_id,)) == [([],)]

    def test_max_per_second_is_stored_and_defaults_to_none(self, db: Database, config: Path,
                                                           workspace: None) -> None:
        limited = self.added(self.add(config, "--max-per-second", "2.5"))
        free = self.added(self.add(config, url="http://127.0.0.1:9/y"))
        assert db.query("SELECT id, max_per_second FROM webhook_endpoints ORDER BY id") == [(limited, 2.5),
                                                                                          (free, None)]

    @pytest.mark.parametrize("value", ["0", "-1", "fast", "inf", "nan"])
    def test_bad_max_per_second_is_a_usage_error(self, db: Database, config: Path, workspace: None,
                                                 value: str) -> None:
        usage_error(self.add(config, "--max-per-second", value), "--max-per-second")
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]

    def test_owner_is_stored_and_checked(self, db: Database, config: Path, workspace: None) -> None:
        owned = self.added(self.add(config, "--owner", "owner@example.com"))
        free = self.added(self.add(config, url="http://127.0.0.1:9/y"))
        assert db.query("SELECT id, owner_contact FROM webhook_endpoints ORDER BY id") == [
            (owned, "owner@example.com"), (free, None)]
        usage_error(self.add(config, "--owner", "owner@example.com\nBcc: x@evil.example"), "--owner")
        usage_error(self.add(config, "--owner", "nobody"), "--owner", "not an email address")
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(2,)]

    def test_unknown_workspace(self, db: Database, config: Path) -> None:
        assert_one_line_error(self.add(config, workspace="nope"), ExitCode.FAILURE, "workspace 'nope' does not exist")
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]

    def test_eleventh_endpoint(self, db: Database, config: Path, workspace: None) -> None:
        for _ in range(10):
            ok(self.add(config))
        assert_one_line_error(self.add(config), ExitCode.FAILURE, "10 active endpoints")

    @pytest.mark.parametrize(("url", "names"), [
        ("http://hooks.example.com/x", ("https is required",)),
        # Registration errors reach customers: a generic reason, never the internal address or its kind.
        ("https://127.0.0.1/x", ("address not allowed",)),
        ("https://10.1.2.3/x", ("address not allowed",)),
        ("https://169.254.169.254/latest/meta-data", ("address not allowed",)),
        ("ftp://hooks.example.com/x", ("scheme",)),
    ])
    def test_region_settings_refuse_unsafe_urls(self, db: Database, write_config: WriteConfig, url: str,
                                                names: tuple[str, ...]) -> None:
        region_like = write_config(db, http={"require_https": True, "allow_private_networks": False})
        ok(cli("-c", region_like, "workspace", "create", "--id", "W"))
        result = self.add(region_like, url=url)
        assert_one_line_error(result, ExitCode.USAGE, "endpoint URL refused", *names)
        assert not any(word in result.stderr for word in ("loopback", "private", "link-local", "10.1.2.3"))
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]

    def test_region_settings_accept_a_public_https_url(self, db: Database, write_config: WriteConfig) -> None:
        region_like = write_config(db, http={"require_https": True, "allow_private_networks": False})
        ok(cli("-c", region_like, "workspace", "create", "--id", "W"))
        # A literal public address: nothing to resolve, so no network is needed.
        assert self.added(self.add(region_like, url="https://93.184.215.14/hook")) > 0

    @pytest.mark.parametrize("url", ["http://hooks.example.com/x", "https://127.0.0.1:8443/x", "http://127.0.0.1:9/x"])
    def test_the_shipped_region_config_refuses_them_too(self, db: Database, url: str) -> None:
        region = REPO / "config" / "region.yaml"
        env = {DSN_ENV: db.dsn}
        ok(cli("-c", region, "workspace", "create", "--id", "W", env=env))
        assert_one_line_error(cli("-c", region, "endpoint", "add", "--workspace", "W", "--url", url, env=env),
                              ExitCode.USAGE, "endpoint URL refused")
        assert db.query("SELECT count(*) FROM webhook_endpoints") == [(0,)]

    def test_the_shipped_local_config_accepts_loopback_http(self, db: Database) -> None:
        local = REPO / "config" / "local.yaml"
        env = {DSN_ENV: db.dsn}
        ok(cli("-c", local, "workspace", "create", "--id", "W", env=env))
        endpoint_id = self.added(cli("-c", local, "endpoint", "add", "--workspace", "W", "--url",
                                     "http://127.0.0.1:9/x", env=env))
        assert db.query("SELECT url FROM webhook_endpoints WHERE id = %s", (endpoint_id,)) == [("http://127.0.0.1:9/x",)]


# ---------------------------------------------------------------- the demo is a dev tool, not a product verb


def test_the_product_cli_has_no_demo_verb(tmp_path: Path) -> None:
    result = run([sys.executable, "-m", "dispatcher.cli", "-c", str(REPO / "config" / "local.yaml"), "demo"],
                 cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == ExitCode.USAGE and "invalid choice: 'demo'" in result.stderr


def test_the_demo_entry_point_rejects_a_bad_config(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run([str(REPO / "bin" / "dispatcher-demo"), "-c", str(missing)], cwd=tmp_path,
                 env={"PYTHONPATH": str(REPO)})
    assert_one_line_error(result, ExitCode.CONFIG, "nope.yaml")


def test_the_demo_gives_each_endpoint_its_own_secret(db: Database) -> None:
    from dispatcher_devtools import demo
    from dispatcher_devtools.receiver import ReceiverProcess

    secrets = demo.endpoint_secrets()
    conn = store.connect(db.dsn)
    try:
        with ReceiverProcess(secrets=list(secrets.values())) as receiver:
            ids = demo.seed(conn, receiver, secrets)
    finally:
        conn.close()
    stored = dict(db.query("SELECT id, secret FROM webhook_endpoints"))
    assert {name: stored[ids[name]] for name in demo.ENDPOINTS} == secrets
    assert len(set(secrets.values())) == len(demo.ENDPOINTS)


@pytest.mark.parametrize(("option", "value"), [("--events", "-5"), ("--events", "0"), ("--events", "many"),
                                               ("--rate", "0"), ("--rate", "-1"), ("--rate", "nan")])
def test_the_demo_refuses_a_count_or_rate_it_could_never_finish(tmp_path: Path, option: str, value: str) -> None:
    # --events -5 or --rate 0 used to run forever, waiting for events that never come.
    result = run([str(REPO / "bin" / "dispatcher-demo"), "-c", str(REPO / "config" / "local.yaml"), option, value],
                 cwd=tmp_path, env={"PYTHONPATH": str(REPO)})
    usage_error(result, option, value)


def test_a_demo_rerun_starts_from_a_clean_demo_workspace(db: Database, write_config: WriteConfig) -> None:
    # Each run deleted the last run's endpoints and left their pending rows: 12,665 after four runs.
    from dispatcher.config import load_config
    from dispatcher.producer import WebhookSender
    from dispatcher_devtools import demo
    from dispatcher_devtools.receiver import ReceiverProcess

    sender = WebhookSender(load_config(write_config(db)))
    conn = store.connect(db.dsn)
    try:
        with ReceiverProcess() as receiver:
            first = demo.seed(conn, receiver, demo.endpoint_secrets())
            demo._produce(sender, conn, 3)
            second = demo.seed(conn, receiver, demo.endpoint_secrets())
    finally:
        conn.close()
    assert db.query("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'") == [(0,)]
    assert db.query("SELECT status, last_error, count(*) FROM webhook_deliveries GROUP BY 1, 2") == [
        ("failed", "endpoint deleted", 3 * len(first))]
    assert sorted(row[0] for row in db.query("SELECT id FROM webhook_endpoints")) == sorted(second.values())
