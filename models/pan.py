"""Position-aware neurons (PANs, Li et al. CVPR 2022; docs/algorithms.md section 5).

Holds the fixed position encoding that a hidden layer adds to (PAN+, ``add``) or multiplies into (PAN∘, ``mul``)
its pre-activation. The encoding is a non-persistent buffer: never in a state dict, never transmitted, never
aggregated, identical on every device for the same (mode, A, T, width). Knows nothing of algorithms or the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

PAN_MODES = ("off", "add", "mul")


@dataclass(frozen=True)
class PanSpec:
    """Which encoding the hidden layers get: mode off | add | mul, amplitude A, period count T."""

    mode: str = "off"
    a: float = 0.1
    t: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in PAN_MODES:
            raise ValueError(f"model.pan must be one of {PAN_MODES}, got {self.mode!r}")
        if not math.isfinite(self.a) or self.a < 0:
            raise ValueError(f"model.pan_a must be a finite number >= 0, got {self.a}")
        if not math.isfinite(self.t) or self.t <= 0:
            raise ValueError(f"model.pan_t must be a finite number > 0, got {self.t}")

    @property
    def active(self) -> bool:
        return self.mode != "off"


def check_period(spec: PanSpec, width: int) -> None:
    """Reject a T that silences the encoding on a layer of this width (2T/J an integer: every sin term is 0)."""
    if not spec.active or spec.a == 0:
        return
    ratio = Fraction(str(spec.t)) * 2 / width
    if ratio.denominator == 1:
        raise ValueError(
            f"model.pan_t = {spec.t} is degenerate for a hidden layer of width {width}: 2T/J = {ratio} is an "
            "integer, so sin(2*pi*T*j/J) = 0 for every neuron and the encoding would be silently off"
        )


class PositionEncoding(nn.Module):
    """e_j = A sin(2 pi T j / J) added (PAN+) or 1 + A sin(...) multiplied (PAN∘), per neuron or channel.

    A plugin model opts into PANs by placing ``PositionEncoding(width)`` after a hidden layer's normalisation and
    before its activation; built without a spec it is off (the identity), and ``models.build`` configures every one
    from ``model.pan``/``pan_a``/``pan_t``.
    """

    def __init__(self, width: int, spec: PanSpec | None = None) -> None:
        super().__init__()
        self.width = int(width)
        self.configure(spec or PanSpec())

    def configure(self, spec: PanSpec) -> None:
        """Set the mode and wave (idempotent); a degenerate period for this width is a ValueError."""
        check_period(spec, self.width)
        self.mode = spec.mode
        j = torch.arange(self.width, dtype=torch.float64)
        wave = spec.a * torch.sin(2 * math.pi * spec.t * j / self.width)
        encoding = wave + 1.0 if spec.mode == "mul" else wave
        self.register_buffer("encoding", encoding.to(torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "off":
            return x
        encoding: torch.Tensor = self.encoding  # type: ignore[assignment]  # a registered buffer
        e = encoding.view(1, -1, *([1] * (x.dim() - 2)))
        if self.mode == "add":
            return x + e
        return x * e


def position_encoding(width: int, spec: PanSpec) -> nn.Module:
    """The encoding layer for a hidden layer of this width, or an identity when PANs are off."""
    if not spec.active:
        return nn.Identity()
    return PositionEncoding(width, spec)
