"""The shape of the import graph: no cycle anywhere in flock/, and the layers
that must not need the kernel or the API client import without them.

The cycle check reads every module with :mod:`ast` (nothing is imported) and
takes every ``import`` statement, at module level and inside functions, except
those under ``if TYPE_CHECKING:`` (annotations only, never executed), and every
import by a literal name (``__import__("a.b")``, ``importlib.import_module("a.b")``:
the shim's fast path hands over to the full shim that way).  An
import of ``a.b.c`` depends on ``a.b.c`` and on the packages ``a.b`` and
``a`` that Python initialises first — except a module's own enclosing
packages: a package's ``__init__`` re-exporting its private modules, which
import their siblings through it, is how every package here is built and is
not a cycle between layers.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import flock

ROOT = Path(flock.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif (name := _imported_by_name(node)) is not None:
            found.append(ast.Import(names=[ast.alias(name=name)]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _imported_by_name(node: ast.AST) -> str | None:
    """The module ``__import__("x")`` or ``importlib.import_module("x")`` imports (a literal name only)."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func, first = node.func, node.args[0]
    named = (isinstance(func, ast.Name) and func.id in ("__import__", "import_module")) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    return first.value if named and isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets.append(base)
            targets += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in modules and dep != name and dep not in own:
                    graph[name].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_there_is_no_import_cycle_in_flock():
    graph = import_graph()
    assert len(graph) > 50 and "flock.pods._handler" in graph["flock.pods._bringup"]
    assert "flock.state" in graph["flock.pods._handler"]  # cross-package edges are seen
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


BLOCKED = ("pyroute2", "kubernetes_asyncio", "aiohttp")
_BLOCKER = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is blocked for this test")
        return None
sys.meta_path.insert(0, Blocked())
import {module}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
assert not leaked, leaked
"""


@pytest.mark.parametrize("module", ["flock.pods", "flock.state", "flock.ipam", "flock.health"])
def test_layer_imports_without_the_kernel_or_api_libraries(module):
    """The pod lifecycle and the pure layers need neither pyroute2 nor kubernetes-asyncio."""
    code = _BLOCKER.format(blocked=set(BLOCKED), module=module)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_blocker_really_blocks():
    code = _BLOCKER.format(blocked=set(BLOCKED), module="flock.netlink")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "pyroute2" in out.stderr and "is blocked for this test" in out.stderr


AGENT_SIDE = ("flock.agent", "flock.pods", "flock.watchers", "flock.store", "flock.bird", "flock.health")
LAB_SIDE = ("flock.lab", "flock.testing", "flock.apiserver")


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        # The pod lifecycle sees the store, kernel and API only through its protocols.
        ("flock.pods", ("flock.agent", "flock.netlink", "flock.watchers", "flock.store", "flock.bird", "flock.health")),
        # The node's state is a leaf: values and a change signal.
        ("flock.state", ("flock.agent", "flock.pods", "flock.netlink", "flock.watchers", "flock.store", "flock.ipam")),
        ("flock.ipam", ("flock.agent", "flock.pods", "flock.netlink", "flock.watchers", "flock.store", "flock.state")),
        # Everyone may raise a fault; faults depend on nothing.
        ("flock.faults", ("flock",)),
        # NetworkPolicy: a pure compiler and its appliers; fed values, it asks nobody (issue 32).
        (
            "flock.policy",
            (*AGENT_SIDE, "flock.state", "flock.ipam", "flock.netlink", "flock.rpc", "flock.ctl", *LAB_SIDE),
        ),
        # The lab's API server stands alone: nothing of the agent, the lab or the harnesses (issue 32).
        ("flock.apiserver", (*AGENT_SIDE, "flock.policy", "flock.state", "flock.netlink", "flock.ctl", *LAB_SIDE)),
        # The lab drives the API server and flock's processes, never a test harness.
        ("flock.lab", ("flock.testing",)),
    ],
)
def test_layers_do_not_reach_what_they_must_not_know(layer, forbidden):
    graph = import_graph()
    own = [m for m in graph if m == layer or m.startswith(layer + ".")]
    bad = sorted(
        m
        for start in own
        for m in reachable(graph, start)
        if any(m == f or m.startswith(f + ".") for f in forbidden) and not (m == layer or m.startswith(layer + "."))
    )
    assert bad == [], f"{layer} reaches {bad}"


def test_the_harnesses_are_for_tests_alone():
    """Nothing in flock but the harnesses themselves imports flock.testing: no arrow runs back up."""
    graph = import_graph()
    users = sorted(
        m
        for m, deps in graph.items()
        if not m.startswith("flock.testing")
        and any(d == "flock.testing" or d.startswith("flock.testing.") for d in deps)
    )
    assert users == []


def test_the_layer_check_sees_a_forbidden_edge():
    graph = {"a": {"a.x"}, "a.x": {"b.y"}, "b": set(), "b.y": set()}
    assert reachable(graph, "a.x") == {"b.y"}


# The CNI shim's modules (what the bundle holds) and the leaf they share (issue 26).
SHIM = ("flock.cni_fastpath", "flock.cni_shim", "flock.rpc.wire", "flock.rpc.cniresult", "flock.errors")
LEAF = "flock.cni_common"


# Leaves of the standard library alone: the shim's shared values (the shim stands alone), and the one way
# into a network namespace (the lab and its API server use it without pyroute2 or the netlink layer).
STDLIB_LEAVES = (LEAF, "flock.netns")


@pytest.mark.parametrize("leaf", STDLIB_LEAVES)
def test_a_stdlib_leaf_imports_only_the_standard_library(leaf):
    """flock.cni_common and flock.netns import nothing from flock, and only the standard library's modules."""
    graph = import_graph()
    assert graph[leaf] == set()
    path = ROOT.parent.joinpath(*leaf.split(".")).with_suffix(".py")
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in _imports(ast.parse(path.read_text()))
        for alias in node.names
    }
    assert imported and all(name.split(".")[0] in sys.stdlib_module_names for name in imported), imported


