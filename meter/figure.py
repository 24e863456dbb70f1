"""A labelled figure: a value with its unit, kind, source and scope, and the rule that refuses to mix them.

Every number the meter produces can be stated as a ``Figure``. Two figures are comparable (subtracted, added,
turned into a reduction) only when unit, kind, source and scope all agree; anything else raises
``IncomparableFigures`` with the reason. Pure Python: must not import torch, psutil, zmq or any Fedge package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

Kind = Literal["measured", "computed", "estimated"]
KINDS: tuple[str, ...] = ("measured", "computed", "estimated")


class IncomparableFigures(ValueError):
    """Two figures differ in unit, kind, source or scope, so comparing them would mean nothing."""


@dataclass(frozen=True)
class Figure:
    """One number and what it is: ``kind`` says how it was obtained, ``source`` what produced it, ``scope`` what it
    covers (``package``, ``module``, ``board``, ``process-share``...). ``method`` and ``notes`` are free text."""

    value: float
    unit: str
    kind: Kind
    source: str
    scope: str
    method: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    def mismatch(self, other: Figure) -> str | None:
        """Why ``self`` and ``other`` cannot be compared, or None when they can."""
        reasons = [f"{name}: {mine!r} vs {theirs!r}"
                   for name, mine, theirs in (("unit", self.unit, other.unit), ("kind", self.kind, other.kind),
                                              ("source", self.source, other.source),
                                              ("scope", self.scope, other.scope))
                   if mine != theirs]
        return "; ".join(reasons) or None

    def check_comparable(self, other: Figure) -> None:
        reason = self.mismatch(other)
        if reason is not None:
            raise IncomparableFigures(f"refusing to compare figures that differ in {reason}")

    def __sub__(self, other: Figure) -> Figure:
        self.check_comparable(other)
        return Figure(self.value - other.value, self.unit, self.kind, self.source, self.scope, self.method)

    def __add__(self, other: Figure) -> Figure:
        self.check_comparable(other)
        return Figure(self.value + other.value, self.unit, self.kind, self.source, self.scope, self.method)

    def reduction_vs(self, baseline: Figure) -> float | None:
        """Relative reduction of ``self`` against ``baseline`` as a fraction: 0.25 means 25 % less than baseline.
        None when the baseline is zero."""
        self.check_comparable(baseline)
        if baseline.value == 0:
            return None
        return (baseline.value - self.value) / baseline.value

    def as_fields(self, prefix: str) -> dict[str, Any]:
        """Flat record fields: ``<prefix>`` holds the value, ``<prefix-stem>_kind`` etc. the labels."""
        stem = prefix.rsplit("_", 1)[0] if prefix.endswith(("_j", "_w", "_s")) else prefix
        return {prefix: self.value, f"{stem}_kind": self.kind, f"{stem}_source": self.source,
                f"{stem}_scope": self.scope, f"{stem}_method": self.method or None,
                f"{stem}_note": "; ".join(self.notes) or None}


def figure_from_fields(record: Mapping[str, Any], prefix: str, unit: str) -> Figure | None:
    """Rebuild a figure from flat record fields written by ``Figure.as_fields``; None when the value is null."""
    stem = prefix.rsplit("_", 1)[0] if prefix.endswith(("_j", "_w", "_s")) else prefix
    value = record.get(prefix)
    if value is None:
        return None
    kind = cast(Kind, record.get(f"{stem}_kind"))
    return Figure(float(value), unit, kind, str(record.get(f"{stem}_source")),  # kind is checked on creation
                  str(record.get(f"{stem}_scope")), str(record.get(f"{stem}_method") or ""))
