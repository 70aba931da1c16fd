"""dispatcher.config: loading, validation, the shipped configs and the generated docs.

Pure: no database. Files are written to tmp_path so that the same path the CLI
takes (``load_config``) is the one under test.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import (
    DSN_ENV,
    EMBEDDED,
    Config,
    ConfigError,
    config_from_mapping,
    describe_settings,
    load_config,
    settings_markdown,
)
from dispatcher.rules.retry import RetryPolicy

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "config" / "region.yaml", REPO / "config" / "local.yaml"]
DOC = REPO / "docs" / "configuration.md"
DOC_START = "<!-- BEGIN GENERATED: python -m dispatcher.config -->"
DOC_END = "<!-- END GENERATED -->"


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    return load_config(write_yaml(tmp_path, text), env={} if env is None else env)


def load_raw(raw: dict[str, Any], env: dict[str, str] | None = None) -> Config:
    return config_from_mapping(raw, env={} if env is None else env)


# ---------------------------------------------------------------- errors

# (id, YAML text, text the one-line message must contain: the key it names)
BAD_CONFIGS: list[tuple[str, str, str]] = [
    ("bad-yaml", "http: [unclosed\n", "not valid YAML"),
    ("bad-yaml-indent", "http:\n  timeout: 10s\n bad: 1\n", "not valid YAML"),
    ("top-level-list", "- region\n", "top level"),
    ("top-level-scalar", "just words\n", "top level"),
    ("unknown-top-level", "regoin: eu-west-1\n", "unknown key regoin"),
    ("unknown-nested", "http:\n  timout: 10s\n", "unknown key http.timout"),
    ("unknown-non-string-key", "1: x\nbogus: 2\n", "unknown key"),
    ("section-not-mapping", "http: 5\n", "http"),
    ("duration-bare-number", "http:\n  timeout: 10\n", "http.timeout"),
    ("duration-bad-unit", "http:\n  timeout: 10x\n", "http.timeout"),
    ("duration-negative", "http:\n  timeout: -5s\n", "http.timeout"),
    ("duration-zero", "workers:\n  poll_interval: 0s\n", "workers.poll_interval"),
    ("duration-words", "breaker:\n  open_for: 5 minutes\n", "breaker.open_for"),
    ("duration-infinite", f"retry:\n  ceiling: {'9' * 400}d\n", "retry.ceiling"),
    ("int-is-text", "workers:\n  claim_batch: many\n", "workers.claim_batch"),
    ("int-is-float", "workers:\n  claim_batch: 2.5\n", "workers.claim_batch"),
    ("int-is-bool", "workers:\n  claim_batch: true\n", "workers.claim_batch"),
    ("int-zero", "workers:\n  per_endpoint_concurrency: 0\n", "workers.per_endpoint_concurrency"),
    ("processes-zero", "workers:\n  processes: 0\n", "workers.processes"),
    ("processes-word", "workers:\n  processes: all\n", "workers.processes"),
    ("bool-is-text", "http:\n  require_https: sometimes\n", "http.require_https"),
    ("region-not-text", "region: 42\n", "region"),
    ("region-uppercase", "region: EU_WEST\n", "region"),
    ("dsn-empty", "database:\n  dsn: ''\n", "database.dsn"),
    ("port-too-big", "statsd:\n  port: 70000\n", "statsd.port"),
    ("port-zero", "statsd:\n  port: 0\n", "statsd.port"),
    ("port-is-text", "statsd:\n  port: '8125'\n", "statsd.port"),
    ("listen-bad-port", "api:\n  listen: 127.0.0.1:99999\n", "api.listen"),
    ("listen-no-port", "api:\n  listen: localhost\n", "api.listen"),
    ("lease-equal-2x-timeout", "http:\n  timeout: 10s\nworkers:\n  lease: 20s\n", "workers.lease"),
    ("lease-below-timeout", "http:\n  timeout: 30s\n", "workers.lease"),
    ("max-interval-below-base", "retry:\n  base: 1m\n  max_interval: 30s\n", "retry.max_interval"),
    ("jitter-one", "retry:\n  jitter: 1\n", "retry.jitter"),
    ("policy-unknown-key", "retry:\n  policies:\n    technician.location: {max_attmpts: 1}\n", "max_attmpts"),
    ("policy-bad-value", "retry:\n  policies:\n    job.created: {max_attempts: 0}\n", "retry.policies"),
    ("policy-bad-duration", "retry:\n  policies:\n    job.created: {base: 10}\n", "retry.policies"),
    ("policies-not-mapping", "retry:\n  policies: [technician.location]\n", "retry.policies"),
    ("bad-cidr", "http:\n  allow_networks: [10.0.0.0/33]\n", "http.allow_networks"),
    ("cidr-not-list", "http:\n  allow_networks: 10.0.0.0/8\n", "http.allow_networks"),
    ("bad-choice", "http:\n  client: curl\n", "http.client"),
    ("read-dsn-not-a-dsn", "api:\n  read_dsn: host=standby port\n", "api.read_dsn"),
    ("read-dsn-not-text", "api:\n  read_dsn: 5432\n", "api.read_dsn"),
]


def test_a_multi_host_failover_dsn_and_a_read_dsn_are_taken_as_written(tmp_path: Path) -> None:
    failover = "host=10.0.0.1,10.0.0.2 port=5432,5433 dbname=app target_session_attrs=read-write"
    config = load_text(tmp_path, f"database:\n  dsn: {failover}\napi:\n  read_dsn: host=10.0.0.2 dbname=app\n")
    assert config.database.dsn == failover
    assert config.api.read_dsn == "host=10.0.0.2 dbname=app"
    assert load_text(tmp_path, "api:\n  read_dsn: ''\n").api.read_dsn == "" == load_raw({}).api.read_dsn


class TestErrors:
    @pytest.mark.parametrize(("text", "names"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
    def test_bad_config_names_the_problem_in_one_line(self, tmp_path: Path, text: str, names: str) -> None:
        with pytest.raises(ConfigError) as caught:
            load_text(tmp_path, text)
        message = str(caught.value)
        assert names in message
        assert "\n" not in message

    def test_unknown_key_message_is_exactly_the_dotted_name(self) -> None:
        with pytest.raises(ConfigError, match=r"^unknown key producer\.shadow_write$"):
            load_raw({"producer": {"shadow_write": True}})

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="cannot read config file"):
            load_config(tmp_path / "absent.yaml", env={})

    def test_file_that_is_not_utf8(self, tmp_path: Path) -> None:
        path = tmp_path / "latin1.yaml"
        path.write_bytes("region: caf\xe9\n".encode("latin-1"))
        with pytest.raises(ConfigError, match="not UTF-8"):
            load_config(path, env={})

    def test_config_error_is_a_value_error(self) -> None:
        # Callers that only know ValueError still catch it.
        assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------- values


class TestDurations:
    # The syntax and its refusals: tests/unit/test_durations.py.

    def test_a_compressed_schedule_loads(self) -> None:
        # Tests compress the 24 h schedule into seconds; 100 ms must be accepted.
        config = load_raw({"retry": {"base": "100ms", "max_interval": "250ms", "ceiling": "2s"},
                           "workers": {"poll_interval": "100ms"}})
        policy = config.retry.retry_policies().default
        assert (policy.base, policy.max_interval, policy.ceiling) == pytest.approx((0.1, 0.25, 2.0))
        assert config.workers.poll_interval == pytest.approx(0.1)


class TestValues:
    def test_defaults_are_the_documented_decisions(self) -> None:
        config = load_raw({})
        assert config.workers.claim_batch == 200
        assert config.workers.per_endpoint_concurrency == 4
        assert config.http.timeout == 10.0
        assert config.retry.ceiling == 86400.0
        assert (config.breaker.failure_threshold, config.breaker.open_for) == (20, 300.0)
        assert config.dry_run is False
        assert config.producer.shadow_writes is False
        assert config.producer.legacy_timeout == 5.0
        assert config.database.dsn == EMBEDDED

    def test_empty_file_is_all_defaults(self, tmp_path: Path) -> None:
        assert load_text(tmp_path, "# nothing set\n") == load_raw({})

    def test_empty_section_is_its_defaults(self, tmp_path: Path) -> None:
        assert load_text(tmp_path, "http:\n").http == load_raw({}).http

    def test_processes_auto_is_one_per_core(self) -> None:
        assert load_raw({"workers": {"processes": "auto"}}).workers.processes == (os.cpu_count() or 1)
        assert load_raw({"workers": {"processes": 3}}).workers.processes == 3

    def test_lease_just_above_twice_the_timeout_is_accepted(self) -> None:
        config = load_raw({"http": {"timeout": "10s"}, "workers": {"lease": "21s"}})
        assert config.workers.lease == 21.0

    @pytest.mark.parametrize("host", ["smtp.example.com", "10.0.0.25", "::ffff:10.0.0.25", "0.0.0.0"])
    def test_plain_smtp_to_a_remote_relay_is_refused(self, host: str) -> None:
        """AUTH over a plain connection would send the relay's password in clear across the network."""
        with pytest.raises(ConfigError, match="^notifier.smtp_security: none is for a relay on loopback only"):
            load_raw({"notifier": {"kind": "smtp", "smtp_host": host, "smtp_security": "none"}})

    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost", "LocalHost."])
    def test_plain_smtp_to_a_loopback_relay_is_accepted(self, host: str) -> None:
        config = load_raw({"notifier": {"kind": "smtp", "smtp_host": host, "smtp_security": "none"}})
        assert (config.notifier.smtp_host, config.notifier.smtp_security) == (host, "none")
        remote = load_raw({"notifier": {"kind": "smtp", "smtp_host": "smtp.example.com", "smtp_security": "tls"}})
        assert remote.notifier.smtp_security == "tls"

    def test_networks_and_listen_are_parsed(self) -> None:
        config = load_raw({"http": {"allow_networks": ["127.0.0.0/8", "10.20.0.0/16"]},
                           "api": {"listen": "[::1]:9000"}})
        assert [str(net) for net in config.http.allow_networks] == ["127.0.0.0/8", "10.20.0.0/16"]
        assert config.api.listen == ("::1", 9000)

    def test_source_is_the_file(self, tmp_path: Path) -> None:
        path = write_yaml(tmp_path, "region: test\n")
        assert load_config(path, env={}).source == str(path)


