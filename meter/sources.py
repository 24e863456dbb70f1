"""Choosing the energy source: explicitly by name, or ``"auto"``, which probes the measured sources in order and falls
back to the CPU model. Apart from ``meter.energy`` (the base class and the integrator), so that the sources, which
build on that base, and the factory, which builds them, import in one direction only. Must not import torch or zmq.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedge.meter.energy import ENERGY_CHOICES, EnergySource
from fedge.meter.external import CpuModelSource
from fedge.meter.pmic import PmicSource
from fedge.meter.sensors import Ina2xxSource, JetsonHwmonSource, JetsonIioSource, RaplSource
from fedge.meter.sysfs import Root, SensorError


def open_energy_source(choice: str | EnergySource = "auto", root: Root | None = None,
                       vcgencmd: str = "vcgencmd", estimate: dict[str, Any] | None = None,
                       ) -> tuple[EnergySource | None, list[str]]:
    """The energy source to use and notes on how it was chosen.

    An explicit sensor name that cannot be read raises ``SensorError`` (never silently replaced by an estimate).
    ``"auto"`` tries the measured sources in order, probing each with one read, and falls back to the CPU model
    (``estimate`` holds its constants), noting each reason. ``"none"`` gives no source."""
    if isinstance(choice, EnergySource):
        return choice, []
    if choice not in ENERGY_CHOICES:
        raise ValueError(f"energy must be one of {ENERGY_CHOICES} or an EnergySource, got {choice!r}")
    root = root or Root("/")
    if choice == "none":
        return None, ["energy metering off"]
    if choice == "estimate":
        return CpuModelSource(**(estimate or {})), []
    factories: dict[str, list[Callable[[], EnergySource]]] = {
        "rapl": [lambda: RaplSource(root)],
        "jetson": [lambda: JetsonHwmonSource(root), lambda: JetsonIioSource(root)],
        "ina2xx": [lambda: Ina2xxSource(root)],
        "pmic": [lambda: PmicSource(vcgencmd)],
    }
    order = list(factories) if choice == "auto" else [choice]
    notes: list[str] = []
    for name in order:
        for factory in factories[name]:
            try:
                source = factory()
                source.read()
                return source, notes
            except SensorError as error:
                notes.append(f"{name}: {error}")
    if choice != "auto":
        raise SensorError(f"energy source {choice!r} unavailable: " + "; ".join(notes))
    notes.append("no readable power sensor; using the labelled CPU-utilisation model")
    return CpuModelSource(**(estimate or {})), notes
