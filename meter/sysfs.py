"""Reading sysfs/procfs files under a configurable root, and the errors a sensor read can end in.

Every sensor path the meter reads goes through ``Root``, so tests point it at a fake tree (``Root(tmp_path)``) and
a device reads ``Root("/")``. ``read_file`` is the single place that opens a file; a permission error becomes
``NoReadAccess`` (the sensor is present but this user may not read it), a missing file ``SensorMissing``.
Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

from pathlib import Path


class SensorError(Exception):
    """A sensor could not be read."""


class SensorMissing(SensorError):
    """No such sensor (file absent, device not present, tool not installed)."""


class NoReadAccess(SensorError):
    """The sensor exists but this process may not read it (e.g. RAPL ``energy_uj`` is root-only since Linux 5.10)."""

    def __init__(self, path: Path | str, hint: str = "") -> None:
        self.path = str(path)
        message = f"no read access to {self.path}"
        super().__init__(f"{message} ({hint})" if hint else message)


def read_file(path: Path) -> str:
    """The text of one file. Tests replace this function to emulate access checks when running as root."""
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read()


class Root:
    """A directory standing in for ``/``: ``Root("/")`` on a device, ``Root(tmp_path)`` in a test."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Root({str(self.root)!r})"

    def path(self, absolute: str) -> Path:
        """The real path of an absolute sensor path such as ``/sys/class/powercap``."""
        return self.root / absolute.lstrip("/")

    def glob(self, pattern: str) -> list[Path]:
        """Sorted matches of an absolute glob pattern, e.g. ``/sys/class/hwmon/hwmon*/name``."""
        return sorted(self.root.glob(pattern.lstrip("/")))

    def display(self, path: Path) -> str:
        """``path`` as it would read on the device (relative to the root, with a leading slash)."""
        try:
            return "/" + str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def read_text(self, path: Path, hint: str = "") -> str:
        try:
            return read_file(path).strip()
        except PermissionError as error:
            raise NoReadAccess(self.display(path), hint) from error
        except FileNotFoundError as error:
            raise SensorMissing(f"{self.display(path)} does not exist") from error
        except OSError as error:  # EIO/ENODATA from a sensor that exists but fails to answer
            raise SensorError(f"reading {self.display(path)} failed: {error}") from error

    def read_int(self, path: Path, hint: str = "") -> int:
        text = self.read_text(path, hint)
        try:
            return int(text)
        except ValueError as error:
            raise SensorError(f"{self.display(path)} holds {text!r}, not an integer") from error

    def exists(self, path: Path) -> bool:
        return path.exists()
