"""Compromised devices for the robustness tests and benchmarks/attacks.py: wrappers of the simulated fleet's
client-round function that rewrite a chosen client's Update packet after its honest training (``compromised``),
train it on flipped labels (``label_flip``), or let colluders craft "a little is enough" from their own honest
updates (``alie``). Never shipped in an agent: they live here and are patched in for one run."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

import numpy as np

from fedge import codec
from fedge.fldata import read_shard, write_shard
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
def label_flip(client_ids: Collection[str], workdir: str | Path) -> Iterator[None]:
    """The clients in ``client_ids`` train honestly on their shard with every label y replaced by C - 1 - y."""
    honest = backends.train_client
    flipped: dict[str, str] = {}

    def train_client(job: Job) -> Outcome:
        if job.client.client_id not in client_ids:
            return honest(job)
        if job.client.client_id not in flipped:
            shard = read_shard(job.client.shard)
            path = Path(workdir) / f"flipped-{job.client.client_id}.npz"
            write_shard(path, dataclasses.replace(shard, train_y=(shard.num_classes - 1 - shard.train_y).astype(
                shard.train_y.dtype)))
            flipped[job.client.client_id] = str(path)
        return honest(dataclasses.replace(job, client=dataclasses.replace(job.client,
                                                                          shard=flipped[job.client.client_id])))

    backends.train_client = train_client  # type: ignore[assignment]
    try:
        yield
    finally:
        backends.train_client = honest  # type: ignore[assignment]


def alie_z(n: int, attackers: int) -> float:
    """Baruch et al.'s z_max: s = floor(n/2 + 1) - f devices must be outvoted; z = Phi^-1((n - s) / n)."""
    from statistics import NormalDist

    s = math.floor(n / 2 + 1) - attackers
    return NormalDist().inv_cdf(max(min((n - s) / n, 0.999), 0.5))


@contextlib.contextmanager
def alie(client_ids: Collection[str], cohort: int) -> Iterator[None]:
    """"A little is enough" (Baruch et al. 2019), non-omniscient: when the inline backend reaches the colluders'
    tasks of a round it trains them all honestly, and each sends mean - z * std of those honest updates, per
    coordinate (z from the cohort size and the colluder count)."""
    honest_results = backends.InlineBackend.results
    z = alie_z(cohort, len(client_ids))

    def results(self: backends.InlineBackend, timeout_s: float) -> list[Outcome]:
        colluding = [job for job in self.queue if job.client.client_id in client_ids]
        if not self.queue or not colluding or self.queue[0].client.client_id not in client_ids:
            return honest_results(self, timeout_s)
        for job in colluding:
            self.queue.remove(job)
        outcomes = [backends.train_client(job) for job in colluding]
        updates = [codec.decode(o.frame) for o in outcomes if o.frame is not None]
        if not updates:
            return outcomes
        crafted = []
        for outcome, update in zip([o for o in outcomes if o.frame is not None], updates, strict=True):
            assert isinstance(update, codec.Update)
            groups = {}
            for name, group in update.groups.items():
                dense = {}
                for tensor, array in group.dense.items():
                    if array.dtype.kind != "f":
                        dense[tensor] = array
                        continue
                    stack = np.stack([u.groups[name].dense[tensor] for u in updates  # type: ignore[union-attr]
                                      ]).astype(np.float64)
                    dense[tensor] = (stack.mean(axis=0) - z * stack.std(axis=0)).astype(np.float32)
                groups[name] = dataclasses.replace(group, dense=dense)
            crafted.append(dataclasses.replace(outcome, frame=codec.encode(dataclasses.replace(update, groups=groups))))
        return crafted + [o for o in outcomes if o.frame is None]

    backends.InlineBackend.results = results  # type: ignore[method-assign]
    try:
        yield
    finally:
        backends.InlineBackend.results = honest_results  # type: ignore[method-assign]


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
