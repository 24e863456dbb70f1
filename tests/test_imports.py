"""Every import rule, checked in one place (docs/architecture.md, "The packages, in layer order").

Fedge lives under one import name, ``fedge``: no file reaches a bare ``codec`` or ``models``, the installed
environment has no such names, the package table covers every folder, and a user's project with its own
``models/`` and ``codec/`` runs a local fleet beside Fedge. In the source: who may import what (by second
component of ``fedge.*``), the layer order ``LAYERS`` (tests/importscan.py), what only a ``__main__`` imports, no
import cycle. Transitively: one fresh interpreter per light package imports each of its modules in turn (and
runs what must stay light) and shows it loads nothing its rules forbid: the round protocol and secure aggregation
load no torch, zmq, subprocess, asyncio, meter, algorithm, model or run-directory code. (That mypy resolves
``fedge.*`` is checked by ``scripts/mypy_tree.py --check-resolution``, a step of scripts/test.sh.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e import FAST, Processes, metrics
from tests.importscan import (
    LAYERS,
    PACKAGES,
    bare_fedge_imports,
    cycles,
    layers_imported,
    loaded_in_turn,
    module_graph,
    package_table,
    repository_files,
    source,
)

ROOT = Path(__file__).resolve().parents[1]

# --- One import name ------------------------------------------------------------------------------------------

BARE = "|".join(sorted(PACKAGES))
# In shell scripts, unit files, playbooks and docs: `python -m codec`, or Python lines in a heredoc or code block.
IMPORT_LIST = rf"import\s+([\w.]+\s*,\s*)*({BARE})\b"
TEXT_MISTAKES = re.compile(rf"python3?\s+-m\s+({BARE})\b|^\s*(from\s+({BARE})(\.\w+)*\s+import\s|{IMPORT_LIST})", re.M)
CODE_STRING = re.compile(rf"(^|[;\n]\s*)(from\s+({BARE})\b|{IMPORT_LIST})")
TEXT_SUFFIXES = (".sh", ".md", ".j2", ".service", ".yml", ".yaml", ".toml", ".ini", ".cfg", ".txt")


def python_mistakes(path: Path) -> list[str]:
    """Bare imports, ``-m codec`` in an argument list, and ``-c`` code strings that import a bare name."""
    found = [(imp.line, f"import {imp.module}") for imp in bare_fedge_imports(path)]
    found += [(line, f"-m {module}") for module, line in source(path).run_modules if module.split(".")[0] in PACKAGES]
    found += [(line, "code string imports a bare name") for text, line in source(path).strings
              if CODE_STRING.search(text)]
    return [f"{path.name}:{line}: {what}" for line, what in found]


def text_mistakes(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [f"{path.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
            for m in TEXT_MISTAKES.finditer(text)]


def mistakes(root: Path) -> list[str]:
    found = []
    for path in repository_files(root):
        if path.resolve() != Path(__file__).resolve():  # this file spells the mistakes it looks for
            found += [f"{path.relative_to(root).parent}/{m}" for m in python_mistakes(path)]
    for path in repository_files(root, TEXT_SUFFIXES):
        found += [f"{path.relative_to(root).parent}/{m}" for m in text_mistakes(path)]
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
    code = ("import importlib.util, json\n"
            "try:\n    import codec\n    refused = ''\nexcept ImportError as error:\n    refused = str(error)\n"
            "import fedge.codec\n"
            f"bare = [n for n in {sorted(PACKAGES)!r} if importlib.util.find_spec(n) is not None]\n"
            "print(json.dumps([bare, fedge.codec.__file__, refused]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    bare, location, refused = json.loads(out.stdout)
    assert bare == [], out.stdout
    assert Path(location) == ROOT / "codec" / "__init__.py"
    assert refused == "No module named 'codec'", out.stdout


def test_every_package_folder_is_in_the_package_table() -> None:
    mapping = package_table(ROOT)
    folders = {str(p.parent.relative_to(ROOT)) for p in repository_files(ROOT)
               if p.name == "__init__.py" and p.parent != ROOT and not {"tests", "examples"} & set(p.relative_to(ROOT).parts)}
    assert set(mapping.values()) == folders
    assert all(name == "fedge" or name == f"fedge.{folder.replace('/', '.')}" for name, folder in mapping.items())


def test_the_layer_order_holds_every_package_of_the_table_once() -> None:
    assert len(set(LAYERS)) == len(LAYERS)
    assert set(LAYERS) == {name.removeprefix("fedge.") for name in package_table(ROOT)}


# --- Who may import what, in the source ---------------------------------------------------------------------------

# Above every package: the command-line modules, which nothing imports but a ``__main__`` (and tests).
CLIS = ("runtime/cli.py", "edge_agent/cli.py", "codec/cli.py")
NO_CLOCK = frozenset({"time", "datetime", "threading", "socket", "selectors", "signal"})  # nor asyncio or subprocess
FORBIDDEN: dict[str, set[str]] = {
    "fedge": set(PACKAGES) | {"torch", "zmq"},
    "codec": (PACKAGES - {"codec"}) | {"torch", "zmq"},
    "fldata": (PACKAGES - {"fldata"}) | {"torch", "zmq"},
    "plugins": (PACKAGES - {"plugins"}) | {"torch", "zmq"},
    # Secure aggregation's cryptography and both sides' stage machines: numpy and ``cryptography`` only, no I/O; its
    # only touch of the OS is entropy (os.urandom, secrets).
    "secagg": (PACKAGES - {"secagg"}) | {"torch", "zmq", "subprocess", "asyncio"} | NO_CLOCK,
    "plumbing": (PACKAGES - {"plumbing"}) | {"torch"},
    # The dashboard reads run directories: nothing of the session, no numerics, no sockets but its HTTP server's.
    "dashboard": (PACKAGES - {"dashboard", "plumbing"}) | {"torch", "zmq", "numpy"},
    # zmq only where a key pair is generated.
    "plumbing/files.py": {"zmq"},
    "plumbing/logsetup.py": {"zmq"},
    "plumbing/sdnotify.py": {"zmq"},
    "plumbing/service.py": {"zmq"},
    "plumbing/__init__.py": {"zmq"},
    "plumbing/claims.py": {"zmq"},
    "plumbing/net.py": {"zmq"},
    "models": {"codec", "algorithms", "coordinator", "edge_agent", "meter", "zmq", "api", "simulation", "client"},
    "algorithms": {"zmq", "coordinator", "edge_agent", "api", "simulation", "client"},
    "meter": {"codec", "algorithms", "coordinator", "edge_agent", "api", "simulation", "client"},
    # The coordinator never imports the agent's side; only ``coordinator start`` builds a simulated fleet.
    "coordinator": {"api", "edge_agent", "client"},
    "coordinator/session.py": {"simulation"},
    # The round protocol: no I/O, no clock, no thread, no socket (and pure transitively: PURITY below).
    "protocol": (PACKAGES - {"protocol", "codec", "secagg"}) | {"torch", "zmq", "subprocess", "asyncio", "os"} | NO_CLOCK,
    "coordinator/status.py": {"zmq", "threading", "socket", "torch", "algorithms", "simulation"},
    "coordinator/downlinks.py": {"zmq", "threading", "time", "socket", "torch", "algorithms", "simulation"},
    "coordinator/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter", "simulation"},
    "edge_agent/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter"},
    "edge_agent": {"coordinator", "api", "simulation"},
    # The client side a real agent and a simulated fleet's workers share: never a transport, socket or thread.
    "client": {"coordinator", "edge_agent", "api", "simulation", "zmq", "threading", "socket"},
    # A simulated fleet runs the client package, never the agent (its sockets, threads and settings).
    "simulation": {"zmq", "api", "edge_agent"},
    # The in-process driver plays the protocol objects; it has no sockets, threads or clocks of its own.
    "simulation/inprocess.py": {"zmq", "threading", "time", "socket", "api", "edge_agent"},
}
# The only modules beyond the standard library a package's sources may import.
ONLY: dict[str, set[str]] = {"codec": {"numpy", "msgpack", "zstandard", "codec"},
                             "fldata": {"numpy", "scipy", "fldata"}}  # scipy lazily (PURITY below)


def violations(root: Path, rules: dict[str, set[str]]) -> list[str]:
    """'file imports layer' for every import under ``root`` that ``rules`` (place -> forbidden layers) forbids."""
    found = []
    for place, forbidden in rules.items():
        target = root / place
        files = [target] if target.is_file() else sorted(target.rglob("*.py"))
        if not files:
            found.append(f"{place}: no Python file")
        for path in files:
            bad = sorted({imp.layer for imp in layers_imported(path)} & forbidden)
            if bad:
                found.append(f"{path.relative_to(root)} imports {bad}")
    return found


@pytest.mark.parametrize("place", sorted(FORBIDDEN))
def test_layer_does_not_import_what_it_must_not_know(place: str) -> None:
    assert violations(ROOT, {place: FORBIDDEN[place]}) == []


def test_the_rule_catches_a_planted_violation(tmp_path: Path) -> None:
    (tmp_path / "codec").mkdir()
    (tmp_path / "codec" / "clean.py").write_text("import numpy\nfrom fedge.codec.errors import CodecError\n")
    (tmp_path / "codec" / "leaky.py").write_text("from fedge.coordinator.session import Session\n")
    (tmp_path / "codec" / "sly.py").write_text("def f():\n    from fedge import models, codec\n    import torch\n")
    found = violations(tmp_path, {"codec": FORBIDDEN["codec"]})
    assert found == ["codec/leaky.py imports ['coordinator']", "codec/sly.py imports ['models', 'torch']"]


@pytest.mark.parametrize("package", sorted(ONLY))
def test_a_package_imports_only_the_standard_library_and_what_it_may(package: str) -> None:
    allowed = set(sys.stdlib_module_names) | ONLY[package]
    found = [f"{path.name}:{imp.line} imports {imp.module}" for path in sorted((ROOT / package).rglob("*.py"))
             for imp in layers_imported(path) if imp.layer not in allowed]
    assert found == []


def upward_imports(root: Path) -> list[str]:
    """'file imports layer' for every import of a package later in LAYERS (the command-line modules aside)."""
    found = []
    for package in LAYERS:
        folder = root / package
        for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
            if str(path.relative_to(root)) in CLIS:
                continue
            later = {imp.layer for imp in layers_imported(path)} & set(LAYERS[LAYERS.index(package) + 1:])
            if later:
                found.append(f"{path.relative_to(root)} imports {sorted(later)}")
    return found


def test_a_package_imports_only_the_packages_before_it() -> None:
    assert upward_imports(ROOT) == []


def test_the_order_check_catches_a_planted_upward_import(tmp_path: Path) -> None:
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "leaky.py").write_text("def f():\n    from fedge.algorithms import fedavg\n")
    (tmp_path / "coordinator").mkdir()
    (tmp_path / "coordinator" / "fine.py").write_text("from fedge.protocol import events\n")
    assert upward_imports(tmp_path) == ["protocol/leaky.py imports ['algorithms']"]


def test_nothing_imports_a_command_line_module_but_a_main() -> None:
    """The product, benchmarks and examples never import a command; tests may (they drive a command's ``main`` in
    process, its output and exit code being the subject)."""
    cli_modules = {"fedge." + cli[:-3].replace("/", ".") for cli in CLIS}
    importers = [f"{path.relative_to(ROOT)}: {imp.module}" for path in repository_files(ROOT)
                 if path.name != "__main__.py" and path.relative_to(ROOT).parts[0] != "tests"
                 for imp in layers_imported(path) if imp.module in cli_modules]
    assert importers == []


def test_the_import_graph_has_no_cycles() -> None:
    found = cycles(module_graph(ROOT))
    assert found == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_check_finds_a_planted_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --- What a package loads, transitively: one fresh interpreter per package ----------------------------------------

@dataclass(frozen=True)
class Purity:
    forbidden: frozenset[str]        # top-level modules it must never load
    fedge: frozenset[str]            # the parts of ``fedge`` it may load (``fedge`` itself always)
    then: tuple[str, ...] = ()       # statements run after its imports, which must stay as light


IMPURE = frozenset({"torch", "zmq", "subprocess", "asyncio", "psutil", "msgpack_numpy"})
PURITY = {
    "fedge": Purity(frozenset({"torch", "zmq"}), frozenset({"exhaustive"})),
    "codec": Purity(frozenset({"torch", "zmq"}), frozenset({"codec"})),
    # torch-free all the way through loading the demo and partitioning it; scipy only where a partitioner needs it
    "fldata": Purity(frozenset({"torch", "zmq", "scipy", "msgpack", "zstandard"}), frozenset({"fldata"}),
                     then=("dataset = fedge.fldata.load_dataset('fmnist-demo')",
                           "fedge.fldata.partition(dataset, 'feature-shift', 3, seed=0)")),
    "dashboard": Purity(frozenset({"torch", "zmq"}), frozenset({"dashboard", "plumbing"})),
    # the round protocol: the codec, numpy, secure aggregation and itself (never the meter, an algorithm, a model,
    # run-directory code)
    "protocol": Purity(IMPURE, frozenset({"codec", "protocol", "exhaustive", "secagg"})),
    "secagg": Purity(IMPURE, frozenset({"secagg"})),
}


def statements(package: str) -> list[str]:
    """Import the package, then each of its modules (its ``__main__`` aside) in turn, then run what it must."""
    name = "fedge" if package == "fedge" else f"fedge.{package}"
    modules = [f"{name}.{path.stem}" for path in sorted((ROOT / package_table(ROOT)[name]).glob("*.py"))
               if path.stem not in ("__init__", "__main__")]
    assert modules, f"{name} has no module"
    return [f"import {name}", *(f"import {module}" for module in modules), *PURITY[package].then]


def impure(loaded: dict[str, list[str]], purity: Purity) -> dict[str, list[str]]:
    """statement -> the modules it loaded that ``purity`` forbids (only statements that loaded one)."""
    def forbidden(module: str) -> bool:
        parts = module.split(".")
        return parts[0] in purity.forbidden or (parts[0] == "fedge" and len(parts) > 1 and parts[1] not in purity.fedge)
    found = {statement: [m for m in modules if forbidden(m)] for statement, modules in loaded.items()}
    return {statement: bad for statement, bad in found.items() if bad}


@pytest.mark.parametrize("package", sorted(PURITY))
def test_a_package_loads_nothing_its_rules_forbid_in_a_fresh_interpreter(package: str, tmp_path: Path) -> None:
    steps = statements(package)
    loaded = loaded_in_turn(steps, tmp_path)
    assert list(loaded) == ["<startup>", *steps]
    assert steps[0].removeprefix("import ") in loaded[steps[0]]  # nothing of it was there before
    assert impure(loaded, PURITY[package]) == {}


def test_the_purity_check_sees_a_forbidden_module() -> None:
    loaded = {"<startup>": ["sys"], "import fedge.protocol.x": ["fedge.codec", "fedge.meter.sensors", "numpy"],
              "import fedge.protocol.y": ["fedge", "torch.nn", "fedge.exhaustive"]}
    assert impure(loaded, PURITY["protocol"]) == {"import fedge.protocol.x": ["fedge.meter.sensors"],
                                                  "import fedge.protocol.y": ["torch.nn"]}
    assert impure(loaded, PURITY["secagg"]) == {"import fedge.protocol.x": ["fedge.codec", "fedge.meter.sensors"],
                                                "import fedge.protocol.y": ["torch.nn", "fedge.exhaustive"]}


# --- A user's project beside Fedge: real processes, each with the project's own ``codec`` and ``models`` first -------

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
    procs.finish(coordinator, "coordinator", 240)
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2] and all(r["reported"] == 2 for r in rows), rows
    assert sys.modules.get("codec") is None
