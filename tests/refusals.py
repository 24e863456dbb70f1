"""A round driven in process on the pure coordinator protocol, as ``coordinator.session`` drives it (each accepted
update folded at once on the one aggregation path, a fold's refusal reported back with ``unfolded``, the close's
too, then the commits), over a real server half of one float tensor, for the refusal tests."""

from __future__ import annotations

from typing import Any

import numpy as np

import fedge
from fedge import codec
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.algorithms.registry import make_server
from fedge.protocol.coordinator import CoordinatorProtocol
from fedge.protocol.events import Accepted, CoordinatorEvent, Rejected, Send
from fedge.protocol.influence import Influence, InfluenceLimits
from fedge.protocol.privacy import Mechanism, PrivateRound
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.robust_rules import RobustRule
from fedge.protocol.server_half import Aggregation, ServerHalf
from tests.algo_helpers import TINY_MLP

RUN = "run-r"
SIZE = 8


def flat_server(name: str = "fedavg") -> ServerHalf:
    """A real server half over one float tensor ``w`` of ``SIZE`` values (deltas, uniform weights)."""
    layout = ModelLayout(names=("w",), prunable=("w",), batch_norm=(), layers={"w": ("w",)}, parameters=("w",))
    server: ServerHalf = make_server(name, {"upload": "delta", "weighting": "uniform"},
                                     {"w": np.zeros(SIZE, np.float32)}, ServerContext(num_clients=8, layout=layout))
    return server


def private_round() -> PrivateRound:
    """A private sum with no noise (so that two rounds compare bit for bit) and a denominator of 1."""
    return PrivateRound(Mechanism(noise_multiplier=0.0, denominator=1.0), clip=100.0, rng=np.random.default_rng(0))


MODES: dict[str, dict[str, Any]] = {
    "private": {"private": private_round},
    "multi-krum": {"rule": lambda: RobustRule(aggregator="multi-krum", byzantine=1)},
    "held": {"influence": lambda: Influence(InfluenceLimits(max_samples=100))},
    "multi-krum held": {"rule": lambda: RobustRule(aggregator="multi-krum", byzantine=1),
                        "influence": lambda: Influence(InfluenceLimits(max_samples=100))},
}


class Driven:
    """``clients`` joined devices c0, c1, ...; ``play`` one round of their update frames; what came of it."""

    def __init__(self, clients: int, server: ServerHalf | None = None, mode: str = "", deadline_s: float = 300.0
                 ) -> None:
        self.server = server or flat_server()
        self.mode = {key: make() for key, make in MODES.get(mode, {}).items()}
        self.aggregation = Aggregation(self.server, 0)
        self.protocol = CoordinatorProtocol(RUN, "", {"w": (SIZE,)}, AgentRegistry(clients, 1e9), self.server,
                                            self.welcome, admit=lambda update: self.aggregation.check(update),
                                            floats=frozenset({"w"}))
        self.rejected: list[Rejected] = []
        self.committed: list[str] = []
        self.deadline_s = deadline_s
        for index in range(clients):
            name = f"c{index}"
            self.act(self.protocol.receive(name.encode(), codec.encode(codec.Hello(
                run_id="", round=0, sender=name, fedge_version=fedge.__version__, versions=(codec.PROTOCOL_VERSION,),
                torch_version="x", model_hash="", capabilities=(), dataset_size=10)), 0.0))

    def welcome(self, index: int) -> dict[str, Any]:
        return dict(client_index=index, num_clients=8, seed=0, model_hash="", model=TINY_MLP.as_dict(),
                    algorithm="fedavg", algorithm_options={},
                    train={"epochs": 1, "batch_size": 8, "lr": 0.01, "optimizer": "sgd", "momentum": 0.0,
                           "weight_decay": 0.0, "loss": "cross_entropy", "class_weights": []},
                    heartbeat_s=1.0, liveness_s=1e9)

    def act(self, events: list[CoordinatorEvent]) -> None:
        """What the session does with the protocol's events (``coordinator.session.Session.act``)."""
        for event in events:
            match event:
                case Accepted(round=number, update=update):
                    problem = self.aggregation.fold(update)
                    if problem:
                        self.act(self.protocol.unfolded(number, update.index, problem, 0.0))
                case Rejected():
                    self.rejected.append(event)
                case Send(message=codec.Commit(), peer=peer):
                    self.committed.append(peer.decode())
                case _:
                    continue  # the other Sends, the log lines

    def open(self, number: int = 1) -> None:
        self.aggregation = Aggregation(self.server, number, **self.mode)
        self.act(self.protocol.open_round(number, list(range(self.protocol.registry.capacity)), 0.0, self.deadline_s))

    def send(self, index: int, frame: bytes, now: float = 1.0) -> None:
        self.act(self.protocol.receive(f"c{index}".encode(), frame, now))

    def close(self, now: float = 2.0) -> bytes:
        """Close the round (``coordinator.rounds.finish_round``'s order) and commit it; the server state's bytes."""
        current, cancels = self.protocol.close_round(now)
        self.act(cancels)
        before = len(self.aggregation.refused)
        self.aggregation.close()
        for refusal in self.aggregation.refused[before:]:
            self.act(self.protocol.unfolded(current.number, refusal.index, refusal.reason, now))
        self.act(self.protocol.commits(current.number))
        return state_bytes(self.server)


def state_bytes(server: ServerHalf) -> bytes:
    arrays, meta = server.state_dict()
    return b"".join(name.encode() + np.ascontiguousarray(arrays[name]).tobytes() for name in sorted(arrays)) + \
        repr(sorted(meta.items())).encode()


def delta_frame(index: int, values: np.ndarray, sparse: codec.SparseSection | None = None, number: int = 1) -> bytes:
    """Client ``index``'s Update of a delta ``values`` (with a sparse section beside it, when given)."""
    group = codec.TensorGroup(dense={"w": np.asarray(values, np.float32)}, sparse=sparse)
    return codec.encode(codec.Update(run_id=RUN, round=number, sender=f"c{index}", groups={"delta": group},
                                     num_samples=10))


def empty_sparse() -> codec.SparseSection:
    """Finding 3's section: an empty indexed section beside the dense tensor."""
    return codec.SparseSection.with_indices((), (), np.zeros(0, np.int64), np.zeros(0, np.float32))


def honest(index: int) -> np.ndarray:
    return np.linspace(-1, 1, SIZE).astype(np.float32) * (1 + 0.1 * index)


def nan_frame(index: int, number: int = 1) -> bytes:
    """A delta with one NaN, encoded as a device that does not check would (the codec refuses to decode it)."""
    values = honest(index)
    values[3] = np.nan
    return delta_frame(index, values, number=number)
