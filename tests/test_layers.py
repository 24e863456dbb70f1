"""The layer rules of STYLE.md, checked on the source: who may import what, by second component of ``fedge.*``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.importscan import PACKAGES, layers_imported

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: dict[str, set[str]] = {
    "fedge": set(PACKAGES) | {"torch", "zmq"},
    "codec": (PACKAGES - {"codec"}) | {"torch", "zmq"},
    "fldata": (PACKAGES - {"fldata"}) | {"torch", "zmq"},
    "plugins": (PACKAGES - {"plugins"}) | {"torch", "zmq"},
    "plumbing": (PACKAGES - {"plumbing"}) | {"torch", "zmq"},
    "models": {"codec", "algorithms", "coordinator", "edge_agent", "meter", "zmq", "api", "simulation"},
    "algorithms": {"zmq", "coordinator", "edge_agent", "api", "simulation"},
    "meter": {"codec", "algorithms", "coordinator", "edge_agent", "api", "simulation"},
    "coordinator": {"api", "simulation"},
    "coordinator/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter"},
    "edge_agent/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter"},
    "edge_agent": {"coordinator", "api", "simulation"},
    # The in-process driver plays the protocol objects; it has no sockets, threads or clocks of its own.
    "simulation": {"zmq", "threading", "time", "socket", "api"},
    # The protocol objects: no sockets, threads or clocks of their own (frames and the time are handed to them).
    "coordinator/protocol.py": {"zmq", "threading", "time", "socket", "edge_agent"},
    "edge_agent/protocol.py": {"zmq", "threading", "time", "socket", "torch", "algorithms", "models"},
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
                                                 ("fedge.fldata", ("torch", "zmq"))])
def test_importing_a_light_package_loads_no_heavy_one(package: str, absent: tuple[str, ...], tmp_path: Path) -> None:
    code = f"import sys, {package}; print(','.join(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr
