"""The model a session trains, checked before anything is written: its spec (input shape and outputs from
``[model]`` or the data), the session's normalisation, the model built and one batch passed through it and the
loss, the largest frame its updates may take, and the initial weights of ``model.init``.

What ``runtime.plan.plan_session`` asks of the model; every problem is a one-line ``ConfigError``. Knows no
algorithm by name and imports no transport.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedge.coordinator.config import Config, ConfigError
from fedge.plugins import PluginError


def frame_limit(model: Any) -> int:
    """The largest frame an agent may send: two dense copies of the model's state (an update may carry two groups
    of the model's size, SCAFFOLD's delta and control variate) plus 1 MiB for headers, metadata and the meter
    record. A model whose frames the wire format cannot carry is refused."""
    from fedge.codec import Limits

    dense = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    limit = 2 * dense + (1 << 20)
    carried = Limits().max_packet_bytes
    if limit > carried:
        raise ConfigError(f"the model's state is {dense / 2**20:.1f} MiB: its updates (up to {limit / 2**20:.1f} "
                          f"MiB) exceed the wire format's {carried / 2**20:.0f} MiB packet limit")
    return int(limit)



def model_spec(config: Config, dataset: Any | None) -> Any:
    from fedge.models import ModelSpec

    m = config.model
    shape = tuple(m.input_shape) or (tuple(dataset.input_shape) if dataset is not None else ())
    outputs = m.outputs or (dataset.num_outputs if dataset is not None else 0)
    if not shape or not outputs:
        raise ConfigError("a session without data (data.dataset = \"\") needs model.input_shape and model.outputs")
    if dataset is not None:
        if m.input_shape and tuple(m.input_shape) != tuple(dataset.input_shape):
            raise ConfigError(f"model.input_shape {list(m.input_shape)} does not match the data's samples "
                              f"{list(dataset.input_shape)}")
        if m.outputs and m.outputs != dataset.num_outputs:
            raise ConfigError(f"model.outputs = {m.outputs}, but the data has {dataset.num_outputs} "
                              f"{'targets' if dataset.has_targets else 'classes'}")
    return ModelSpec(name=m.name, input_shape=tuple(int(d) for d in shape), num_classes=int(outputs), pan=m.pan,
                     pan_a=m.pan_a, pan_t=m.pan_t, options=dict(m.options))



def statistics(config: Config, dataset: Any | None, spec: Any) -> tuple[tuple[float, ...] | None,
                                                                         tuple[float, ...] | None]:
    channels = spec.input_shape[0]
    if config.data.mean:
        if len(config.data.mean) != channels:
            raise ConfigError(f"data.mean has {len(config.data.mean)} values; the samples have {channels} channels")
        return tuple(float(v) for v in config.data.mean), tuple(float(v) for v in config.data.std)
    if dataset is None:
        return None, None
    return tuple(dataset.mean), tuple(dataset.std)



def build_checked(config: Config, spec: Any) -> Any:
    from fedge.models import build

    try:
        return build(spec, seed=config.run.seed)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc) if repr(spec.name) in str(exc) else f"model {spec.name!r}: {exc}") from None



def check_batch(config: Config, spec: Any, model: Any, dataset: Any | None, mean: Any, std: Any) -> None:
    """One batch through the model and the loss: the output must fit the labels."""
    import torch

    from fedge.algorithms.task import make_task
    from fedge.fldata import normalize

    classes = dataset is None or not dataset.has_targets
    if dataset is None:
        classes = config.train.loss == "cross_entropy"
    try:
        task = make_task(config.train.loss, config.train.class_weights, targets_are_classes=classes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if dataset is not None:
        count = min(len(dataset.train_y), 8)
        x = normalize(dataset.train_x[:count], mean, std)
        y = torch.from_numpy(np.ascontiguousarray(dataset.train_y[:count]))
    else:
        count = 2
        x = np.zeros((count, *spec.input_shape), np.float32)
        y = (torch.zeros(count, dtype=torch.int64) if task.kind == "classification"
             else torch.zeros((count, spec.num_classes), dtype=torch.float32))
    try:
        with torch.no_grad():
            model.eval()
            outputs = model(torch.from_numpy(x))
    except Exception as exc:
        raise ConfigError(f"model {spec.name!r} fails on a batch of {list(x.shape)}: {type(exc).__name__}: {exc}") \
            from None
    if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) not in ((count, spec.num_classes),):
        shape = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ConfigError(f"model {spec.name!r} outputs {shape} for a batch of {count}; the session needs "
                          f"({count}, {spec.num_classes}) ({spec.num_classes} outputs)")
    try:
        task.check(outputs, y)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.train.class_weights and len(config.train.class_weights) != spec.num_classes:
        raise ConfigError(f"train.class_weights has {len(config.train.class_weights)} values for "
                          f"{spec.num_classes} classes")



def initial_weights(config: Config, model: Any) -> dict[str, np.ndarray]:
    """``model.init``: a .npz in Fedge's layout or a run directory's model.npz, checked against the model."""
    try:
        return model_file_arrays(config.model.init, model, "the model")
    except ValueError as exc:
        raise ConfigError(f"model.init {exc}") from None



def model_file_arrays(source: str | Path, model: Any, what: str) -> dict[str, np.ndarray]:
    """The arrays of a Fedge model file (or a run directory's model.npz) that fits ``model``'s state: every float
    tensor present, no unknown name, every shape equal; ValueError naming the first misfit (``what`` names the
    model in the message)."""
    from fedge.plumbing import load_arrays

    path = Path(source)
    if path.is_dir():
        path = path / "model.npz"
    try:
        arrays, _ = load_arrays(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: not a readable Fedge model file ({exc})") from None
    state = model.state_dict()
    unknown = sorted(set(arrays) - set(state))
    missing = sorted(name for name, t in state.items() if t.is_floating_point() and name not in arrays)
    if unknown or missing:
        raise ValueError(f"{path} does not fit {what}: "
                         + (f"unknown tensors {unknown[:3]}" if unknown else f"missing {missing[:3]}"))
    for name, array in arrays.items():
        if tuple(array.shape) != tuple(state[name].shape):
            raise ValueError(f"{path}: {name} has shape {tuple(array.shape)}, {what} {tuple(state[name].shape)}")
    return arrays
