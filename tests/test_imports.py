"""The import structure of simdist/ and real_backend/: no cycle, no import of a file by path
(nor in tests/ and bench/, which import shared code such as `simdist.testing` by name), and
simdist reaches real_backend only from its CLI and its lazy public API.

What counts as an import, and why:

* **Design graph** (`test_no_import_cycle`): every `import` and `from ... import` anywhere in a
  module -- at module level, inside functions and methods, under `if TYPE_CHECKING:`, in
  try/except -- plus `importlib.import_module("...")` / `__import__("...")` with a literal name.
  A function-level import is as much a dependency as a top-level one, only deferred, and a
  TYPE_CHECKING import is a dependency of the module's types; hiding a cycle behind either
  leaves the two modules entangled (each needs the other to be understood or changed).
  `from pkg import name` counts as an import of `pkg.name` when that is a module, else of `pkg`.
* **Run-time graph** (`test_no_cycle_when_modules_load`): only what runs when a module is
  loaded (module-level imports, TYPE_CHECKING blocks excluded), plus the parent packages Python
  initialises first (importing `simdist.network.cost` runs `simdist/network/__init__.py`). It
  catches a cycle that goes through a package's `__init__` re-exports, which the design graph
  does not draw. A module's own ancestors are left out: they are already initialising when the
  module runs.

"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

from .conftest import ROOT

PACKAGES = ("simdist", "real_backend")
PATH_LOADERS = {"spec_from_file_location", "SourceFileLoader", "SourcelessFileLoader", "load_source", "run_path",
                "module_from_spec"}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _modules() -> dict[str, Module]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            mods[name] = Module(name, path, is_package)
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest module of ours that `name` names (None: a third-party or stdlib module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for stmt in node.body:
                inside.update(id(n) for n in ast.walk(stmt))
    return inside


def _imports(mod: Module) -> list[tuple[str, int, bool]]:
    """(imported module of ours, line, runs when the module loads) for every import in `mod`."""
    tree = ast.parse(mod.path.read_text(), str(mod.path))
    deferred = _type_checking_nodes(tree)  # not run when the module loads
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            deferred.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = mod.package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for n in names:
            target = _resolve(n)
            if target is not None and target != mod.name:
                out.append((target, node.lineno, id(node) not in deferred))
    return out


def _where(mod: str, line: int) -> str:
    return f"{MODULES[mod].path.relative_to(ROOT)}:{line}"


def design_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for mod in MODULES.values():
        for target, line, _ in _imports(mod):
            g.add_edge(mod.name, target, where=_where(mod.name, line))
    return g


def runtime_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for mod in MODULES.values():
        own_ancestors = {mod.name.rsplit(".", k)[0] for k in range(1, mod.name.count(".") + 1)}
        for target, line, at_load in _imports(mod):
            if not at_load:
                continue
            g.add_edge(mod.name, target, where=_where(mod.name, line))
            for k in range(1, target.count(".") + 1):
                parent = target.rsplit(".", k)[0]
                if parent not in own_ancestors and parent != mod.name:
                    g.add_edge(mod.name, parent, where=f"{_where(mod.name, line)} (parent package)")
    return g


def _cycles(g: nx.DiGraph) -> dict[tuple[str, ...], str]:
    """Every simple cycle, keyed by its sorted modules, with the import lines that close it."""
    found = {}
    for cycle in nx.simple_cycles(g):
        edges = zip(cycle, cycle[1:] + cycle[:1], strict=True)
        found[tuple(sorted(cycle))] = " -> ".join(f"{a} ({g.edges[a, b]['where']})" for a, b in edges) + \
            f" -> {cycle[0]}"
    return found


def test_every_module_is_walked():
    assert {"simdist.cli.app", "simdist.procs", "real_backend.launch", "simdist"} <= set(MODULES)
    g = design_graph()
    assert g.has_edge("simdist.cli.scenario", "real_backend.launch")  # a function-level import
    assert g.has_edge("simdist", "real_backend.launch")  # the public API's TYPE_CHECKING block
    assert not runtime_graph().has_edge("simdist", "real_backend.launch")


@pytest.mark.parametrize("graph", [design_graph, runtime_graph], ids=["design", "runtime"])
def test_no_import_cycle(graph):
    cycles = _cycles(graph())
    assert not cycles, "import cycle(s):\n" + "\n".join(cycles.values())



SCRIPT_FOLDERS = ("tests", "bench")  # not packages of simdist, but they import it and each other


def _sys_path_edit(node: ast.AST) -> bool:
    """`sys.path.insert/append/extend(...)` or an assignment to `sys.path` or one of its items:
    how a script imports a neighbour file by its path without saying so."""
    def is_sys_path(n: ast.AST) -> bool:
        return isinstance(n, ast.Attribute) and n.attr == "path" and getattr(n.value, "id", None) == "sys"

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value)
    if isinstance(node, ast.Assign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets)
    return False


def _path_imports() -> dict[str, list[str]]:
    """Loads of a file by its path: a path loader anywhere (simdist, real_backend, tests, bench),
    and in tests/ and bench/ also edits of sys.path (simdist's script launcher sets
    `sys.path[0]` for the user's script, as the interpreter does: that is not an import of ours)."""
    files = [(m.path, False) for m in MODULES.values()]
    files += [(p, True) for folder in SCRIPT_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
              if "data" not in p.relative_to(ROOT).parts]
    hits: dict[str, list[str]] = {}
    for path, script in files:
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in PATH_LOADERS or (script and _sys_path_edit(node)):
                hits.setdefault(rel, []).append(f"{rel}:{node.lineno} {name or 'sys.path edit'}")
    return hits


def test_nothing_imports_a_file_by_path():
    unknown = _path_imports()
    assert not unknown, "imports by file path (import the module by name instead):\n" + \
        "\n".join(x for v in unknown.values() for x in v)


def test_the_path_import_scan_sees_tests_and_bench():
    """The scan reads tests/ and bench/ too, and what it looks for is what a path import is."""
    seen = {str(f.relative_to(ROOT)) for folder in SCRIPT_FOLDERS for f in (ROOT / folder).rglob("*.py")}
    assert "tests/test_bad_input.py" in seen and "bench/fidelity_sweep.py" in seen
    for code in ("import sys\nsys.path.insert(0, 'bench')", "import sys\nsys.path[0] = 'x'",
                 "import sys\nsys.path += ['x']"):
        assert any(_sys_path_edit(n) for n in ast.walk(ast.parse(code))), code
    assert not any(_sys_path_edit(n) for n in ast.walk(ast.parse("import sys\nprint(sys.path[0])")))
    tree = ast.parse("import importlib.util\nimportlib.util.spec_from_file_location('m', 'm.py')")
    assert any(getattr(n, "attr", None) in PATH_LOADERS for n in ast.walk(tree))


def _real_backend_users() -> dict[str, str]:
    g = design_graph()
    return {a: g.edges[a, b]["where"] for a, b in g.edges
            if a.startswith("simdist") and b.startswith("real_backend")
            and a != "simdist" and not a.startswith("simdist.cli")}


def test_simdist_reaches_real_backend_only_from_cli_and_api():
    """simdist runs without real_backend (e.g. the script launcher uses simdist.procs); the CLI
    and the lazy `simdist.run_real` are where the two meet."""
    unknown = _real_backend_users()
    assert not unknown, f"simdist modules importing real_backend: {unknown}"

