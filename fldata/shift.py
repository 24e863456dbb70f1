"""The per-client input transforms of the feature-shift partition (FedBN-style domains, numpy only).

Each client gets one fixed transform, drawn from its own random stream (seed, client index): a rotation
about the image centre (bilinear, zero fill), a contrast change about each image's mean, a brightness
offset, and gaussian pixel noise, applied in that order and then clipped and rounded back to uint8. The
noise is drawn per image from a separate stream of the same client, so the whole result is a function of
the seed and the client index. This module must not know about labels, files or any other Fedge package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

CONTRAST_RANGE = (0.6, 1.4)
BRIGHTNESS_RANGE = (-0.2, 0.2)
NOISE_STD_RANGE = (0.0, 0.08)
ROTATION_RANGE_DEG = (-25.0, 25.0)
_CHUNK = 2048


@dataclass(frozen=True)
class Shift:
    """One client's transform; brightness and noise_std are in [0, 1] pixel units."""

    contrast: float
    brightness: float
    noise_std: float
    rotation_deg: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def draw_shift(rng: np.random.Generator) -> Shift:
    """A transform with each parameter uniform in its range."""
    return Shift(
        contrast=float(rng.uniform(*CONTRAST_RANGE)),
        brightness=float(rng.uniform(*BRIGHTNESS_RANGE)),
        noise_std=float(rng.uniform(*NOISE_STD_RANGE)),
        rotation_deg=float(rng.uniform(*ROTATION_RANGE_DEG)),
    )


def apply_shift(x: np.ndarray, shift: Shift, noise: np.random.Generator) -> np.ndarray:
    """Images x (uint8 N x C x H x W) passed through shift, as a new uint8 array of the same shape."""
    out = np.empty_like(x)
    for start in range(0, len(x), _CHUNK):
        f = x[start:start + _CHUNK].astype(np.float32) / np.float32(255.0)
        f = _rotate(f, shift.rotation_deg)
        centre = f.mean(axis=(1, 2, 3), keepdims=True)
        f = (f - centre) * np.float32(shift.contrast) + centre + np.float32(shift.brightness)
        f += noise.normal(0.0, shift.noise_std, size=f.shape).astype(np.float32)
        np.clip(f, 0.0, 1.0, out=f)
        out[start:start + _CHUNK] = np.rint(f * np.float32(255.0)).astype(np.uint8)
    return out


def _rotate(f: np.ndarray, degrees: float) -> np.ndarray:
    """Float images N x C x H x W rotated by degrees about their centre; pixels from outside read as 0."""
    h, w = f.shape[2:]
    theta = np.deg2rad(degrees)
    cos, sin = np.cos(theta), np.sin(theta)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    # Inverse mapping: each output pixel reads the source point rotated back by -theta.
    sx = cos * (xx - cx) + sin * (yy - cy) + cx
    sy = -sin * (xx - cx) + cos * (yy - cy) + cy
    x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    wx, wy = (sx - x0).astype(np.float32), (sy - y0).astype(np.float32)
    out = np.zeros_like(f)
    for dy, dx, weight in ((0, 0, (1 - wy) * (1 - wx)), (0, 1, (1 - wy) * wx),
                           (1, 0, wy * (1 - wx)), (1, 1, wy * wx)):
        yi, xi = y0 + dy, x0 + dx
        inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
        sample = f[:, :, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)]
        out += sample * (weight * inside)
    return out
