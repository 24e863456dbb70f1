"""What Python code imports, in Fedge's layer terms: read from a file's source, or seen in a fresh interpreter.
Shared by tests/test_imports.py and the tests that read the layer order or scan the sources; holds the layer order
(docs/architecture.md shows it too), no test of its own, and imports nothing of Fedge.

After the rename every Fedge import starts with ``fedge``, so a rule written on the first component of a module
name would pass vacuously. ``layers_imported`` therefore names a Fedge import by its *second* component
(``from fedge.codec.errors import X`` and ``from fedge import codec`` are both the layer ``codec``) and any other
import by its top-level name (``torch``, ``zmq``). ``bare_fedge_imports`` finds the absolute imports of the
repository's folder names (``import codec``), which from the repository root would still work and load a second
copy of the module. ``loaded_in_turn`` runs statements one after another in one fresh interpreter and says which
modules each one loaded.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# The layer order, lowest first: a package imports only packages before it (deferred imports and imports for type
# checking included), so no two packages know each other. docs/architecture.md shows the same order.
LAYERS = ("fedge", "codec", "secagg", "plumbing", "dashboard", "fldata", "plugins", "models", "meter", "protocol",
          "algorithms", "client", "coordinator", "simulation", "edge_agent", "runtime", "sweep", "api")
PACKAGES = frozenset(LAYERS) - {"fedge"}
SKIPPED_DIRS = frozenset({".git", ".venv", "build", "dist", "runs", "__pycache__", ".hypothesis", ".mypy_cache",
                          ".ruff_cache", ".pytest_cache"})


@dataclass(frozen=True)
class Import:
    layer: str       # "codec" for any fedge.codec import, "fedge" for fedge itself, else the top-level name
    module: str      # the dotted name as written (with the imported name for `from fedge import x`)
    line: int
    column: int      # 0: a module-level import


@dataclass(frozen=True)
class Source:
    """What one walk over a file's syntax tree finds (the checks read each file several times)."""
    imports: tuple[tuple[str, int, int], ...]   # (module, line, column) of every absolute import
    run_modules: tuple[tuple[str, int], ...]    # (module, line) of every ``"-m", "module"`` in a list or tuple
    strings: tuple[tuple[str, int], ...]        # (text, line) of every string constant
    # for the module graph, each imported name as the modules it may be, most specific first: ``import a.b`` is
    # ``("a.b",)``, ``from a import b`` is ``("a.b", "a")`` (the submodule b, or a name in a)
    targets: tuple[tuple[str, ...], ...]


def source(path: Path) -> Source:
    """What ``path`` holds (read once per version of the file)."""
    stat = path.stat()
    return _source(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _source(path: Path, mtime_ns: int, size: int) -> Source:
    imports: list[tuple[str, int, int]] = []
    run_modules: list[tuple[str, int]] = []
    strings: list[tuple[str, int]] = []
    targets: list[tuple[str, ...]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            imports += [(alias.name, node.lineno, node.col_offset) for alias in node.names]
            targets += [(alias.name,) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets += [(f"{node.module}.{alias.name}", node.module) for alias in node.names]
            if node.module == "fedge":
                imports += [(f"fedge.{alias.name}", node.lineno, node.col_offset) for alias in node.names]
            else:
                imports.append((node.module, node.lineno, node.col_offset))
        elif isinstance(node, (ast.List, ast.Tuple)):
            for flag, target in zip(node.elts, node.elts[1:], strict=False):
                if (isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(target, ast.Constant)
                        and isinstance(target.value, str)):
                    run_modules.append((target.value, target.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append((node.value, node.lineno))
    return Source(tuple(imports), tuple(run_modules), tuple(strings), tuple(targets))


def layers_imported(path: Path) -> list[Import]:
    """Every absolute import of ``path`` with its layer (relative imports stay inside a package: skipped)."""
    found = []
    for module, line, column in source(path).imports:
        parts = module.split(".")
        if parts[0] == "fedge":
            layer = parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "fedge"
        else:
            layer = parts[0]
        found.append(Import(layer, module, line, column))
    return found


def bare_fedge_imports(path: Path) -> list[Import]:
    """Absolute imports of a bare ``codec``, ``models``, ... (the names Fedge must only be reached under)."""
    return [imp for imp in layers_imported(path) if imp.module.split(".")[0] in PACKAGES]


def repository_files(root: Path, suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    """Every file under ``root`` whose name ends in one of ``suffixes``, sorted, outside virtual environments,
    caches, run directories and build output (which are never walked)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        found += [Path(folder) / name for name in files if name.endswith(suffixes)]
    return sorted(found)


def package_table(root: Path) -> dict[str, str]:
    """pyproject.toml's ``fedge.*`` name -> folder table (``[tool.setuptools.package-dir]``)."""
    return dict(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"])


# Run by ``python -c`` in a fresh interpreter: the modules loaded at startup, then each statement of argv[1] (a JSON
# list) in turn, in one namespace, with the modules it added to ``sys.modules``.
_PROBE = """\
import sys
import json
grew = [["<startup>", sorted(sys.modules)]]
namespace = {}
for statement in json.loads(sys.argv[1]):
    before = set(sys.modules)
    exec(statement, namespace)
    grew.append([statement, sorted(set(sys.modules) - before)])
print(json.dumps(grew))
"""


def loaded_in_turn(statements: Sequence[str], cwd: Path) -> dict[str, list[str]]:
    """statement -> the modules it loaded, for ``statements`` run in turn in one fresh interpreter started in ``cwd``
    (``"<startup>"``: what the interpreter held before the first). Together they are everything it loaded: a module
    that any statement needs, even one an earlier statement already loaded, is there. The interpreter starts clean:
    without coverage's start-up hook, which would load coverage's own modules first."""
    env = {k: v for k, v in os.environ.items() if k not in ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")}
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(statements))], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def module_graph(root: Path) -> dict[str, set[str]]:
    """``fedge.*`` module -> the ``fedge.*`` modules it imports anywhere (at the top, in functions, for type
    checking: a cycle through a deferred import is still two modules that know each other). ``from package import
    name`` points at the submodule when ``name`` is one."""
    files: dict[str, Path] = {}
    for package, folder in package_table(root).items():
        for path in sorted((root / folder).glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            files[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = {next((t for t in candidates if t in files), "") for candidates in source(path).targets}
        graph[name] = edges - {name, ""}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle found by a depth-first search (each reported once, from where it was entered)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found
