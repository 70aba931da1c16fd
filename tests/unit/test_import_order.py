"""Monkey-patching comes first in the green entry points, and never happens elsewhere.

Each check runs in a fresh interpreter (``PROBE`` below).  The probe installs
an import hook before importing its target, and records every module imported
from then on together with whether, at that moment, gevent had already patched
``socket``/``ssl``/``threading``/``select`` and psycogreen had made psycopg2
cooperative.

"Patching comes first" is then checked against a reference: a module that does
nothing but the two patch calls.  Whatever that reference imports before it is
fully patched is gevent's and psycogreen's own machinery; the entry point may
import nothing else while unpatched (besides the ``dispatcher`` package
and its sub-package, whose imports are checked separately to load no
network module).  A test also
runs a deliberately broken copy of the entry point, with an import moved above
the patch, to show that the check catches it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER_MAIN = REPO / "dispatcher" / "runtime" / "worker_main.py"
API_MAIN = REPO / "dispatcher" / "runtime" / "api_main.py"

# Modules whose unpatched import would give a green process blocking I/O.
NETWORK = {"socket", "_socket", "ssl", "_ssl", "select", "selectors", "threading", "asyncio",
           "http.client", "urllib3", "psycopg2", "geventhttpclient"}

PROBE = r'''
import sys
import warnings

# A MonkeyPatchWarning ("Monkey-patching ssl after ssl has already been
# imported ...") means something was imported too early: make it fatal.
warnings.filterwarnings("error", message=r"(?s).*[Mm]onkey-patch")

EVENTS = []


def _gevent_patched():
    monkey = sys.modules.get("gevent.monkey")
    check = getattr(monkey, "is_module_patched", None)
    if check is None:
        return False
    try:
        return all(check(name) for name in ("socket", "ssl", "threading", "select"))
    except Exception:  # gevent.monkey still initialising
        return False


def _psycopg_patched():
    extensions = sys.modules.get("psycopg2.extensions")
    get = getattr(extensions, "get_wait_callback", None)
    return get is not None and get() is not None


class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name not in sys.modules:
            EVENTS.append((name, _gevent_patched(), _psycopg_patched()))
        return None


PRELOADED = sorted(sys.modules)
sys.meta_path.insert(0, Recorder())
for target in sys.argv[1:]:
    if target.startswith("from:"):
        module, _, name = target[5:].partition(":")
        getattr(__import__(module, fromlist=[name]), name)
    else:
        __import__(target)
sys.meta_path.pop(0)

import json  # noqa: E402  (after the targets, so it is not mistaken for one of their imports)

checks = {"gevent_loaded": "gevent" in sys.modules, "psycogreen_loaded": "psycogreen" in sys.modules}
if "gevent" in sys.modules:
    import _thread
    import select
    import socket
    import ssl
    import threading

    import gevent.monkey
    import gevent.select
    import gevent.socket
    import gevent.ssl
    import gevent.thread

    checks.update(
        socket=socket.socket is gevent.socket.socket and socket.create_connection is gevent.socket.create_connection,
        ssl=ssl.SSLContext is gevent.ssl.SSLContext,
        threading=_thread.allocate_lock is gevent.thread.allocate_lock
        and threading._start_new_thread is gevent.thread.start_new_thread
        and threading.get_ident is gevent.thread.get_ident,
        select=select.select is gevent.select.select,
        patched=sorted(n for n in ("socket", "ssl", "threading", "select") if gevent.monkey.is_module_patched(n)),
    )
if "psycopg2.extensions" in sys.modules:
    import psycopg2.extensions

    callback = psycopg2.extensions.get_wait_callback()
    checks["psycopg_wait_callback"] = None if callback is None else f"{callback.__module__}.{callback.__name__}"
else:
    checks["psycopg_wait_callback"] = None
print(json.dumps({"preloaded": PRELOADED, "events": EVENTS, "checks": checks, "loaded": sorted(sys.modules)}))
'''

REFERENCE = """\
from gevent import monkey

monkey.patch_all()

from psycogreen.gevent import patch_psycopg  # noqa: E402

