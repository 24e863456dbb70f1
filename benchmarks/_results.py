"""Appending a measured table to a results page under docs/results/ (one section per run of a script, headed by the
command that made it, the machine and the date); not a command itself. The scripts import it as a sibling module
(``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``)."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path


def append_section(path: Path, script: str, title: str, about: str, table: str) -> None:
    """``table`` appended to ``path`` under the command that made it; a new page opens with ``title`` and a line
    saying which doc (``about``, a link) tells what is measured and why."""
    command = f"python benchmarks/{script} " + " ".join(sys.argv[1:])
    head = "" if path.exists() else f"# {title}\n\nEach section is written by the command it names ({about} says " \
        "what is measured and why).\n"
    with path.open("a") as out:
        out.write(f"{head}\n## `{command.strip()}`\n\n{platform.machine()}, Python {platform.python_version()}, "
                  f"{time.strftime('%Y-%m-%d')}.\n\n{table}\n")
