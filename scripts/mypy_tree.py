"""Type-check Fedge as ``fedge.*``: build a symlink tree mypy can read, then run mypy over it.

    python scripts/mypy_tree.py                    # build build/mypy/fedge/ and run ``mypy -p fedge``
    python scripts/mypy_tree.py --build-only       # only (re)build the tree; prints its root
    python scripts/mypy_tree.py --check-resolution # (re)build it and show that mypy resolves ``fedge.*`` through it

mypy cannot follow the editable install's import hook, which maps ``fedge.codec`` to the folder ``codec/`` and so
on (pyproject.toml, ``[tool.setuptools.package-dir]``). This script reads that same table and builds
``build/mypy/fedge/<name> -> ../../../<folder>``, so that mypy, with ``MYPYPATH=build/mypy``, resolves every
``fedge`` import to the real source. Holds no Fedge code and imports none of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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


# A file that imports a real name of fedge.codec and two that do not exist: through the tree, mypy must see the real
# function (defined in fedge.codec.messages) and refuse both others (no silent Any).
PLANTED = ("from fedge.codec import encode\nfrom fedge.codec.nosuch import thing\nimport fedge.nosuch\n"
           "reveal_type(encode)\n")


def resolution_problems(tree: Path) -> list[str]:
    """What is wrong with how mypy, given ``tree``, reads ``PLANTED`` (nothing: it resolves ``fedge.*``)."""
    with tempfile.TemporaryDirectory() as folder:
        planted = Path(folder) / "planted.py"
        planted.write_text(PLANTED)
        out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                              "--cache-dir", str(ROOT / ".mypy_cache"), str(planted)], cwd=ROOT,
                             env={**os.environ, "MYPYPATH": str(tree)}, capture_output=True, text=True, timeout=240)
    problems = [] if out.returncode == 1 else [f"mypy exited {out.returncode}, not 1"]
    if 'Cannot find implementation or library stub for module named "fedge.codec.nosuch"' not in out.stdout:
        problems.append("fedge.codec.nosuch was not refused")
    if 'module named "fedge.nosuch"' not in out.stdout:
        problems.append("fedge.nosuch was not refused")
    revealed = [line for line in out.stdout.splitlines() if "Revealed type" in line]
    if not (revealed and "def (" in revealed[0] and "fedge.codec.messages" in revealed[0]):
        problems.append(f"fedge.codec.encode is not the function of fedge.codec.messages: {revealed}")
    return [*problems, out.stdout + out.stderr] if problems else []


def main(argv: list[str]) -> int:
    tree = build_tree()
    if "--build-only" in argv:
        print(tree)
        return 0
    if "--check-resolution" in argv:
        problems = resolution_problems(tree)
        if problems:
            print("mypy_tree: mypy does not resolve fedge.* as it must:", *problems, sep="\n", file=sys.stderr)
            return 1
        print("mypy_tree: mypy resolves fedge.* and refuses what does not exist")
        return 0
    env = {**os.environ, "MYPYPATH": str(tree)}
    return subprocess.call([sys.executable, "-m", "mypy", "-p", "fedge", *argv], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
