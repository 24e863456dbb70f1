"""Rules an independent review asked for: each one a case that used to crash a loop or mislead it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedge import codec
from fedge.algorithms import make_server
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.algorithms.ef_meta import EfUpdate
from fedge.models import build, state_to_arrays
from tests.algo_helpers import TINY_MLP


def server(name: str, options: dict[str, object] | None = None) -> object:
    model = build(TINY_MLP, seed=0)
    return make_server(name, options or {}, state_to_arrays(model), ServerContext(2, ModelLayout.of(model)))


def test_an_ef_base_no_coordinator_published_is_refused() -> None:
    ef = server("ef-fedavg")
    layout = ef.layout  # type: ignore[attr-defined]
    section = codec.SparseSection.with_indices(layout.names, layout.shapes, np.array([0]), np.ones(1, np.float32))
    def update(meta: dict[str, object]) -> ClientUpdate:
        return ClientUpdate("a", 0, 10, Payload({"update": codec.TensorGroup(sparse=section)}, meta))

    for base in (2**64 - 1, -5):
        refused = ef.check_update(1, update({"ef": [1, base, 0]}))  # type: ignore[attr-defined]
        assert "meta.ef.base must be a version" in refused
    assert "not a version this coordinator has published" in \
        ef.check_update(1, update(EfUpdate(base=3, keyframe=0).to_meta()))  # type: ignore[attr-defined]
    for wrong in ({}, {"ef": [2, 0, 0]}, {"ef": [1, 0]}, {"ef_base": 0}):
        assert "meta.ef" in ef.check_update(1, update(wrong)), wrong  # type: ignore[attr-defined]
    assert ef.check_update(1, update(EfUpdate(base=0, keyframe=0).to_meta())) == ""  # type: ignore[attr-defined]


def test_fedcos_warm_up_needs_every_parameters_gradient() -> None:
    cos = server("fedcos", {"warm_start": True})
    arrays = state_to_arrays(build(TINY_MLP, seed=0))
    partial = {n: a for n, a in list(arrays.items())[1:]}
    update = ClientUpdate("a", 0, 10, Payload({"grad": codec.TensorGroup(dense=partial)}))
    assert "lacks tensor" in cos.check_update(1, update)  # type: ignore[attr-defined]
    full = ClientUpdate("a", 0, 10, Payload({"grad": codec.TensorGroup(dense=arrays)}))
    assert cos.check_update(1, full) == ""  # type: ignore[attr-defined]


def test_the_encoder_refuses_a_header_every_decoder_would_refuse() -> None:
    with pytest.raises(codec.Malformed, match="within the header's limits"):
        codec.encode(codec.Update("r", 1, "a", record={f"k{i}": 1 for i in range(1100)}))


def test_an_unreadable_power_supply_attribute_is_no_reading_not_a_crash(tmp_path: Path) -> None:
    from fedge.edge_agent.availability import read_readings

    supply = tmp_path / "sys/class/power_supply/BAT0"
    (supply / "type").mkdir(parents=True)  # reading a directory fails as an unreadable attribute would
    assert read_readings(tmp_path).on_mains is None


def test_a_declined_agent_is_not_sent_its_task_again_on_a_re_hello() -> None:
    from tests.coordinator_frames import frame, hello, joined, protocol, sent

    p = protocol()
    joined(p, "a")
    p.open_round(1, [0], 0.0, 30.0)
    p.receive(b"a", frame(codec.ErrorMessage(run_id="run-1", round=1, sender="a", code="unavailable", reason="hot")),
              1.0)
    assert [type(m) for m in sent(p.receive(b"a", hello("a"), 2.0))] == [codec.Welcome]


def test_edge_agent_check_with_an_address_libzmq_refuses_is_one_line(tmp_path: Path) -> None:
    from fedge.edge_agent.check import check_protocol
    from fedge.edge_agent.config import AgentSettings

    (item,) = check_protocol(AgentSettings(coordinator="tcp://", client_id="x", data="x"), 1.0)
    assert not item.ok and item.text.startswith("cannot connect to 'tcp://'")


def test_a_model_factory_that_fails_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    from fedge.client.joining import Refused
    from tests.byom import agent, welcome

    broken = welcome(model="tests.plugin_models:raises")  # its factory raises RuntimeError
    with pytest.raises(Refused) as info:
        agent(tmp_path, allow_plugins=("tests.plugin_models:raises",), allow_plugin_mismatch=True).join(broken)
    assert info.value.code == "model-failed" and "needs options.width" in str(info.value)
