"""Count the lines of product code that branch on a feature flag (secure aggregation, privacy, asynchronous rounds,
bounded influence, robust rules, the simulated clock, distributed noise).

A feature that composes as a stage, a schedule or a wrapper is chosen once, by a factory; every other place that
asks "is this feature on?" is a branch this script counts. The product's packages are every tracked top-level folder
holding Python but tests, benchmarks, examples, scripts, deploy and docs; modules whose file names contain config,
guarantee, plan, factory, pipeline, schedule, cli or launch are where features are chosen, so they are left out.

    python scripts/mode_branches.py            # the total, then each file's count, heaviest first
    python scripts/mode_branches.py --lines    # every counted line

Reads files only; imports nothing of fedge.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_PRODUCT = {"tests", "benchmarks", "examples", "scripts", "deploy", "docs"}
WHERE_FEATURES_ARE_CHOSEN = ("config", "guarantee", "plan", "factory", "pipeline", "schedule", "cli", "launch")
FLAGS = r"(secagg|secure|privacy|private|versions|asynchronous|async_|influence|robust|rule|radii|simulated_clock|distributed)"
ASKED = r"(secagg|secure|privacy|private|versions|influence|rule|radii)"
BRANCH = re.compile(rf"^\s*(if|elif|case|while)\b.*\b{FLAGS}\b|\bif\b.*\b{ASKED}\b.*\belse\b")


def product_modules(root: Path) -> list[Path]:
    """Tracked ``*.py`` files in the product's folders, less those where features are chosen."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True)
    modules = []
    for name in tracked.stdout.split():
        path = Path(name)
        if len(path.parts) < 2 or path.parts[0] in NOT_PRODUCT:
            continue
        if any(word in path.name for word in WHERE_FEATURES_ARE_CHOSEN):
            continue
        modules.append(path)
    return sorted(modules)


def branches(root: Path) -> dict[Path, list[tuple[int, str]]]:
    """Each module's counted lines: (line number, text)."""
    found: dict[Path, list[tuple[int, str]]] = {}
    for module in product_modules(root):
        lines = (root / module).read_text(encoding="utf-8").splitlines()
        hits = [(number, line.strip()) for number, line in enumerate(lines, 1) if BRANCH.search(line)]
        if hits:
            found[module] = hits
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", action="store_true", help="print every counted line")
    args = parser.parse_args(argv)
    found = branches(ROOT)
    print(f"{sum(len(hits) for hits in found.values())} lines branch on a feature flag")
    for module, hits in sorted(found.items(), key=lambda item: (-len(item[1]), str(item[0]))):
        print(f"{len(hits):4d}  {module}")
        if args.lines:
            for number, text in hits:
                print(f"        {number}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
