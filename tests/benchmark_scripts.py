"""The repository's benchmark scripts played in this process, for the tests whose subject is what a script computes,
writes and prints rather than its process: ``run_script(name, *args)`` plays ``python benchmarks/NAME.py ARGS``
as the interpreter would (the script's folder first on ``sys.path``, for its sibling modules; ``sys.argv`` set; its
``main`` called) with numpy's BLAS on one thread, as a Fedge process runs it, and gives this process's torch thread
count, ``sys.argv`` and ``sys.path`` back after."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_script(name: str, *args: str) -> int:
    """``python benchmarks/NAME.py ARGS`` played here; its exit status (``main``'s return value)."""
    folder, argv, threads = str(BENCHMARKS), sys.argv, torch.get_num_threads()
    sys.path.insert(0, folder)
    sys.argv = [str(BENCHMARKS / f"{name}.py"), *args]
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            main = importlib.import_module(name).main
            status = main(list(args)) if inspect.signature(main).parameters else main()
        return int(status or 0)
    finally:
        sys.path.remove(folder)
        sys.argv = argv
        torch.set_num_threads(threads)