patch_psycopg()
"""


@dataclass(frozen=True)
class Probe:
    preloaded: frozenset[str]
    events: list[tuple[str, bool, bool]]
    checks: dict[str, Any]
    loaded: frozenset[str]

    def imported_unpatched(self) -> set[str]:
        """Modules (that exist) imported before both patches were in place."""
        return {name for name, gevent_done, psycopg_done in self.events
                if not (gevent_done and psycopg_done) and name in self.loaded}

    def newly_loaded(self) -> set[str]:
        return set(self.loaded - self.preloaded)


def probe(tmp_path: Path, *targets: str) -> Probe:
    script = tmp_path / "import_probe.py"
    script.write_text(PROBE, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    result = subprocess.run([sys.executable, str(script), *targets], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"importing {targets} failed:\n{result.stderr}"
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return Probe(frozenset(data["preloaded"]), [tuple(e) for e in data["events"]], data["checks"],
                 frozenset(data["loaded"]))


@pytest.fixture(scope="module")
def allowed_before_patching(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """What the two patch calls themselves import (gevent's and psycogreen's machinery)."""
    tmp_path = tmp_path_factory.mktemp("reference")
    (tmp_path / "patch_reference.py").write_text(REFERENCE, encoding="utf-8")
    reference = probe(tmp_path, "patch_reference")
    assert reference.checks["patched"] == ["select", "socket", "ssl", "threading"]
    return reference.imported_unpatched()


def harmless_import(tmp_path: Path, module: str) -> set[str]:
    """What importing ``module`` loads, checked to be nothing that matters."""
    result = probe(tmp_path, module)
    loaded = result.newly_loaded()
    assert not loaded & NETWORK, f"importing {module} loads {sorted(loaded & NETWORK)}"
    assert not result.checks["gevent_loaded"]
    return loaded


def parent_packages(tmp_path: Path, entry_point: str) -> set[str]:
    """What the green entry point may import before it has patched: its parent
    packages (Python imports them before the entry point's first line) and
    ``dispatcher.runtime.entry``, the one module that holds the patch call.  Both must
    load nothing that matters."""
    parents = entry_point.split(".")[:-1]
    loaded = harmless_import(tmp_path, ".".join(parents)) if parents else set()
    return loaded | harmless_import(tmp_path, "dispatcher.runtime.entry") | {"dispatcher.runtime.entry"}


def assert_patched_first(result: Probe, allowed: set[str], entry_point: str) -> None:
    early = result.imported_unpatched() - allowed - {entry_point}
    assert not early, f"{entry_point} imports {sorted(early)} before gevent and psycogreen have patched"
    assert result.checks["patched"] == ["select", "socket", "ssl", "threading"]
    assert result.checks["socket"] and result.checks["ssl"] and result.checks["threading"] and result.checks["select"]
    assert result.checks["psycopg_wait_callback"] == "psycogreen.gevent.gevent_wait_callback"


def with_first_statement(source: str, statement: str) -> str:
    """``source`` with ``statement`` inserted before its first statement (after the docstring)."""
    body = ast.parse(source).body
    first = body[1] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body[0]
    lines = source.splitlines(keepends=True)
    return "".join(lines[: first.lineno - 1]) + statement + "\n" + "".join(lines[first.lineno - 1:])


def without_psycopg_patch(source: str) -> str:
    """``source`` with its patch call replaced by gevent's patch alone (no psycogreen)."""
    broken, count = re.subn(r"^patch_or_exit\(.*\).*$", "from gevent import monkey  # noqa: E402\n\nmonkey.patch_all()",
                            source, flags=re.MULTILINE)
    assert count, "worker_main.py no longer calls patch_or_exit(): update this mutation"
    return broken


class TestWorkerEntryPoint:
    def test_patches_before_anything_else(self, tmp_path: Path, allowed_before_patching: set[str]) -> None:
        result = probe(tmp_path, "dispatcher.runtime.worker_main")
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher.runtime.worker_main")
        assert_patched_first(result, allowed, "dispatcher.runtime.worker_main")
        # ... and the worker really goes on to import the rest, all of it patched.
        assert {"dispatcher.config", "psycopg2", "yaml"} <= result.newly_loaded()

    def test_network_modules_seen_afterwards_are_gevent_versions(self, tmp_path: Path) -> None:
        result = probe(tmp_path, "dispatcher.runtime.worker_main", "socket", "ssl", "threading", "gevent.socket",
                       "gevent.ssl", "gevent.threading")
        assert result.checks["socket"] and result.checks["ssl"] and result.checks["threading"]

    def test_the_worker_module_can_start(self) -> None:
        # Importing is not running: the entry point's own argument parsing works too.
        result = subprocess.run([sys.executable, "-m", "dispatcher.runtime.worker_main", "--help"], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "--owner" in result.stdout

    @pytest.mark.parametrize("early_import", [
        "from dispatcher.config import load_config",
        "import argparse",
        "import urllib3",
    ], ids=["config", "argparse", "urllib3"])
    def test_the_check_catches_an_import_above_the_patch(
        self, tmp_path: Path, allowed_before_patching: set[str], early_import: str
    ) -> None:
        broken = with_first_statement(WORKER_MAIN.read_text(encoding="utf-8"), early_import)
        (tmp_path / "broken_worker_main.py").write_text(broken, encoding="utf-8")
        # Caught by the import record, or (urllib3 keeps references to ssl) by
        # gevent's own MonkeyPatchWarning, which the probe makes fatal.
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher.runtime.worker_main")
        with pytest.raises(AssertionError, match="before gevent and psycogreen have patched|MonkeyPatchWarning"):
            assert_patched_first(probe(tmp_path, "broken_worker_main"), allowed, "broken_worker_main")

    def test_the_check_catches_psycogreen_patching_after_other_imports(
        self, tmp_path: Path, allowed_before_patching: set[str]
    ) -> None:
        source = without_psycopg_patch(WORKER_MAIN.read_text(encoding="utf-8"))
        broken = source + "\nfrom psycogreen.gevent import patch_psycopg as _late  # noqa: E402\n\n_late()\n"
        (tmp_path / "late_worker_main.py").write_text(broken, encoding="utf-8")
        result = probe(tmp_path, "late_worker_main")
        assert result.checks["psycopg_wait_callback"] is not None  # patched, but too late
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher.runtime.worker_main")
        with pytest.raises(AssertionError, match="before gevent and psycogreen have patched"):
            assert_patched_first(result, allowed, "late_worker_main")

    def test_the_check_catches_a_missing_psycogreen_patch(self, tmp_path: Path,
                                                         allowed_before_patching: set[str]) -> None:
        broken = without_psycopg_patch(WORKER_MAIN.read_text(encoding="utf-8"))
        (tmp_path / "unpatched_worker_main.py").write_text(broken, encoding="utf-8")
        result = probe(tmp_path, "unpatched_worker_main")
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher.runtime.worker_main")
        with pytest.raises(AssertionError):
            assert_patched_first(result, allowed, "unpatched_worker_main")

    def test_a_monkey_patch_warning_fails_the_probe(self, tmp_path: Path) -> None:
        (tmp_path / "late_patch.py").write_text(
            "from ssl import SSLContext\n\nfrom gevent import monkey\n\nmonkey.patch_all()\n", encoding="utf-8")
        with pytest.raises(AssertionError, match="MonkeyPatchWarning"):
            probe(tmp_path, "late_patch")


class TestApiEntryPoint:
    def test_patches_before_anything_else(self, tmp_path: Path, allowed_before_patching: set[str]) -> None:
        if not API_MAIN.exists():
            pytest.skip("dispatcher/runtime/api_main.py does not exist yet (the API issue adds it)")
        result = probe(tmp_path, "dispatcher.runtime.api_main")
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher.runtime.api_main")
        assert_patched_first(result, allowed, "dispatcher.runtime.api_main")
        assert "dispatcher.api.app" in result.newly_loaded()


class TestProducersStayUnpatched:
    """Producers import the package into their own (threaded, blocking) processes."""

    @pytest.mark.parametrize("targets", [
        ["dispatcher"],
        ["from:dispatcher:WebhookSender"],
        ["from:dispatcher:load_config", "from:dispatcher:Event"],
        ["dispatcher.cli"],
    ], ids=["package", "WebhookSender", "load_config-and-Event", "cli"])
    def test_no_gevent(self, tmp_path: Path, targets: list[str]) -> None:
        result = probe(tmp_path, *targets)
        assert not result.checks["gevent_loaded"], targets
        assert not result.checks["psycogreen_loaded"], targets
        assert result.checks["psycopg_wait_callback"] is None
        assert not {name for name in result.loaded if name == "gevent" or name.startswith("gevent.")}

    def test_the_package_import_is_lazy(self, tmp_path: Path) -> None:
        result = probe(tmp_path, "dispatcher")
        assert result.newly_loaded() & {"dispatcher.producer", "dispatcher.config", "psycopg2", "yaml"} == set()

    def test_webhook_sender_is_the_producer_class(self, tmp_path: Path) -> None:
        result = probe(tmp_path, "from:dispatcher:WebhookSender")
        # urllib3 (and the transport) load on the first flag-off send, not on import.
        assert {"dispatcher.producer", "psycopg2"} <= result.newly_loaded()


class TestDevToolsPatchPreamble:
    """The dev tools outside the wheel (the mock receiver, ``tests/support/green.py``,
    ``benchmarks/bare_loop.py``) share one patch preamble, ``dispatcher_devtools.green``."""

    def test_the_preamble_patches_before_anything_else(self, tmp_path: Path,
                                                      allowed_before_patching: set[str]) -> None:
        result = probe(tmp_path, "dispatcher_devtools.green")
        allowed = allowed_before_patching | parent_packages(tmp_path, "dispatcher_devtools.green")
        assert_patched_first(result, allowed, "dispatcher_devtools.green")

    def test_the_receiver_package_loads_nothing_before_its_main_patches(self, tmp_path: Path) -> None:
        # python -m dispatcher_devtools.receiver imports the package before __main__ runs.
        loaded = parent_packages(tmp_path, "dispatcher_devtools.receiver.__main__")
        assert not {name for name in loaded if name.startswith("dispatcher_devtools.receiver.")}
