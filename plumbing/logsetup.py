"""Logging set-up shared by the agent and the coordinator: readable lines or JSON lines, to stderr and/or a file.

Under systemd, when stderr is the journal (``JOURNAL_STREAM`` names it), each line starts with its syslog priority
(``<4>`` for a warning: ``journalctl -p warning`` then works) and carries no timestamp of its own (the journal keeps
one). Imports nothing of Fedge.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import time
from typing import TextIO

# syslog priorities of Python's levels (sd-daemon(3)): the journal reads a "<N>" prefix.
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def priority_of(level: int) -> int:
    for threshold, priority in PRIORITIES:
        if level >= threshold:
            return priority
    return 7


def is_journal(stream: TextIO) -> bool:
    """True when ``stream`` is connected to the journal: systemd sets JOURNAL_STREAM to its device:inode."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    if not expected:
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return f"{info.st_dev}:{info.st_ino}" == expected


class JournalFormatter(logging.Formatter):
    """``<priority>logger: message``, every line of a multi-line record (a traceback) with the same prefix."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        prefix = f"<{priority_of(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines() or [""])


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


LOG_FILE_BYTES = 50 << 20  # a log file is rotated at this size ...
LOG_FILE_BACKUPS = 3       # ... keeping this many older files (NAME.1 the newest): at most 200 MB in all


def setup_logging(json_lines: bool = False, level: int = logging.INFO, log_file: str | None = None,
                  quiet: bool = False, max_bytes: int = LOG_FILE_BYTES, backups: int = LOG_FILE_BACKUPS) -> None:
    """Configure the root logger once: stderr (unless quiet: warnings only) and an optional JSON-lines file,
    rotated at ``max_bytes`` with ``backups`` older files kept."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(level)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING if quiet else level)
    if json_lines:
        console.setFormatter(JsonFormatter())
    elif is_journal(sys.stderr):
        console.setFormatter(JournalFormatter())
    else:
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root.addHandler(console)
    if log_file:
        handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=max_bytes, backupCount=backups,
                                                       encoding="utf-8")
        handler.setFormatter(JsonFormatter())
        root.addHandler(handler)
