"""ONNX export of a Fedge model, and its parity check against onnxruntime.

The graph is exported unoptimised, so that every float parameter and buffer stays an initializer under its
state-dict name (``fc1.weight``, ``bn1.running_mean``, ...): any device can run the file with its own weights put
in place of those initializers (``fedge.edge_agent.predict``), without torch. A stamp ``FILE.onnx.json`` beside it
names the model definition (``definition_hash``) and every initializer with its shape.

Needs the ``export`` extra (onnx, onnxruntime, onnxscript); imported lazily so that an agent without it still runs.
Knows nothing of algorithms or the wire.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn


def stamp_path(path: str | Path) -> Path:
    """Where the stamp of an exported file lives: ``model.onnx`` -> ``model.onnx.json``."""
    return Path(f"{path}.json")


def export_onnx(model: nn.Module, input_shape: tuple[int, ...], path: str | Path,
                definition_hash: str | None = None) -> Path:
    """Write the model (in eval mode) as ONNX with a dynamic batch axis, every float tensor of its state dict an
    initializer of the same name, and its stamp (``stamp_path``)."""
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
                              optimize=False, verbose=False)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    initializers = {key: list(value.shape) for key, value in model.state_dict().items() if value.is_floating_point()}
    stamp = {"definition_hash": definition_hash, "input_shape": list(input_shape), "initializers": initializers}
    stamp_path(path).write_text(json.dumps(stamp, indent=1) + "\n")
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
