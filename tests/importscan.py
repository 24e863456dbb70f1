"""What a Python file imports, in Fedge's layer terms: shared by the layer, namespace and package-purity tests.

After the rename every Fedge import starts with ``fedge``, so a rule written on the first component of a module
name would pass vacuously. ``layers_imported`` therefore names a Fedge import by its *second* component
(``from fedge.codec.errors import X`` and ``from fedge import codec`` are both the layer ``codec``) and any other
import by its top-level name (``torch``, ``zmq``). ``bare_fedge_imports`` finds the absolute imports of the
repository's folder names (``import codec``), which from the repository root would still work and load a second
copy of the module. Holds no test of its own and imports nothing of Fedge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = frozenset({"algorithms", "codec", "coordinator", "edge_agent", "fldata", "meter", "models", "plugins", "plumbing",
                      "api", "simulation", "client", "protocol", "runtime", "sweep", "dashboard", "secagg"})
SKIPPED_DIRS = frozenset({".git", ".venv", "build", "dist", "runs", "__pycache__", ".hypothesis", ".mypy_cache",
                          ".ruff_cache", ".pytest_cache"})


@dataclass(frozen=True)
class Import:
    layer: str       # "codec" for any fedge.codec import, "fedge" for fedge itself, else the top-level name
    module: str      # the dotted name as written (with the imported name for `from fedge import x`)
    line: int
    column: int      # 0: a module-level import


def _imports(tree: ast.AST) -> Iterator[tuple[str, int, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, node.col_offset
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fedge":
                for alias in node.names:
                    yield f"fedge.{alias.name}", node.lineno, node.col_offset
            else:
                yield node.module, node.lineno, node.col_offset


def layers_imported(path: Path) -> list[Import]:
    """Every absolute import of ``path`` with its layer (relative imports stay inside a package: skipped)."""
    found = []
    for module, line, column in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
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


def python_files(root: Path) -> Iterable[Path]:
    """Every .py file under ``root``, outside virtual environments, caches and build output."""
    for path in sorted(root.rglob("*.py")):
        if not SKIPPED_DIRS & set(path.relative_to(root).parts[:-1]):
            yield path
