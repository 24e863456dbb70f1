"""Type-check Fedge as ``fedge.*``: build a symlink tree mypy can read, then run mypy over it.

    python scripts/mypy_tree.py              # build build/mypy/fedge/ and run ``mypy -p fedge``
    python scripts/mypy_tree.py --build-only # only (re)build the tree; prints its root

mypy cannot follow the editable install's import hook, which maps ``fedge.codec`` to the folder ``codec/`` and so
on (pyproject.toml, ``[tool.setuptools.package-dir]``). This script reads that same table and builds
``build/mypy/fedge/<name> -> ../../../<folder>``, so that mypy, with ``MYPYPATH=build/mypy``, resolves every
``fedge`` import to the real source. Holds no Fedge code and imports none of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "mypy"


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """The ``fedge.*`` name -> folder table of pyproject.toml."""
    with open(root / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"]["package-dir"])


def build_tree(root: Path = ROOT, tree: Path = TREE) -> Path:
    """(Re)build ``tree/fedge`` as links to the mapped folders; returns ``tree``."""
    mapping = package_dirs(root)
    top = tree / "fedge"
    top.mkdir(parents=True, exist_ok=True)
    for entry in top.iterdir():
        if entry.is_symlink():
            entry.unlink()
    for path in sorted((root / mapping["fedge"]).iterdir()):
        if path.is_file():
            (top / path.name).symlink_to(os.path.relpath(path, top))
    for name, folder in mapping.items():
        if name == "fedge":
            continue
        parts = name.split(".")
        if parts[0] != "fedge" or len(parts) != 2:
            raise SystemExit(f"mypy_tree: cannot place {name!r}: only fedge.<name> packages are mapped")
        (top / parts[1]).symlink_to(os.path.relpath(root / folder, top))
    return tree


def main(argv: list[str]) -> int:
    tree = build_tree()
    if "--build-only" in argv:
        print(tree)
        return 0
    env = {**os.environ, "MYPYPATH": str(tree)}
    args = [a for a in argv if a != "--build-only"]
    return subprocess.call([sys.executable, "-m", "mypy", "-p", "fedge", *args], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
