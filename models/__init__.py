"""Fedge's torch models: the DSSA paper CNN, its BatchNorm variant, an MLP, position-aware neurons, state <-> numpy.

Must not import the wire format, transports or algorithms.
"""

from fedge.models.pan import PAN_MODES, PanSpec, PositionEncoding
from fedge.models.registry import (
    MODELS,
    SUPPORTED_INPUT_SHAPES,
    ModelSpec,
    build,
    definition_hash,
    describe_models,
    parameter_count,
)
from fedge.models.state import (
    arrays_to_state,
    batch_norm_names,
    layer_groups,
    prunable_names,
    state_to_arrays,
)

__all__ = [
    "MODELS", "PAN_MODES", "SUPPORTED_INPUT_SHAPES", "ModelSpec", "PanSpec", "PositionEncoding",
    "arrays_to_state", "batch_norm_names", "build", "definition_hash", "describe_models",
    "layer_groups", "parameter_count", "prunable_names", "state_to_arrays",
]
