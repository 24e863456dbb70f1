"""The optional tools some tests drive (a browser and its driver, systemd-analyze): ``command`` finds one, and a
missing one fails the tests that need it when ``CI`` is set (CI installs them: .ci/run; their absence there is a
failure) and skips them, with the reason, elsewhere. Called from a test or a fixture, never at collection, so a
missing tool stops its own tests and nothing else."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

# what provides each tool, for the message
TOOLS = {
    "chromium": "Debian's chromium (apt-get install chromium)",
    "chromedriver": "Debian's chromium-driver (apt-get install chromium-driver)",
    "systemd-analyze": "Debian's systemd (apt-get install systemd)",
}


def command(name: str) -> str:
    """The path of the tool ``name``; when it is missing, the calling test fails under CI and is skipped elsewhere."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} is not on PATH: it needs {TOOLS[name]}")
    return found


def missing(reason: str) -> NoReturn:
    """A test's optional tool is missing: a failure under CI, a skip with its reason elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {reason}", pytrace=False)
    pytest.skip(reason)
