"""The layer contracts of pyproject.toml ([tool.importlinter], run by ``make lint``) hold on the
tree, and would catch a forbidden import: a scratch copy of the packages with one added import
breaks the named contract (docs/architecture.md)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter not installed "
                                "(make venv)")


def scratch_copy(tmp: Path) -> Path:
    for pkg in ("gpuspawner", "idle_culler"):
        shutil.copytree(REPO / pkg, tmp / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "labextension_static"))
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)


def test_contracts_hold_on_the_tree(tmp_path):
    r = lint(scratch_copy(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("gpuspawner/placement/model.py", "import yaml", "placement is pure"),
    ("gpuspawner/placement/ledger.py", "from gpuspawner.hub import cluster",
     "placement is pure"),
    ("gpuspawner/inventory/topology.py", "import gpuspawner.hub.spawner", "layers"),
    ("gpuspawner/singleuser/kernel.py", "from gpuspawner.placement import model",
     "the single-user side knows nothing"),
    ("gpuspawner/schemas/__init__.py", "import yaml", "the configuration schemas are a leaf"),
    ("gpuspawner/schemas/__init__.py", "from gpuspawner.placement import units",
     "the configuration schemas are a leaf"),
    ("gpuspawner/placement/policies.py", "from gpuspawner.simulate import paper",
     "placement is pure"),
    ("gpuspawner/simulate/engine.py", "from gpuspawner.backends import base",
     "the simulator uses placement, never the hub or an engine"),
    ("gpuspawner/server_state.py", "from gpuspawner.placement import model",
     "the server state accessor is a leaf"),
    ("gpuspawner/hub/spawner.py", "from gpuspawner.testing import fakes",
     "nothing in the project imports its test harness"),
    ("idle_culler/netstats.py", "from gpuspawner.backends import docker_backend",
     "the idle culler is its own service"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    root = scratch_copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}  # added by the test\n")
    r = lint(root)
    assert r.returncode != 0, r.stdout
    broken = r.stdout.split("Broken contracts", 1)[1]
    assert contract in broken, r.stdout


# -- rooms with one job each: no import cycles, no imports hidden in functions ---------------
PACKAGES = ("gpuspawner", "idle_culler")

#: The function-local imports of the project's own modules that stay, (file, module) -> why.
#: Each one is the door to an OPTIONAL third-party dependency: the importing module must work
#: without it, the imported one cannot. Anything else is imported at the top of its module,
#: so that an import cycle shows (and fails ``test_no_import_cycles``) instead of hiding.
LOCAL_IMPORTS_ALLOWED = {
    ("gpuspawner/__init__.py", "gpuspawner.hub.spawner"):
        "gpuspawner.GPUSpawner needs jupyterhub (the 'hub' extra); `import gpuspawner` (the "
        "placement module, the CLI) must work without it",
    ("gpuspawner/cli.py", "gpuspawner.hub.config_check"):
        "generate-config reads the hub's classes (jupyterhub, the 'hub' extra); the other "
        "subcommands run on the base dependencies",
    ("gpuspawner/cli.py", "idle_culler.app"):
        "generate-config --culler: the culler's traitlets application (jupyterhub, tornado: the "
        "'culler' extra)",
    ("idle_culler/__main__.py", "idle_culler.app"):
        "`idle-culler explain` runs on the base dependencies; the culler itself needs "
        "traitlets, tornado and jupyterhub (the 'culler' extra)",
    ("idle_culler/api.py", "gpuspawner.webui"):
        "the culler's HTML page needs jinja2, which the 'culler' extra does not install",
    ("idle_culler/api.py", "gpuspawner.webui.headers"):
        "(its package's __init__ imports jinja2, as above)",
    ("gpuspawner/singleuser/gpuviews/__init__.py", "gpuspawner.singleuser.gpuviews.handlers"):
        "the server extension's handlers need jupyter_server; the sampler of this package is "
        "also used by the kernel extension (gpuspawner.singleuser.kernel), without a server",
}

#: import cycles that remain, as the sorted modules of the cycle -> why (none: an entry here
#: must name the change that owns it)
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def _resolve(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The absolute module names an import statement in ``path`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not node.level:
        return [node.module or ""]
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    package = parts[:-1]  # (for a package's __init__.py: the package itself)
    base = package[:len(package) - (node.level - 1)]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, a.name]) for a in node.names]


def local_imports() -> list[tuple[str, int, str]]:
    """(file, line, module) of each import statement inside a function (or a method) of
    gpuspawner/ and idle_culler/ that names one of their modules."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            functions = [n for n in ast.walk(tree)
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
            seen: set[int] = set()
            for fn in functions:
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                        seen.add(id(node))
                        for module in _resolve(path, node):
                            if module.split(".")[0] in PACKAGES:
                                found.append((str(path.relative_to(REPO)), node.lineno, module))
    return found


def test_the_project_imports_its_own_modules_at_the_top():
    hidden = [f"{file}:{line}: import of {module}" for file, line, module in local_imports()
              if (file, module) not in LOCAL_IMPORTS_ALLOWED]
    assert not hidden, ("imports of the project's own modules inside functions (move them to "
                        "the top of the module; a cycle that shows is broken by moving the "
                        "shared piece lower or passing the object in):\n" + "\n".join(hidden))


def test_the_allowed_local_imports_still_exist():
    """An allowed entry that no longer occurs is removed, so that the list only shrinks."""
    present = {(file, module) for file, _line, module in local_imports()}
    stale = [k for k, why in LOCAL_IMPORTS_ALLOWED.items()
             if k not in present and "work in progress" not in why]
    assert not stale, stale


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of gpuspawner and idle_culler that importing it runs first.

    The direct imports grimp finds (at the top, in functions, under ``TYPE_CHECKING``), plus
    the packages Python initialises on the way: ``import a.b.c`` from outside ``a.b`` runs
    ``a/b/__init__.py`` first, so an ``__init__`` that re-exports can close a cycle that the
    module graph alone does not show."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)

    def packages(module: str) -> set[str]:
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for m in graph.modules:
        for n in graph.find_modules_directly_imported_by(m):
            edges[m] |= ({n} | packages(n)) - packages(m) - {m}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_package_init():
    edges = {"p": {"p.a"}, "p.a": set(), "q": {"p.a", "p"}}
    assert cycles(edges) == []
    edges["p"] = {"p.a", "q"}  # p/__init__ imports q, which imports p.a
    assert cycles(edges) == [("p", "q")]


def test_no_import_cycles():
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    edges = import_graph()
    found = {c: "a cycle among: " + ", ".join(c) for c in cycles(edges) if c not in KNOWN_CYCLES}
    assert not found, ("import cycles among the project's modules (break each by moving the "
                       "shared piece to a lower module or passing the object in):\n"
                       + "\n".join(found.values()))
