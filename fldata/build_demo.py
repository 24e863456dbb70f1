"""Builds the bundled fmnist-demo set from the full Fashion-MNIST IDX files.

    python -m fedge.fldata.build_demo                      # from /usr/share/datasets/fashion-mnist
    python -m fedge.fldata.build_demo --source DIR --out fldata/demo

Takes DEMO_TRAIN_PER_CLASS training and DEMO_TEST_PER_CLASS test images of every class, chosen without
replacement by numpy's default Generator seeded with DEMO_SEED, keeps them in their original order, and
writes fmnist-demo.npz (deflate, fixed zip timestamps, so the same inputs give the same bytes with the same
zlib) and its README.md with the provenance: source file hashes, seed, array hashes, licence. This module
must not know about partitioning or any other Fedge package.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from fedge.fldata.dataset import DataError
from fedge.fldata.idx import FMNIST_CLASSES, FMNIST_FILES, IMAGES_MAGIC, LABELS_MAGIC, find_idx_file, read_idx
from fedge.fldata.loaders import DEMO_ARRAYS, DEMO_FILE, DEMO_PATH

DEMO_SEED = 20240601
DEMO_TRAIN_PER_CLASS = 1200
DEMO_TEST_PER_CLASS = 200
DEBIAN_PACKAGE = "dataset-fashion-mnist"


def select(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of per_class samples of every class, drawn without replacement."""
    picks = [rng.choice(np.flatnonzero(labels == c), size=per_class, replace=False) for c in range(FMNIST_CLASSES)]
    return np.sort(np.concatenate(picks))


def build(source: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The demo arrays and the sha256 of each source file used."""
    files = {part: find_idx_file(source, stem) for part, stem in FMNIST_FILES.items()}
    data = {part: read_idx(f, IMAGES_MAGIC if part.endswith("_x") else LABELS_MAGIC) for part, f in files.items()}
    rng = np.random.default_rng(DEMO_SEED)
    train_idx = select(data["train_y"], DEMO_TRAIN_PER_CLASS, rng)
    test_idx = select(data["test_y"], DEMO_TEST_PER_CLASS, rng)
    arrays = {
        "train_x": data["train_x"][train_idx][:, None],
        "train_y": data["train_y"][train_idx],
        "test_x": data["test_x"][test_idx][:, None],
        "test_y": data["test_y"][test_idx],
        "train_source_index": train_idx.astype(np.uint16),
        "test_source_index": test_idx.astype(np.uint16),
    }
    hashes = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files.values()}
    return arrays, hashes


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """arrays as a deflate-compressed .npz with fixed timestamps, so that rebuilding gives the same bytes."""
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in DEMO_ARRAYS:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    tmp.replace(path)


def array_sha256(a: np.ndarray) -> str:
    """sha256 of an array's raw C-order bytes (independent of how the .npz was compressed)."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def debian_version() -> str:
    """The installed version of the Debian package, or "unknown" off Debian."""
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", DEBIAN_PACKAGE],
                              capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def readme(source: Path, hashes: dict[str, str], arrays: dict[str, np.ndarray], demo_sha: str, size: int) -> str:
    """The provenance note stored beside the demo file."""
    rows = "\n".join(f"| `{name}` | `{sha}` |" for name, sha in sorted(hashes.items()))
    arrays_rows = "\n".join(
        f"| `{name}` | {arrays[name].dtype} | {' x '.join(map(str, arrays[name].shape))} | `{array_sha256(arrays[name])}` |"
        for name in DEMO_ARRAYS
    )
    return README_TEMPLATE.format(
        file=DEMO_FILE, size=size, size_mb=size / 1e6, train=DEMO_TRAIN_PER_CLASS, test=DEMO_TEST_PER_CLASS,
        seed=DEMO_SEED, source=source, package=DEBIAN_PACKAGE, version=debian_version(), rows=rows,
        arrays_rows=arrays_rows, demo_sha=demo_sha,
    )


README_TEMPLATE = """# fmnist-demo: a small, real Fashion-MNIST subset bundled with Fedge

`{file}` ({size} bytes, {size_mb:.1f} MB) holds {train} training and {test} test images of each of the ten
Fashion-MNIST classes: 12,000 training and 2,000 test images in all, unchanged 28 x 28 grey-scale uint8
pixels. `load_dataset("fmnist-demo")` reads it in a fraction of a second, so examples, tests and a
first run need no download. For real experiments use the full set (`fmnist`).

## How it was built

    python -m fedge.fldata.build_demo --source {source}

1. Read the four IDX files of the Debian package `{package}` (version {version}).
2. `rng = numpy.random.default_rng({seed})`. For each class 0..9 in turn, draw {train} of that class's
   training indices with `rng.choice(..., replace=False)`; then the same with {test} test indices per class.
3. Keep the chosen images in their original order (indices sorted ascending) and store them as
   N x 1 x 28 x 28, with the labels and the indices into the source files, in a deflate-compressed .npz
   (fixed zip timestamps).

Source files (sha256 of the files as installed, gzip-compressed):

| file | sha256 |
| --- | --- |
{rows}

Arrays in the .npz (sha256 of the raw C-order bytes; these stay the same whatever zlib compressed them):

| array | dtype | shape | sha256 |
| --- | --- | --- | --- |
{arrays_rows}

sha256 of `{file}` as built: `{demo_sha}`.

## Licence

Fashion-MNIST is by Zalando Research (https://github.com/zalandoresearch/fashion-mnist) and is released
under the MIT licence. This subset is distributed under the same terms:

    The MIT License (MIT) Copyright (c) 2017 Zalando SE, https://tech.zalando.com

    Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
    associated documentation files (the "Software"), to deal in the Software without restriction,
    including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense,
    and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so,
    subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all copies or substantial
    portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT
    LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN
    NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY,
    WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE
    SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedge.fldata.build_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("/usr/share/datasets/fashion-mnist"),
                        help="directory holding the Fashion-MNIST IDX files")
    parser.add_argument("--out", type=Path, default=DEMO_PATH.parent, help="directory to write the demo into")
    args = parser.parse_args(argv)
    try:
        arrays, hashes = build(args.source)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / DEMO_FILE
    write_npz(target, arrays)
    blob = target.read_bytes()
    (args.out / "README.md").write_text(
        readme(args.source, hashes, arrays, hashlib.sha256(blob).hexdigest(), len(blob)), encoding="utf-8"
    )
    print(f"wrote {target} ({len(blob)} bytes) and {args.out / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
