"""The round protocol is pure all the way down: each of its modules, imported alone in a fresh interpreter, loads only
the codec, numpy, secure aggregation (``fedge.secagg``) and the protocol package (never torch, zmq, subprocess,
asyncio, the meter, an algorithm, a model or run-directory code), and no protocol module imports a clock, a thread
or a socket. Secure aggregation's package (``fedge.secagg``) loads nothing of Fedge but itself, and nothing impure
either."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.importscan import layers_imported

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(f"fedge.protocol.{path.stem}" for path in (ROOT / "protocol").glob("*.py")
                 if path.stem != "__init__") + ["fedge.protocol"]
FORBIDDEN = ("torch", "zmq", "subprocess", "asyncio", "psutil", "msgpack_numpy")
ALLOWED_FEDGE = ("fedge.codec", "fedge.protocol", "fedge.exhaustive", "fedge.secagg")  # and ``fedge`` (its version)
NO_CLOCK = {"time", "datetime", "threading", "socket", "selectors", "signal", "os"}


def loaded_by(module: str) -> list[str]:
    """The modules a fresh interpreter holds after importing ``module`` alone."""
    code = f"import json, sys\nimport {module}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(result.stdout))


def impure(modules: list[str]) -> list[str]:
    fedge_side = [m for m in modules if m.startswith("fedge.")
                  and not any(m == a or m.startswith(a + ".") for a in ALLOWED_FEDGE)]
    return fedge_side + [m for m in modules if m.split(".")[0] in FORBIDDEN]


def test_each_protocol_module_loads_nothing_impure_in_a_fresh_interpreter() -> None:
    problems = {module: impure(loaded_by(module)) for module in MODULES}
    assert {m: p for m, p in problems.items() if p} == {}
    assert "fedge.protocol.agent" in MODULES and "fedge.protocol.coordinator" in MODULES


def test_the_check_sees_a_forbidden_module() -> None:
    assert impure(["fedge.codec", "fedge.meter.sensors", "torch.nn", "numpy"]) == ["fedge.meter.sensors", "torch.nn"]


def test_no_protocol_module_imports_a_clock_a_thread_or_a_socket() -> None:
    found = {str(path.relative_to(ROOT)): sorted({imp.layer for imp in layers_imported(path)} & NO_CLOCK)
             for path in sorted((ROOT / "protocol").glob("*.py"))}
    assert {path: bad for path, bad in found.items() if bad} == {}


def test_each_secure_aggregation_module_loads_only_itself_numpy_and_cryptography() -> None:
    modules = sorted(f"fedge.secagg.{path.stem}" for path in (ROOT / "secagg").glob("*.py") if path.stem != "__init__")
    problems = {}
    for module in modules:
        loaded = loaded_by(module)
        problems[module] = [m for m in loaded if m.startswith("fedge.") and not m.startswith("fedge.secagg")] + \
            [m for m in loaded if m.split(".")[0] in FORBIDDEN]
    assert {m: p for m, p in problems.items() if p} == {}
    assert "fedge.secagg.aggregator" in modules and "fedge.secagg.device" in modules
    # its only touch of the OS is entropy (os.urandom, secrets): no clock, thread or socket
    found = {path.name: sorted({imp.layer for imp in layers_imported(path)} & (NO_CLOCK - {"os"}))
             for path in sorted((ROOT / "secagg").glob("*.py"))}
    assert {path: bad for path, bad in found.items() if bad} == {}
