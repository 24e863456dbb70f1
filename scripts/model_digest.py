"""The digest of a run's final model: sha256 over ``model.npz``'s arrays in name order (each array's name, dtype,
shape, then its bytes in C order), so that two runs, or one run before and after a refactor, can be compared bit for
bit without comparing files whose zip metadata may differ.

    python scripts/model_digest.py runs/RUN [runs/OTHER ...]    # one line per run: digest, then the run

Reads files only; imports nothing of fedge.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np


def model_digest(run_dir: Path) -> str:
    """The hex sha256 of ``run_dir/model.npz``'s arrays in name order."""
    digest = hashlib.sha256()
    with np.load(run_dir / "model.npz", allow_pickle=False) as archive:
        for name in sorted(archive.files):
            array = np.ascontiguousarray(archive[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    for run in argv:
        path = Path(run)
        if not (path / "model.npz").is_file():
            print(f"{run}: no model.npz (the run did not complete, or its algorithm keeps no global model)",
                  file=sys.stderr)
            return 1
        print(f"{model_digest(path)}  {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