def test_flock_enters_a_network_namespace_in_one_place():
    """``os.setns`` / libc's ``setns`` is called in flock.netns alone: every other module enters a namespace
    through it (the shim's flock.cni_common only checks that an fd is one)."""
    callers = sorted(
        module_name(path)
        for path in ROOT.rglob("*.py")
        if any(
            isinstance(node, ast.Attribute) and node.attr == "setns" and not isinstance(node.ctx, ast.Store)
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert callers == ["flock.netns"], callers


def test_the_shim_modules_form_no_cycle():
    """The fast path hands over to the full shim (an edge the graph sees); nothing of the shim leads back
    to the fast path, and everything the shim's modules share comes from the leaf."""
    graph = import_graph()
    shim = {m: graph[m] & {*SHIM, LEAF} for m in SHIM}
    assert "flock.cni_shim" in shim["flock.cni_fastpath"]  # the hand-over, by name
    assert find_cycle({**shim, LEAF: set()}) is None, " → ".join(find_cycle({**shim, LEAF: set()}) or [])
    assert all(LEAF in shim[m] for m in SHIM if m != "flock.errors")
    back = sorted(m for m in SHIM if m != "flock.cni_fastpath" and "flock.cni_fastpath" in reachable(graph, m))
    assert back == [], f"{back} reach flock.cni_fastpath"
    # And they reach no other flock module (the package flock.rpc, whose own imports are the shim's, aside).
    outside = sorted({d for m in SHIM for d in reachable(graph, m)} - {*SHIM, LEAF, "flock.rpc"})
    assert outside == [], outside


def test_a_literal_import_by_name_is_an_edge():
    tree = ast.parse("def f():\n    return __import__('a.b', fromlist=['x']), importlib.import_module('c')\n")
    assert [[a.name for a in node.names] for node in _imports(tree)] == [["a.b"], ["c"]]


BENCH = ROOT.parent / "bench"
# Benches that import only installed, public modules (issue 26): no sibling script off sys.path, no
# private flock module.  Every bench belongs here; the others still import bench/stats.py, bench/labkit.py
# or flock's private modules.
INSTALLED_ONLY = ("policy_enforce.py", "cri_latency.py", "lab_ecmp.py")


def _edits_sys_path(tree: ast.AST) -> bool:
    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            return True  # sys.path.insert(...), .append(...), ...
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        if any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets):
            return True
    return False


def test_no_bench_edits_sys_path():
    benches = sorted(BENCH.glob("*.py"))
    assert len(benches) > 10
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, 'x')\n"))
    assert not _edits_sys_path(ast.parse("import sys\nprint(sys.path)\n"))
    assert [p.name for p in benches if _edits_sys_path(ast.parse(p.read_text()))] == []


@pytest.mark.parametrize("bench", INSTALLED_ONLY)
def test_bench_imports_only_installed_public_modules(bench):
    tree = ast.parse((BENCH / bench).read_text())
    names = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in _imports(tree)
        if isinstance(node, ast.Import) or node.level == 0
        for alias in node.names
    }
    assert all(isinstance(node, ast.Import) or node.level == 0 for node in _imports(tree))
    for name in sorted(names):
        top = name.split(".")[0]
        if top == "flock":
            assert not any(part.startswith("_") for part in name.split(".")), f"{bench} imports private {name}"
            continue
        spec = importlib.util.find_spec(top)
        assert spec is not None and spec.origin is not None, f"{bench} imports {name}, which is not installed"
        assert BENCH not in Path(spec.origin).parents, f"{bench} imports {name} from bench/"
