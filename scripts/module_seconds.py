"""Write tests/module_seconds.json from a pytest JUnit XML: each test module's summed seconds (setup, call and
teardown of its tests), which tests/conftest.py reads to hand the longest modules to pytest-xdist's workers first.

    .venv/bin/python -m pytest -n auto --dist loadscope --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/module_seconds.py /tmp/suite.xml

Modules are given out in collection order, one at a time, to whichever worker is free; alphabetically, a long
module collected late runs alone at the end while the other worker idles. Longest first, the workers end together
(the file only orders the modules: a stale or missing entry costs time, never a test).
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "module_seconds.json"


def module_seconds(junit: Path) -> dict[str, float]:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        if len(parts) >= 2 and parts[0] == "tests":
            seconds[parts[1]] += float(case.get("time", 0))
    return {name: round(value, 1) for name, value in sorted(seconds.items(), key=lambda item: -item[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: scripts/module_seconds.py JUNIT.xml", file=sys.stderr)
        return 2
    seconds = module_seconds(Path(argv[0]))
    OUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"wrote {OUT}: {len(seconds)} modules, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
