"""Reading a run directory's files while a coordinator writes them.

``JsonlTail`` follows one JSON-lines file (metrics.jsonl, clients.jsonl): it reads only what was appended since
its last look, in bounded chunks, leaves a partial last line for the next look, keeps at most ``keep`` rows (the
newest, shaped by ``shape``), and starts a large file near its end. It notices a file rewritten under it
(``--resume`` writes a new file: a new inode, or a file shorter than what was read) and a file that grew by more
than ``start_within`` since the last look, and then starts over with a new ``generation``. ``read_json`` reads a
JSON file that may be missing or caught mid-write as None, and anything but a JSON object as None too.

Nothing here follows a symbolic link or opens anything but a regular file (a FIFO would block a reader), and
nothing reads more than ``MAX_JSON_BYTES`` of a JSON file: a file planted in a run directory can neither lead a
reader out of the served tree nor stall it. Pure file reading: knows nothing of HTTP or of what the fields mean.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO

MAX_JSON_BYTES = 64 << 20  # a status, report, provenance or agents file larger than this is not read
CHUNK_BYTES = 4 << 20      # a JSON-lines file is read this much at a time
PARSE_ERRORS = (ValueError, RecursionError)  # RecursionError: a line nested too deep for the parser


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file; OSError for a link, a FIFO, a device, a directory."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's JSON object, or None when it is missing, not a regular file, too large, unreadable, not (yet)
    valid JSON, or valid JSON that is not an object."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
        value = json.loads(data) if len(data) <= MAX_JSON_BYTES else None
    except (OSError, *PARSE_ERRORS):
        return None
    return value if isinstance(value, dict) else None


class JsonlTail:
    """The complete rows of a growing JSON-lines file; ``refresh()`` reads what was appended."""

    def __init__(self, path: Path, keep: int = 100_000, start_within: int = 64 << 20,
                 shape: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> None:
        self.path = path
        self.keep = keep
        self.start_within = start_within  # a larger file (or growth) is read from this many bytes before its end
        self.shape = shape                # what is kept of each row
        self.rows: deque[dict[str, Any]] = deque(maxlen=keep)
        # bumped when the file was replaced, truncated or jumped: readers reload. Starts at a random value, so that a
        # page open across a restart of the dashboard cannot take a new reader's generation for its own.
        self.generation = secrets.randbelow(1 << 30)
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
            handle = open_regular(self.path)
        except OSError:  # gone, or not a regular file: nothing to show
            if self.inode is not None:
                self.restart()
            return
        with handle:
            stat = os.fstat(handle.fileno())
            inode = (stat.st_dev, stat.st_ino)
            if self.inode is not None and (inode != self.inode or stat.st_size < self.offset
                                           or stat.st_size - self.offset > self.start_within):
                self.restart()  # rewritten, cut, or grown past what is worth reading: start near the end again
            if self.inode is None:
                self.inode = inode
                self.offset = max(0, stat.st_size - self.start_within)
                if self.offset:  # began inside a line: skip to the next one
                    handle.seek(self.offset - 1)
                    self.offset += len(handle.readline()) - 1
            for line in self.complete_lines(handle, stat.st_size):
                self.take(line)

    def complete_lines(self, handle: BinaryIO, size: int) -> Iterator[bytes]:
        """The complete lines between the offset and ``size``, in chunks; the offset ends after the last one."""
        handle.seek(self.offset)
        pending = b""
        while self.offset + len(pending) < size:
            chunk = handle.read(min(CHUNK_BYTES, size - self.offset - len(pending)))
            if not chunk:
                break
            pending += chunk
            complete = pending.rfind(b"\n") + 1  # a partial last line waits for its end
            if complete:
                lines, pending = pending[:complete], pending[complete:]
                self.offset += complete
                yield from lines.splitlines()
            elif len(pending) > self.start_within:  # one line larger than anything worth reading: skip it
                self.offset += len(pending)
                pending = b""
                self.skipped += 1

    def take(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except PARSE_ERRORS:
            self.skipped += 1
            return
        if isinstance(row, dict):
            self.rows.append(self.shape(row))
            self.total += 1
        else:
            self.skipped += 1

    def since(self, count: int) -> list[dict[str, Any]]:
        """The rows after the first ``count`` of this generation (those still held)."""
        first_held = self.total - len(self.rows)
        return list(self.rows)[max(0, count - first_held):]