class TestEnvironment:
    def test_dsn_env_overrides_the_file(self, tmp_path: Path) -> None:
        config = load_text(tmp_path, "database:\n  dsn: host=a\n", env={DSN_ENV: "host=b dbname=c"})
        assert config.database.dsn == "host=b dbname=c"

    def test_dsn_env_overrides_embedded(self, tmp_path: Path) -> None:
        assert load_text(tmp_path, "region: x\n", env={DSN_ENV: "host=b"}).database.dsn == "host=b"

    def test_empty_env_does_not_override(self, tmp_path: Path) -> None:
        assert load_text(tmp_path, "database:\n  dsn: host=a\n", env={DSN_ENV: ""}).database.dsn == "host=a"

    def test_process_environment_is_the_default(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(DSN_ENV, "host=from-env")
        assert load_config(write_yaml(tmp_path, "region: x\n")).database.dsn == "host=from-env"

    def test_public_load_config_is_the_same_function(self) -> None:
        import dispatcher

        assert dispatcher.load_config is load_config


class TestFrozen:
    def test_top_level_cannot_be_assigned(self) -> None:
        config = load_raw({})
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.dry_run = True  # type: ignore[misc]

    def test_sections_cannot_be_assigned(self) -> None:
        config = load_raw({})
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.http.timeout = 1.0  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.retry.policies = ()  # type: ignore[misc]

    def test_collections_are_immutable(self) -> None:
        config = load_raw({"retry": {"policies": {"technician.location": {"max_attempts": 1}}},
                           "http": {"allow_networks": ["127.0.0.0/8"]}})
        assert isinstance(config.retry.policies, tuple)
        assert isinstance(config.http.allow_networks, tuple)
        with pytest.raises(TypeError):
            config.retry.retry_policies().by_event_type["job.created"] = RetryPolicy()  # type: ignore[index]

    def test_hashable_and_equal_by_value(self) -> None:
        assert load_raw({"region": "a"}) == load_raw({"region": "a"})
        assert hash(load_raw({"region": "a"})) == hash(load_raw({"region": "a"}))
        assert load_raw({"region": "a"}) != load_raw({"region": "b"})


class TestRetryPolicies:
    def test_location_updates_get_one_attempt(self) -> None:
        config = load_raw({"retry": {"policies": {"technician.location": {"max_attempts": 1}}}})
        policies = config.retry.retry_policies()
        assert policies.for_event_type("technician.location").max_attempts == 1
        assert policies.for_event_type("job.created").max_attempts is None
        assert policies.for_event_type("job.created") == policies.default

    def test_override_keeps_the_rest_of_the_default(self) -> None:
        config = load_raw({"retry": {"base": "5s", "policies": {"job.created": {"ceiling": "1h"}}}})
        policy = config.retry.retry_policies().for_event_type("job.created")
        assert (policy.base, policy.ceiling, policy.max_interval) == (5.0, 3600.0, 7200.0)


# ---------------------------------------------------------------- shipped configs


class TestShippedConfigs:
    @pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
    def test_loads(self, path: Path) -> None:
        config = load_config(path, env={})
        assert config.retry.retry_policies().for_event_type("technician.location").max_attempts == 1
        assert config.workers.claim_batch == 200
        assert config.http.timeout == 10.0

    def test_region_is_production_like(self) -> None:
        config = load_config(REPO / "config" / "region.yaml", env={})
        assert config.database.dsn != EMBEDDED
        assert config.http.require_https is True
        assert config.http.allow_private_networks is False
        assert config.http.allow_networks == ()
        assert config.dry_run is False

    def test_local_is_embedded_and_allows_loopback_http(self) -> None:
        config = load_config(REPO / "config" / "local.yaml", env={})
        assert config.database.dsn == EMBEDDED
        assert config.http.require_https is False
        assert config.http.allow_private_networks is True

    @pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
    def test_every_key_carries_a_comment(self, path: Path) -> None:
        # Keys are found by the YAML parser itself (with their line numbers),
        # so nested, dotted and flow-style keys are all covered.
        lines = path.read_text(encoding="utf-8").splitlines()
        keys = list(_key_lines(yaml.compose(path.read_text(encoding="utf-8"))))
        uncommented = [f"{path.name}:{line + 1}: {key}" for key, line in keys if not _comment_of(lines[line])]
        assert not uncommented, "keys without a comment:\n" + "\n".join(uncommented)

    @pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
    def test_the_key_finder_sees_nested_and_flow_keys(self, path: Path) -> None:
        keys = {key for key, _ in _key_lines(yaml.compose(path.read_text(encoding="utf-8")))}
        assert {"region", "database", "dsn", "http", "timeout", "technician.location", "max_attempts"} <= keys

    def test_comment_finder(self) -> None:
        assert _comment_of("  port: 8125  # statsd") == "statsd"
        assert _comment_of('  dsn: "host=a#b"') == ""
        assert _comment_of('  dsn: "host=a #b"') == ""
        assert _comment_of("  dsn: 'x # y'  # real") == "real"
        assert _comment_of("  port: 8125 #") == ""
        assert _comment_of("  port: 8125") == ""


def _key_lines(node: yaml.Node | None) -> Iterator[tuple[str, int]]:
    """(key, 0-based line) of every mapping key in a composed YAML document."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield str(key.value), key.start_mark.line
            yield from _key_lines(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _key_lines(item)


def _comment_of(line: str) -> str:
    """The text of a line's YAML comment: a ``#`` outside quotes after whitespace."""
    quote: str | None = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[index + 1:].strip()
    return ""


# ---------------------------------------------------------------- docs


def _generated_block(text: str) -> str:
    assert DOC_START in text and DOC_END in text, "docs/configuration.md lost its generated-block markers"
    return text.split(DOC_START, 1)[1].split(DOC_END, 1)[0].strip()


class TestDocs:
    def test_doc_matches_the_code(self) -> None:
        assert _generated_block(DOC.read_text(encoding="utf-8")) == settings_markdown().strip(), (
            "docs/configuration.md is stale: paste the output of `python -m dispatcher.config` between its markers"
        )

    def test_module_prints_the_generated_block(self) -> None:
        out = subprocess.run([sys.executable, "-m", "dispatcher.config"], cwd=REPO, capture_output=True, text=True,
                             check=True, timeout=60).stdout
        assert out == settings_markdown()

    def test_every_setting_is_documented_once(self) -> None:
        names = [name for name, _, _ in describe_settings()]
        assert len(names) == len(set(names))
        assert all(doc.strip() for _, _, doc in describe_settings())
        for required in ["region", "database.dsn", "workers.processes", "workers.claim_batch",
                         "workers.per_endpoint_concurrency", "workers.poll_interval", "workers.lease", "http.timeout",
                         "http.require_https", "http.allow_private_networks", "retry.base", "retry.max_interval",
                         "retry.ceiling", "retry.policies", "breaker.failure_threshold", "breaker.open_for",
                         "statsd.host", "statsd.port", "statsd.prefix", "dry_run", "producer.shadow_writes",
                         "producer.legacy_timeout"]:
            assert required in names

    def test_documented_defaults_are_valid_yaml_values(self) -> None:
        # Every default, written as the doc shows it, loads back to the default:
        # the table is something an operator can copy into a file.
        raw: dict[str, Any] = {}
        for name, shown, _ in describe_settings():
            section, _, key = name.rpartition(".")
            target = raw.setdefault(section, {}) if section else raw
            target[key] = yaml.safe_load(f"v: {shown}")["v"]
        assert load_raw(raw) == load_raw({})

    def test_defaults_are_machine_independent(self) -> None:
        shown = dict((name, default) for name, default, _ in describe_settings())
        assert shown["workers.processes"] == "auto"
        assert shown["retry.ceiling"] == "24h"
        assert shown["workers.poll_interval"] == "500ms"


def test_a_multi_host_dsn_splits_into_one_dsn_per_server_in_order() -> None:
    from psycopg2.extensions import parse_dsn

    from dispatcher.store import single_host_dsns

    split = [parse_dsn(d) for d in single_host_dsns(
        "host=db-a,db-b port=5432,5433 dbname=app target_session_attrs=read-write")]
    assert split == [{"host": "db-a", "port": "5432", "dbname": "app", "target_session_attrs": "read-write"},
                     {"host": "db-b", "port": "5433", "dbname": "app", "target_session_attrs": "read-write"}]
    # One port for every host, and the URI form.
    assert [parse_dsn(d)["port"] for d in single_host_dsns("host=a,b port=6432")] == ["6432", "6432"]
    assert [(parse_dsn(d)["host"], parse_dsn(d)["port"]) for d in single_host_dsns(
        "postgresql://u@a:1,b:2/db")] == [("a", "1"), ("b", "2")]
    assert single_host_dsns("host=a dbname=app") == ["host=a dbname=app"]
