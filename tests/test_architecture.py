"""The package's imports: no circle, every import points down the layers, nothing but tools/
imports tools/.

The layers, from the bottom (docs/design.md has the module map): the leaves
(errors, report, config, the C extension), ``_runtime``, ``devices``,
``params``, ``plan``, ``transports``, ``allreduce``, the entry points
(``sync``, ``state``), then ``horovod`` and ``torch``, and on top the package
itself and ``tools``. Imports inside functions count as much as those at the
top of a module: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mpisync"
EXTENSIONS = {"mpisync._speedups", "mpisync.tools.bench._osuloop"}  # compiled: no .py to read
LAYERS = [
    {"mpisync.errors", "mpisync.report", "mpisync.config", "mpisync._speedups"},
    {"mpisync._runtime"},
    {"mpisync.devices"},
    {"mpisync.params"},
    {"mpisync.plan"},
    {"mpisync.transports"},
    {"mpisync.allreduce"},
    {"mpisync.sync", "mpisync.state"},
    {"mpisync.horovod", "mpisync.torch"},
    {"mpisync", "mpisync.__main__", "mpisync.tools"},
]


def _modules() -> dict:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _known(name: str, modules: dict) -> str:
    while name not in modules and name not in EXTENSIONS and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_graph() -> dict:
    """Module -> the mpisync modules it imports (top level and inside functions)."""
    modules = _modules()
    graph = collections.defaultdict(set)
    for name, (path, is_package) in modules.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source == "mpisync" or source.startswith("mpisync."):
                    targets = [f"{source}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("mpisync")]
            for target in targets:
                target = _known(target, modules)
                if target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return graph


def _layer(name: str) -> int:
    best, layer = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    assert layer >= 0, f"{name} is in no layer: add it to LAYERS"
    return layer


def _cycles(graph: dict) -> list:
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_circle():
    assert [" -> ".join(c) for c in _cycles(import_graph())] == []


def test_every_import_points_down_the_layers():
    upward = [
        f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
        for m, targets in import_graph().items()
        for t in targets
        if _layer(t) > _layer(m)
    ]
    assert upward == []


def test_only_tools_and_the_command_entry_import_tools():
    outside = [
        f"{m} imports {t}"
        for m, targets in import_graph().items()
        for t in targets
        if t.startswith("mpisync.tools")
        and not (m.startswith("mpisync.tools") or m == "mpisync.__main__")
    ]
    assert outside == []


def test_the_graph_sees_lazy_imports():
    # The check itself: a function-level import is an edge (the info tool imports the device
    # detection lazily).
    assert "mpisync.devices.detect" in import_graph()["mpisync.tools.info"]


#: The node's mechanism: cross-memory copies between a node's ranks.
MECHANISMS = {
    f"mpisync.transports.{name}"
    for name in ("cma", "crossmemory", "crossreduce", "crossbcast", "crossgather")
}
#: Who may import a mechanism: the transports themselves, GradSync's transport layer, and the
#: command line's reports. Every front end goes through mpisync.transports.node (the collectives)
#: and mpisync.transports.policy (which mechanism), or ParamSync's selection.
MECHANISM_USERS = ("mpisync.transports.", "mpisync.allreduce.transport", "mpisync.tools.")


def test_front_ends_reach_the_nodes_mechanisms_through_the_core():
    reached = {
        (module, target)
        for module, targets in import_graph().items()
        for target in targets & MECHANISMS
        if not module.startswith(MECHANISM_USERS) and module not in MECHANISMS
    }
    assert reached == set(), sorted(reached)


def test_the_mechanism_rule_sees_a_direct_import(tmp_path, monkeypatch):
    """The rule would catch a front end importing a mechanism (so the test above can fail)."""
    graph = {"mpisync.torch.reductions": {"mpisync.transports.crossreduce"}}
    reached = {
        (m, t)
        for m, ts in graph.items()
        for t in ts & MECHANISMS
        if not m.startswith(MECHANISM_USERS) and m not in MECHANISMS
    }
    assert reached == {("mpisync.torch.reductions", "mpisync.transports.crossreduce")}
