"""The e2e tests named in issue 23 wait on what they can observe, never a fixed sleep.

A test that sleeps and then asserts nothing happened passes without checking
anything on a slow machine; one that sleeps and then asserts something happened
fails under load.  These files wait with ``wait_until`` (and
``SessionActivity`` for "the loop ran N more times"), then assert the absence.
A sleep is allowed only as a receiver's behaviour (a slow answer), in a helper
named below.  The check reads the source: every call of ``time.sleep``,
``gevent.sleep``, ``asyncio.sleep`` or a ``sleep`` imported from one of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
WATCHED = (
    "e2e/test_supervisor.py",
    "e2e/test_engine.py",
    "e2e/test_breaker.py",
    "e2e/test_transport.py",
    "e2e/test_partition_migration.py",
    "e2e/faults/test_pgbouncer.py",
    "e2e/faults/test_hostile_clients.py",
    "e2e/faults/test_hostile_receivers.py",
    "e2e/faults/test_tenant_fairness.py",
)
# (file, function): receivers whose behaviour is to be slow.  Each must still sleep.
RECEIVER_BEHAVIOUR = {
    ("e2e/faults/test_hostile_receivers.py", "answer_late"),
}
SLEEPY_MODULES = ("time", "gevent", "asyncio")


def _sleep_names(tree: ast.Module) -> set[str]:
    """Local names bound to a module's ``sleep`` (``from time import sleep as nap``)."""
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module in SLEEPY_MODULES for alias in node.names if alias.name == "sleep"}


def _is_sleep(call: ast.Call, bare: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in bare
    return (isinstance(func, ast.Attribute) and func.attr == "sleep" and isinstance(func.value, ast.Name)
            and func.value.id in SLEEPY_MODULES)


def sleeps(source: str) -> list[tuple[int, str]]:
    """(line, innermost enclosing function or ``<module>``) of every sleep call in ``source``."""
    tree = ast.parse(source)
    bare = _sleep_names(tree)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Lambda):
                inner = "<lambda>"
            if isinstance(child, ast.Call) and _is_sleep(child, bare):
                found.append((child.lineno, function))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_the_checker_sees_every_spelling_of_a_sleep() -> None:
    source = ("import time\nimport gevent\nfrom time import sleep as nap\n"
              "def test_a():\n    time.sleep(1)\n    def slow(r):\n        gevent.sleep(0.1)\n"
              "    nap(2)\n    f = lambda: time.sleep(3)\n"
              "def test_b(clock):\n    clock.sleep(1)\n    event.wait(1)\n")
    assert sleeps(source) == [(5, "test_a"), (7, "slow"), (8, "test_a"), (9, "<lambda>")]


def test_the_watched_tests_sleep_only_as_receiver_behaviour() -> None:
    offending: list[str] = []
    used: set[tuple[str, str]] = set()
    for name in WATCHED:
        for line, function in sleeps((TESTS / name).read_text(encoding="utf-8")):
            if (name, function) in RECEIVER_BEHAVIOUR:
                used.add((name, function))
            else:
                offending.append(f"tests/{name}:{line} (in {function})")
    assert not offending, (
        "a fixed sleep used as a wait: wait on an observable count with wait_until (or "
        "dispatcher_devtools.kit.SessionActivity), then assert what must not have happened. "
        f"A slow receiver's own sleep goes in a helper listed in RECEIVER_BEHAVIOUR. {offending}")
    assert used == RECEIVER_BEHAVIOUR, f"allowed helpers that no longer sleep: {RECEIVER_BEHAVIOUR - used}"
