"""Fedge's meter: bytes, FLOPs, energy and process figures of a federated round, each labelled with how it was
obtained (measured, computed or estimated), its source and its scope, plus the report that compares two runs.

The public API is listed here; docs/meter.md says what every figure means. The meter must not import the codec,
the transports, the algorithms or the coordinator: callers pass sizes, models and run directories in. pyzmq is
used only by the tests. ``meter.report`` (matplotlib) is imported on demand, not here.
"""

from fedge.meter.agent import DIRECTIONS, AgentMeter
from fedge.meter.energy import ENERGY_CHOICES, EnergyIntegrator, EnergySource, Sampler
from fedge.meter.external import CpuModelSource, MeterLog, attach_log_energy
from fedge.meter.figure import Figure, IncomparableFigures
from fedge.meter.flops import (
    FlopCounter,
    ParamSnapshot,
    densities_from_masks,
    mask_elements,
    optimizer_flops_per_element,
    optimizer_step_flops,
)
from fedge.meter.net import (
    TcpCounters,
    interface_counters,
    tcp_counters,
    tcp_counters_to,
    wire_bytes_estimate,
)
from fedge.meter.pmic import PmicSource, parse_pmic_adc
from fedge.meter.record import PHASES, attribute_energy, round_totals
from fedge.meter.sensors import Ina2xxSource, JetsonHwmonSource, JetsonIioSource, RaplSource
from fedge.meter.sources import open_energy_source
from fedge.meter.sysfs import NoReadAccess, Root, SensorError, SensorMissing
from fedge.meter.zmtp import connection_handshake, handshake_bytes, message_bytes, ready_bytes

__all__ = [
    "DIRECTIONS", "ENERGY_CHOICES", "PHASES", "AgentMeter", "CpuModelSource", "EnergyIntegrator", "EnergySource",
    "Figure", "FlopCounter", "IncomparableFigures", "Ina2xxSource", "JetsonHwmonSource", "JetsonIioSource",
    "MeterLog", "NoReadAccess", "ParamSnapshot", "PmicSource", "RaplSource", "Root", "Sampler", "SensorError",
    "SensorMissing", "TcpCounters", "attach_log_energy", "connection_handshake", "densities_from_masks",
    "handshake_bytes", "interface_counters", "mask_elements", "message_bytes", "open_energy_source",
    "optimizer_flops_per_element", "optimizer_step_flops", "parse_pmic_adc", "ready_bytes", "round_totals", "attribute_energy",
    "tcp_counters", "tcp_counters_to", "wire_bytes_estimate",
]
