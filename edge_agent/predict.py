"""On-device inference without torch: the device's latest committed model run by onnxruntime.

    from fedge.edge_agent.predict import Predictor
    predictor = Predictor.open("/var/lib/fedge-agent/state")         # or edge-agent predict --input FILE.npy
    classes = predictor.classes(samples)                               # samples: (N, C, H, W) uint8, as in a shard

The weights are the model the agent committed last (``DeviceState.committed_model``: the received global model for
fedavg, fedprox, scaffold and dssa, ef's public-model replica, fedbn's received weights with the device's own BN,
pFedLA's model after its last committed local training). The graph is an ONNX file of the same model definition
whose initializers carry state-dict names (``fedge.models.export``): the device's own ``model.onnx`` in its state
directory, exported by the first prediction after a commit of a new model definition where torch and the export
extra are installed (in the predicting process, never in the agent's: the export's imports would stay resident in a
long-lived agent and raise its memory by about 100 MB), or a file given explicitly (the coordinator's ``model.onnx``, pushed by the playbook). The device's
arrays replace the file's initializers, so any file of the same definition gives the device's own model.
onnxruntime's graph optimisations are off: they fold initializers before a replacement takes effect.

Imports numpy, onnxruntime and Fedge's numpy-only parts; torch only inside ``export_template``, never otherwise.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedge.client.state import DeviceState, StoredState
from fedge.fldata import normalize

log = logging.getLogger("fedge.agent.predict")

ONNX_NAME = "model.onnx"


class PredictError(ValueError):
    """Why no prediction can be made; the message is one line for the user."""


def stamp_of(onnx: Path) -> dict[str, Any] | None:
    path = Path(f"{onnx}.json")
    return json.loads(path.read_text()) if path.exists() else None


def committed(state_dir: str | Path) -> StoredState:
    """The latest committed state with its model, or a PredictError saying why there is none."""
    directory = Path(state_dir)
    if not directory.is_dir():
        raise PredictError(f"{directory} is not a state directory (agent.state_dir of this device)")
    state = DeviceState(directory).committed_model()
    if state is None:
        raise PredictError(f"no committed model in {directory} yet: the agent has not had a round committed")
    return state


def export_template(state_dir: str | Path, state: StoredState) -> Path:
    """Write STATE_DIR/model.onnx for the committed model's definition (needs torch and the export extra)."""
    try:
        from fedge.models import ModelSpec, arrays_to_state, build
        from fedge.models.export import export_onnx
    except ImportError as exc:
        raise PredictError(f"cannot export {ONNX_NAME} here ({exc}); install the export extra, or pass the "
                           f"coordinator's {ONNX_NAME} with --onnx") from exc
    spec = ModelSpec.from_dict(state.model_meta["model"])
    model = build(spec)
    arrays_to_state(model, state.model, strict=False)
    path = Path(state_dir) / ONNX_NAME
    try:  # torch.onnx imports onnx and onnxscript only when it exports
        return export_onnx(model, spec.input_shape, path, state.model_meta["model_hash"])
    except ImportError as exc:
        raise PredictError(f"cannot export {ONNX_NAME} here ({exc}); install the export extra, or pass the "
                           f"coordinator's {ONNX_NAME} with --onnx") from exc


def template(state_dir: str | Path, state: StoredState, onnx: str | Path | None = None) -> Path:
    """The ONNX graph to run ``state``'s weights in: ``onnx`` when given, else the state directory's own file when
    its stamp names the same model definition, else a fresh export."""
    expected = state.model_meta["model_hash"]
    if onnx is not None:
        path = Path(onnx)
        if not path.is_file():
            raise PredictError(f"{path}: no such ONNX file")
        stamp = stamp_of(path)
        if stamp is None:  # without it, initializer names that miss the graph would be ignored without a word
            raise PredictError(f"{path} has no stamp {path}.json (written beside every export of Fedge's); copy it "
                               "along with the file")
        if stamp.get("definition_hash") not in (None, expected):
            raise PredictError(f"{path} is of another model definition ({stamp['definition_hash']}) than this "
                               f"device's committed model ({expected})")
        return path
    own = Path(state_dir) / ONNX_NAME
    stamp = stamp_of(own) if own.is_file() else None
    if stamp is not None and stamp.get("definition_hash") == expected:
        return own
    return export_template(state_dir, state)


@dataclass
class Predictor:
    """An onnxruntime session holding the device's committed weights, and the normalisation it trained with."""

    session: Any
    state: StoredState
    onnx: Path

    @classmethod
    def open(cls, state_dir: str | Path, onnx: str | Path | None = None) -> Predictor:
        try:
            import onnxruntime
        except ImportError as exc:
            raise PredictError("onnxruntime is missing: pip install 'fedge[agent]'") from exc
        state = committed(state_dir)
        path = template(state_dir, state, onnx)
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        stamp = stamp_of(path)
        if stamp is None:
            raise PredictError(f"{path} has no stamp {path}.json")
        names = set(stamp["initializers"])
        floats = {k for k, v in state.model.items() if v.dtype.kind == "f"}
        if floats - names:
            raise PredictError(f"{path} lacks initializer(s) {sorted(floats - names)[:3]} of this device's model")
        values = []
        for name in sorted(names):
            if name not in state.model:
                raise PredictError(f"{path} holds initializer {name!r}, which this device's model lacks")
            value = onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(state.model[name]))
            values.append(value)  # the session reads them at creation; keep them alive until then
            options.add_initializer(name, value)
        try:
            session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise PredictError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0]}") from exc
        return cls(session=session, state=state, onnx=path)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.state.model_meta["model"]["input_shape"])

    @property
    def task(self) -> str:
        """classification | regression | multilabel: what the outputs are."""
        return str(self.state.model_meta.get("task", "classification"))

    def prepare(self, samples: np.ndarray) -> np.ndarray:
        """Samples (one, or a batch) as stored on the device, normalised with the session's statistics as in
        training. In a session trained on uint8 features, float32 samples are taken as already normalised."""
        x = np.asarray(samples)
        if x.shape == self.input_shape:
            x = x[None]
        if x.ndim != len(self.input_shape) + 1 or tuple(x.shape[1:]) != self.input_shape:
            raise PredictError(f"input of shape {x.shape}; this model takes {self.input_shape} per sample")
        trained_on_floats = self.state.model_meta.get("features") == "float32"
        if x.dtype == np.uint8 or (trained_on_floats and x.dtype == np.float32):
            return normalize(x, self.state.model_meta["mean"], self.state.model_meta["std"])
        if x.dtype == np.float32:
            return np.ascontiguousarray(x)
        raise PredictError(f"input of dtype {x.dtype}; give samples of the dtype stored in a shard (uint8, or "
                           "float32), or normalised float32 ones for a uint8 session")

    def logits(self, samples: np.ndarray) -> np.ndarray:
        (out,) = self.session.run(["logits"], {"input": self.prepare(samples)})
        return np.asarray(out)

    def classes(self, samples: np.ndarray) -> np.ndarray:
        return np.argmax(self.logits(samples), axis=1)

    def describe(self) -> dict[str, Any]:
        meta = self.state.model_meta
        return {"run_id": self.state.run_id, "round": self.state.round, "model": meta["model"]["name"],
                "algorithm": meta.get("algorithm"), "onnx": str(self.onnx)}
