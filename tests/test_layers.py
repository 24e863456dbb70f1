"""The layer rules (docs/architecture.md, "The packages, in layer order"), checked on the source: who may import what, by
second component of ``fedge.*``; the order itself is ``LAYERS``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.importscan import PACKAGES, layers_imported

ROOT = Path(__file__).resolve().parents[1]

# The layer order, lowest first: a package imports only packages before it (deferred imports and imports for type
# checking included), so no two packages know each other. docs/architecture.md shows the same order.
LAYERS = ("fedge", "codec", "secagg", "plumbing", "dashboard", "fldata", "plugins", "models", "meter", "protocol", "algorithms", "client",
          "coordinator", "simulation", "edge_agent", "runtime", "sweep", "api")
# Above every package: the command-line modules, which nothing imports but a ``__main__``.
CLIS = ("runtime/cli.py", "edge_agent/cli.py", "codec/cli.py")

FORBIDDEN: dict[str, set[str]] = {
    "fedge": set(PACKAGES) | {"torch", "zmq"},
    "codec": (PACKAGES - {"codec"}) | {"torch", "zmq"},
    "fldata": (PACKAGES - {"fldata"}) | {"torch", "zmq"},
    "plugins": (PACKAGES - {"plugins"}) | {"torch", "zmq"},
    # Secure aggregation's cryptography and both sides' stage machines: numpy and ``cryptography`` only, no I/O.
    "secagg": (PACKAGES - {"secagg"}) | {"torch", "zmq", "threading", "time", "socket", "subprocess", "asyncio"},
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
    # The round protocol: pure (tests/test_protocol_purity.py checks it transitively, in a fresh interpreter).
    "protocol": (PACKAGES - {"protocol", "codec", "secagg"}) | {"torch", "zmq", "threading", "time", "socket",
                                                                "subprocess", "asyncio"},
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


@pytest.mark.parametrize(("package", "absent"), [("fedge", ("torch", "zmq")), ("fedge.codec", ("torch", "zmq")),
                                                 ("fedge.fldata", ("torch", "zmq")),
                                                 ("fedge.dashboard.server", ("torch", "zmq"))])
def test_importing_a_light_package_loads_no_heavy_one(package: str, absent: tuple[str, ...], tmp_path: Path) -> None:
    code = f"import sys, {package}; print(','.join(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


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


def test_every_package_is_in_the_layer_order() -> None:
    assert set(LAYERS) == set(PACKAGES) | {"fedge"}


def test_a_package_imports_only_the_packages_before_it() -> None:
    assert upward_imports(ROOT) == []


def test_the_order_check_catches_a_planted_upward_import(tmp_path: Path) -> None:
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "leaky.py").write_text("def f():\n    from fedge.algorithms import fedavg\n")
    (tmp_path / "coordinator").mkdir()
    (tmp_path / "coordinator" / "fine.py").write_text("from fedge.protocol import events\n")
    assert upward_imports(tmp_path) == ["protocol/leaky.py imports ['algorithms']"]


def test_nothing_imports_a_command_line_module_but_a_main() -> None:
    cli_modules = {"fedge." + cli[:-3].replace("/", ".") for cli in CLIS}
    importers = [f"{path.relative_to(ROOT)}: {imp.module}" for path in sorted(ROOT.rglob("*.py"))
                 if ".venv" not in path.parts and "build" not in path.parts and path.name != "__main__.py"
                 for imp in layers_imported(path) if imp.module in cli_modules]
    assert importers == []


def module_graph(root: Path) -> dict[str, set[str]]:
    """``fedge.*`` module -> the ``fedge.*`` modules it imports anywhere (at the top, in functions, for type
    checking: a cycle through a deferred import is still two modules that know each other). ``from package import
    name`` points at the submodule when ``name`` is one."""
    import ast

    import tomllib

    folders = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    files: dict[str, Path] = {}
    for package, folder in folders.items():
        for path in sorted((root / folder).glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            files[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedge"):
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    edges.add(target if target in files else node.module)
        edges.discard(name)
        edges.intersection_update(files)
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


def test_the_import_graph_has_no_cycles() -> None:
    found = cycles(module_graph(ROOT))
    assert found == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_cycle_check_finds_a_planted_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
