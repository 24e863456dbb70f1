"""ONNX export of a Fedge model, and its parity check against onnxruntime.

Needs the ``export`` extra (onnx, onnxruntime, onnxscript); imported lazily so that an agent without it still runs.
Knows nothing of algorithms or the wire.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn


def export_onnx(model: nn.Module, input_shape: tuple[int, int, int], path: str | Path) -> Path:
    """Write the model (in eval mode) as ONNX with a dynamic batch axis."""
    path = Path(path)
    model = model.eval()
    example = torch.zeros(2, *input_shape)
    batch = torch.export.Dim("batch")
    (name,) = [p for p in inspect.signature(model.forward).parameters]
    quiet = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), str(path), input_names=["input"], output_names=["logits"],
                              dynamic_shapes={name: {0: batch}}, dynamo=True, external_data=False,
                              verbose=False)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return path


def onnx_max_abs_difference(model: nn.Module, path: str | Path, batch: np.ndarray) -> float:
    """Run the batch through torch and through onnxruntime; return the largest absolute difference of logits."""
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("onnxruntime is missing: pip install 'fedge[export]'") from exc
    model = model.eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], {"input": batch})
    return float(np.max(np.abs(np.asarray(got) - expected)))
