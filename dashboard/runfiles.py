"""Reading a run directory's files while a coordinator writes them.

``JsonlTail`` follows one JSON-lines file (metrics.jsonl, clients.jsonl): it reads only what was appended since
its last look, leaves a partial last line for the next look, keeps at most ``keep`` rows (the newest), starts a
large file near its end, and notices a file rewritten under it (``--resume`` writes a new file: a new inode, or a
file shorter than what was read) by starting over with a new ``generation``. ``read_json`` reads a JSON file that
may be missing or caught mid-write (the coordinator writes them atomically; a half-written copy is still possible
over network file systems) as None. Neither follows a symbolic link (a coordinator writes none): a link planted in a
run directory cannot lead a reader out of the served tree. Pure file reading: knows nothing of HTTP or of what the
fields mean.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO


def open_file(path: Path) -> BinaryIO:
    """``path`` opened for reading; OSError when it is a symbolic link (or missing)."""
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def read_json(path: Path) -> Any:
    """The file's JSON value, or None when it is missing, a link, unreadable or not (yet) valid JSON."""
    try:
        with open_file(path) as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


class JsonlTail:
    """The complete rows of a growing JSON-lines file; ``refresh()`` reads what was appended."""

    def __init__(self, path: Path, keep: int = 100_000, start_within: int = 64 << 20) -> None:
        self.path = path
        self.keep = keep
        self.start_within = start_within  # a larger file is read from this many bytes before its end
        self.rows: deque[dict[str, Any]] = deque(maxlen=keep)
        self.generation = 0   # bumped when the file was replaced or truncated: readers reload
        self.total = 0        # complete rows read in this generation (the newest ``keep`` are held)
        self.skipped = 0      # complete lines that were not a JSON object
        self.inode: tuple[int, int] | None = None
        self.offset = 0

    def restart(self) -> None:
        self.rows.clear()
        self.generation += 1
        self.total = 0
        self.offset = 0
        self.inode = None

    def refresh(self) -> None:
        try:
            stat = os.lstat(self.path)
        except OSError:
            stat = None
        if stat is None or not S_ISREG(stat.st_mode):  # gone, or a link: nothing to show
            if self.inode is not None:
                self.restart()
            return
        inode = (stat.st_dev, stat.st_ino)
        if self.inode is not None and (inode != self.inode or stat.st_size < self.offset):
            self.restart()
        if self.inode is None:
            self.inode = inode
            self.offset = max(0, stat.st_size - self.start_within)
            if self.offset:  # began inside a line: skip to the next one
                with open_file(self.path) as handle:
                    handle.seek(self.offset - 1)
                    self.offset += len(handle.readline()) - 1
        if stat.st_size <= self.offset:
            return
        try:
            with open_file(self.path) as handle:
                handle.seek(self.offset)
                chunk = handle.read(stat.st_size - self.offset)
        except OSError:  # a link, or gone since the stat
            return
        complete = chunk.rfind(b"\n") + 1  # a partial last line waits for its end
        self.offset += complete
        for line in chunk[:complete].splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                self.skipped += 1
                continue
            if isinstance(row, dict):
                self.rows.append(row)
                self.total += 1
            else:
                self.skipped += 1

    def since(self, count: int) -> list[dict[str, Any]]:
        """The rows after the first ``count`` of this generation (those still held)."""
        first_held = self.total - len(self.rows)
        return list(self.rows)[max(0, count - first_held):]
