"""Compromised devices for the robustness tests and benchmarks/attacks.py: wrappers of the simulated fleet's
client-round function that rewrite a chosen client's Update packet after its honest training. Never shipped in an
agent: they live here and are patched in for one run."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterator

import numpy as np

from fedge import codec
from fedge.protocol.events import Outcome
from fedge.simulation import backends
from fedge.simulation.worker import Job

Attack = Callable[[codec.Update], codec.Update]


def scaled_floats(group: codec.TensorGroup, factor: float) -> codec.TensorGroup:
    dense = {name: (factor * array).astype(np.float32) if array.dtype.kind == "f" else array
             for name, array in group.dense.items()}
    sparse = group.sparse
    if sparse is not None:
        sparse = dataclasses.replace(sparse, values=(factor * sparse.values).astype(np.float32))
    return dataclasses.replace(group, dense=dense, sparse=sparse)


def inflate_and_flip(claim: int = 10**9, factor: float = -20.0) -> Attack:
    """Claim ``claim`` samples (0: the honest count) and send ``factor`` times every float value (with a model
    upload: -20 times the trained model)."""
    def attack(update: codec.Update) -> codec.Update:
        groups = {name: scaled_floats(group, factor) for name, group in update.groups.items()}
        return dataclasses.replace(update, num_samples=claim or update.num_samples, groups=groups)
    return attack


def sign_flip() -> Attack:
    """Send the negated values (a model upload: the negated model)."""
    return inflate_and_flip(claim=0, factor=-1.0)


def scaled(factor: float) -> Callable[[], Attack]:
    return lambda: inflate_and_flip(claim=0, factor=factor)


def inflation() -> Attack:
    """Claim 10^9 samples, send the honest update."""
    return inflate_and_flip(factor=1.0)


def gaussian_noise(sigma: float = 1.0, seed: int = 0) -> Attack:
    """Add N(0, sigma^2) noise to every float value."""
    rng = np.random.default_rng(seed)

    def noisy(group: codec.TensorGroup) -> codec.TensorGroup:
        dense = {name: (array + sigma * rng.standard_normal(array.shape)).astype(np.float32)
                 if array.dtype.kind == "f" else array for name, array in group.dense.items()}
        return dataclasses.replace(group, dense=dense)

    def attack(update: codec.Update) -> codec.Update:
        return dataclasses.replace(update, groups={name: noisy(g) for name, g in update.groups.items()})
    return attack


ATTACKS: dict[str, Callable[[], Attack]] = {
    "inflate-flip": inflate_and_flip, "inflation": inflation, "sign-flip": sign_flip, "scale-10": scaled(10.0),
    "scale-100": scaled(100.0), "gaussian": gaussian_noise,
}


@contextlib.contextmanager
def compromised(client_ids: Collection[str], attack: Attack) -> Iterator[None]:
    """For the duration, the inline backend's clients in ``client_ids`` send ``attack`` of their honest update."""
    honest = backends.train_client

    def train_client(job: Job) -> Outcome:
        outcome = honest(job)
        if outcome.frame is None or job.client.client_id not in client_ids:
            return outcome
        update = codec.decode(outcome.frame)
        assert isinstance(update, codec.Update)
        return dataclasses.replace(outcome, frame=codec.encode(attack(update)))

    backends.train_client = train_client  # type: ignore[assignment]
    try:
        yield
    finally:
        backends.train_client = honest  # type: ignore[assignment]
