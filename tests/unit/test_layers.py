"""The package's layering, read from the source: no import cycles, type-only and
function-level imports included, and each layer imports only the layers below it.

docs/architecture.md draws the same map.  An import of a module's own parent
package is implicit in Python (the parent always loads first), so it is no edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# layer -> the dispatcher layers or modules it must never import ("*" in allowed_runtime: any).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "rules": ("store", "outbound", "engine", "api", "cli", "runtime", "config", "producer", "metrics", "tracing"),
    "store": ("outbound", "engine", "api", "cli", "runtime", "config", "producer", "metrics", "tracing"),
    "outbound": ("store", "engine", "api", "cli", "runtime", "producer", "tracing"),
    # The tracing leaf (OpenTelemetry, the otel extra): config only; its callers hand it what to trace.
    "tracing": ("store", "outbound", "engine", "api", "cli", "runtime", "producer", "metrics", "views", "tokens"),
    "engine": ("api", "cli", "runtime"),
    "api": ("engine", "cli", "runtime"),
    "cli": ("engine", "api"),
}
# The few downward-looking exceptions, each with its reason.
ALLOWED = {
    # The worker's green database bound; the API gets it passed in by its main.
    ("dispatcher.engine.worker", "dispatcher.runtime.deadline"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_names(name: str, path: Path) -> Iterator[str]:
    """Every module name an import statement anywhere in the file may load."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        graph[name] = {target for target in imported_names(name, path)
                       if target in known and target != name and not name.startswith(target + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_type_only_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_only_what_lies_below_it(layer: str) -> None:
    wrong = sorted((source, target) for source, targets in import_graph().items() if layer_of(source) == layer
                   for target in targets
                   if layer_of(target) in FORBIDDEN[layer] and (source, target) not in ALLOWED)
    assert wrong == [], f"{layer}/ imports what it must not (docs/architecture.md): {wrong}"


def test_the_product_never_imports_the_dev_tools() -> None:
    outside = sorted((name, target) for name, path in modules().items() for target in imported_names(name, path)
                     if target.split(".")[0] in ("dispatcher_devtools", "tests", "benchmarks"))
    assert outside == []
