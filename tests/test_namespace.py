"""Fedge lives under one import name, ``fedge``: no file reaches a bare ``codec`` or ``models``, the installed
environment has no such names, the package table covers every folder, mypy resolves ``fedge.*``, and a user's
project with its own ``models/`` and ``codec/`` runs a local fleet beside Fedge."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import FAST, Processes, finished, metrics
from tests.importscan import PACKAGES, bare_fedge_imports, python_files

ROOT = Path(__file__).resolve().parents[1]
BARE = "|".join(sorted(PACKAGES))
# In shell scripts, unit files, playbooks and docs: `python -m codec`, or Python lines in a heredoc or code block.
IMPORT_LIST = rf"import\s+([\w.]+\s*,\s*)*({BARE})\b"
TEXT_MISTAKES = re.compile(rf"python3?\s+-m\s+({BARE})\b|^\s*(from\s+({BARE})(\.\w+)*\s+import\s|{IMPORT_LIST})", re.M)
CODE_STRING = re.compile(rf"(^|[;\n]\s*)(from\s+({BARE})\b|{IMPORT_LIST})")
TEXT_SUFFIXES = {".sh", ".md", ".j2", ".service", ".yml", ".yaml", ".toml", ".ini", ".cfg", ".txt"}


def python_mistakes(path: Path) -> list[str]:
    """Bare imports, ``-m codec`` in an argument list, and ``-c`` code strings that import a bare name."""
    found = [f"{path.name}:{imp.line}: import {imp.module}" for imp in bare_fedge_imports(path)]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, target in zip(items, items[1:], strict=False):
                if (isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(target, ast.Constant)
                        and isinstance(target.value, str) and target.value.split(".")[0] in PACKAGES):
                    found.append(f"{path.name}:{target.lineno}: -m {target.value}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE_STRING.search(node.value):
            found.append(f"{path.name}:{node.lineno}: code string imports a bare name")
    return found


def text_mistakes(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
            for m in TEXT_MISTAKES.finditer(text)]


def mistakes(root: Path) -> list[str]:
    found = []
    for path in python_files(root):
        if path.resolve() != Path(__file__).resolve():  # this file spells the mistakes it looks for
            found += [f"{path.relative_to(root).parent}/{m}" for m in python_mistakes(path)]
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix in TEXT_SUFFIXES and path.is_file() and not {".git", ".venv", "build", "runs"} & set(rel.parts):
            found += [f"{rel.parent}/{m}" for m in text_mistakes(path)]
    return found


def test_no_file_reaches_a_bare_fedge_package() -> None:
    assert mistakes(ROOT) == []


def test_the_scan_catches_each_planted_mistake(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from fedge.codec import encode\nimport codec\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from models.nets import Cnn\n    import meter.sysfs as s\n")
    (tmp_path / "pkg" / "c.py").write_text("import sys\ncmd = [sys.executable, '-m', 'edge_agent', 'run']\n"
                                           "code = 'import sys, fldata; print(1)'\n")
    (tmp_path / "run.sh").write_text("python3 -m coordinator.cli start\npython - <<EOF\nfrom algorithms import x\n"
                                     "EOF\npython -m fedge.codec inspect p\n")
    found = mistakes(tmp_path)
    assert found == ["pkg/a.py:2: import codec", "pkg/b.py:2: import models.nets", "pkg/b.py:3: import meter.sysfs",
                     "pkg/c.py:2: -m edge_agent", "pkg/c.py:3: code string imports a bare name",
                     "./run.sh:1: python3 -m coordinator", "./run.sh:3: from algorithms import"], found


def test_the_installed_environment_has_no_bare_names(tmp_path: Path) -> None:
    code = ("import importlib.util, sys, fedge.codec\n"
            f"bare = [n for n in {sorted(PACKAGES)!r} if importlib.util.find_spec(n) is not None]\n"
            "print(bare, fedge.codec.__file__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    bare, location = out.stdout.rsplit(" ", 1)
    assert bare == "[]", out.stdout
    assert Path(location.strip()) == ROOT / "codec" / "__init__.py"
    failed = subprocess.run([sys.executable, "-c", "import codec"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode != 0 and "No module named 'codec'" in failed.stderr, failed.stderr


def test_every_package_folder_is_in_the_package_table() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mypy_tree import package_dirs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    mapping = package_dirs()
    folders = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("*/**/__init__.py")
               if not {".venv", "build", "tests", ".git", "examples"} & set(p.relative_to(ROOT).parts)}
    assert set(mapping.values()) == folders
    assert all(name == "fedge" or name == f"fedge.{folder.replace('/', '.')}" for name, folder in mapping.items())


@pytest.fixture(scope="module")
def mypy_tree() -> Path:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "mypy_tree.py"), "--build-only"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def test_mypy_resolves_fedge_and_refuses_what_does_not_exist(mypy_tree: Path, tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from fedge.codec import encode\nfrom fedge.codec.nosuch import thing\n"
                       "import fedge.nosuch\nreveal_type(encode)\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--cache-dir", str(ROOT / ".mypy_cache"), str(planted)], cwd=ROOT,
                         env={**os.environ, "MYPYPATH": str(mypy_tree)}, capture_output=True, text=True, timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'Cannot find implementation or library stub for module named "fedge.codec.nosuch"' in out.stdout
    assert 'module named "fedge.nosuch"' in out.stdout
    revealed = next(line for line in out.stdout.splitlines() if "Revealed type" in line)
    assert "def (" in revealed and "fedge.codec.messages" in revealed, revealed


def test_a_user_project_with_its_own_models_and_codec_runs_a_local_fleet(procs: Processes) -> None:
    project = procs.workdir
    for name in ("models", "codec"):
        (project / name).mkdir()
        (project / name / "__init__.py").write_text(f"WHOSE = 'the user project'\nNAME = {name!r}\n")
    (project / "train_with_fedge.py").write_text(
        "import sys\n"
        "import codec, models\n"
        "assert codec.WHOSE == models.WHOSE == 'the user project', (codec, models)\n"
        "from fedge.runtime.cli import main\n"
        "import codec as again\n"
        "assert again.WHOSE == 'the user project'\n"
        "sys.exit(main(['start', *sys.argv[1:]]))\n")
    run_dir = project / "run"
    coordinator = procs.start(["train_with_fedge", "--rounds", "2", "--local-fleet", "2", "--run-dir",
                               str(run_dir), "--seed", "0", *FAST], name="coordinator")
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2] and all(r["reported"] == 2 for r in rows), rows
    assert sys.modules.get("codec") is None


def test_the_declared_licence_ships_as_a_file() -> None:
    root = Path(__file__).resolve().parents[1]
    declared = (root / "pyproject.toml").read_text()
    assert 'license = { text = "Apache-2.0" }' in declared
    text = (root / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_contract_section_names_every_hook_of_the_algorithm_contract() -> None:
    from fedge.algorithms.contract import BATCH_HOOKS, ClientHalf, ServerHalf

    page = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    section = page[page.index("### The algorithm contract"):]
    section = section[:section.index("\n### ", 10)]
    for protocol in (ServerHalf, ClientHalf):
        hooks = [name for name in vars(protocol) if not name.startswith("_")]
        assert len(hooks) >= 10
        missing = [name for name in hooks if f"`{name}" not in section]
        assert not missing, f"docs/algorithms.md's contract does not name {missing} of {protocol.__name__}"
    assert all(f"`{hook}(" in section for hook in BATCH_HOOKS)


def test_every_section_the_code_cites_exists_in_the_repository() -> None:
    """References such as "docs/algorithms.md section 4.3" or "docs/meter.md sections 2.2 and 2.4" name headings
    of pages in this repository (a clone has no spec elsewhere)."""
    root = Path(__file__).resolve().parents[1]
    pages = {name: (root / "docs" / name).read_text() for name in ("algorithms.md", "meter.md")}
    headings = {name: set(re.findall(r"^#{2,4} (\d+(?:\.\d+)*)[. ]", text, re.M)) for name, text in pages.items()}
    cited: list[tuple[str, str, str]] = []
    for path in [*python_files(root), *sorted(root.glob("docs/*.md")), root / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for page, rest in re.findall(r"docs/(algorithms\.md|meter\.md),? (?:sections? |§)?(\d[\d.]*(?:(?:, | and |-)\d[\d.]*)*)",
                                     text):
            for number in re.findall(r"\d+(?:\.\d+)*", rest):
                cited.append((str(path.relative_to(root)), page, number))
    assert len(cited) >= 30
    missing = [c for c in cited if c[2] not in headings[c[1]]]
    assert not missing, f"cited sections that do not exist: {missing[:10]}"
    assert "ALGORITHMS.md" not in (root / "README.md").read_text() and "../shared" not in (root / "README.md").read_text()
