"""Process plumbing both sides share, in one place: files (atomic writes, directory locks, the named-arrays file),
CurveZMQ key files, logging setup and the systemd notification protocol. Imports nothing else of Fedge and never
torch; only ``plumbing.keys`` imports zmq (for its key generator).
"""

from fedge.plumbing.files import (
    DirectoryLocked,
    atomic_write_bytes,
    fsync_directory,
    fsync_file,
    hold_directory,
    load_arrays,
    load_arrays_and_model,
    load_meta,
    replace_durably,
    save_arrays,
    without_fsync,
)

__all__ = ["DirectoryLocked", "atomic_write_bytes", "fsync_directory", "fsync_file", "hold_directory", "load_arrays",
           "load_arrays_and_model", "load_meta", "replace_durably", "save_arrays", "without_fsync"]
