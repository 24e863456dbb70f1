"""ef's public model as the clients hold it: keyframes, the round's catch-up, and each client's replica
(docs/ef.md, "Partial participation"; docs/algorithms.md section 11.2).

The coordinator's side, ``PublicModel``, keeps
- the keyframe K, a model every client can hold exactly: it advances at keyframe rounds by a broadcast delta
  (the top fraction of S - K, S the coordinator's exact model, ef's residual being S - K);
- the round's public model P = K + dec(C), where the catch-up C is the top fraction of S - K taken at a round
  that is not a keyframe round (P = K right after a keyframe round). Every client of a round trains from P;
- the last ``history`` keyframe deltas, and what it believes of each client (``Belief``): nothing yet (before its
  first task it rebuilds the initial model from the model spec and the session seed, checked by CRC), forgotten
  (its next downlink carries K dense), or the keyframe version it holds.
A downlink is the keyframe deltas its client lacks (a chain, or K dense when the chain is not stored or encodes
larger) and the round's catch-up, described by ef's typed sub-protocol (``ef_meta.EfTask``). Keyframes come when the updates since the last one reach ``keyframe_ratio`` times
the clients absent from the round, or after ``keyframe_rounds`` rounds (``KeyframeClock``): every round at full
participation (then P = K always, and ef is its original scheme), rarely otherwise, so that a client back after
missing rounds pays one catch-up and the few keyframe deltas it missed instead of a delta per round missed.

The client's side, ``Replica``, holds K (device state), applies what a downlink carries with the same float32
``advance`` as the coordinator, and refuses to train from a model whose version or CRC differs from the one the
packet names. Pure numpy and the codec: no torch, no transport, no algorithm rule beyond what the replicas need.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedge import codec
from fedge.algorithms.base import Arrays, is_float
from fedge.algorithms.delta_store import compact, expand
from fedge.algorithms.ef_meta import EfTask, Source
from fedge.algorithms.sparse import Compressed, FlatLayout, decoded, wire_dtype
from fedge.codec import SparseSection, TensorGroup

CHECKPOINT_SCHEMA = 2  # of the coordinator's checkpointed public model (1: before the typed sub-protocol)


class Belief(enum.IntEnum):
    """What the coordinator believes of a client's replica."""

    UNSYNCED = 0   # before its first task: it rebuilds the initial model
    FORGOTTEN = 1  # not trusted: its next downlink carries the keyframe dense
    HOLDS = 2      # it holds the keyframe version the coordinator keeps beside


def float_layout(arrays: Mapping[str, np.ndarray]) -> FlatLayout:
    return FlatLayout.of(arrays, [name for name, value in arrays.items() if is_float(value)])


def advance(public: Arrays, layout: FlatLayout, indices: np.ndarray, values: np.ndarray,
            integers: Mapping[str, np.ndarray]) -> Arrays:
    """X + D: the one float32 update both sides apply, so that their copies stay bit-identical."""
    flat = layout.flat(public)
    flat[indices] += np.asarray(values, dtype=np.float32)
    moved = layout.split(flat)
    return {name: moved[name] if name in moved else np.array(integers.get(name, value), copy=True)
            for name, value in public.items()}


def public_crc(public: Arrays) -> int:
    crc = 0
    for name, value in public.items():
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(np.ascontiguousarray(value).tobytes(), crc)
    return crc


def encoded_size(groups: Mapping[str, TensorGroup]) -> int:
    return len(codec.encode(codec.Task(run_id="size", round=0, sender="algorithms", groups=dict(groups))))


def start_model(initial: Mapping[str, np.ndarray], start_dtype: str) -> Arrays:
    """The public model at version 0: the initial model rounded through ``start_dtype`` (both sides do this)."""
    start = decoded(TensorGroup(dense=dict(initial), value_dtype=start_dtype)).dense
    return {name: np.array(start[name], dtype=np.asarray(initial[name]).dtype) for name in initial}


@dataclass(frozen=True)
class Delta:
    """A sparse step of the public model: the version it applies to, its positions, its values before encoding,
    and the integer buffers it sets."""

    previous: int
    indices: np.ndarray
    values: np.ndarray
    integers: Arrays


@dataclass
class KeyframeClock:
    """When to make a keyframe: once the updates received since the last one reach ``ratio`` times the clients
    absent from the round (so every round at full participation, where a keyframe costs no client anything; 0:
    every round), or once ``max_rounds`` rounds passed since the last one (0: no such bound), since the catch-up
    approximates S - K worse the longer K stays. Checkpointed with the public model."""

    clients: int
    ratio: float
    max_rounds: int = 0
    arrived: int = 0
    rounds: int = 0

    def due(self, reported: int) -> bool:
        self.arrived += reported
        self.rounds += 1
        if self.arrived >= self.ratio * max(self.clients - reported, 0) or 0 < self.max_rounds <= self.rounds:
            self.arrived = self.rounds = 0
            return True
        return False


class PublicModel:
    """The coordinator's keyframe, the round's public model and catch-up, the keyframe history and what each client
    holds (the module docstring)."""

    def __init__(self, start: Arrays, num_clients: int, history: int, value_dtype: str, start_dtype: str,
                 keyframe_ratio: float, keyframe_rounds: int = 0, rebuildable: bool = True) -> None:
        self.layout = float_layout(start)
        self.value_dtype = wire_dtype(value_dtype)
        self.start_dtype = start_dtype
        self.history_size = history
        self.rebuildable = rebuildable
        self.key: Arrays = start
        self.key_version = 0
        self.key_crc = public_crc(start)
        self.start_crc = self.key_crc
        self.catchup: Delta | None = None
        self.public: Arrays = start
        self.version = 0
        self.crc = self.key_crc
        self.history: dict[int, Delta] = {}
        self.belief = np.full(num_clients, Belief.UNSYNCED, dtype=np.uint8)
        self.holds = np.zeros(num_clients, dtype=np.int64)  # the keyframe version, where the belief is HOLDS
        self.clock = KeyframeClock(num_clients, keyframe_ratio, keyframe_rounds)
        self.resyncs = 0
        self.groups: dict[int, tuple[Delta, TensorGroup]] = {}
        self.compact: dict[int, tuple[Delta, Arrays]] = {}  # each live delta as the checkpoint stores it
        self.sizes: dict[tuple[int, ...], int] = {}

    def forget(self, client_index: int) -> None:
        self.belief[client_index] = Belief.FORGOTTEN

    def note_holds(self, client_index: int, keyframe: int) -> None:
        """Client ``client_index``'s update says that its device holds keyframe ``keyframe``."""
        self.belief[client_index], self.holds[client_index] = Belief.HOLDS, keyframe

    def believed(self, client_index: int) -> tuple[Belief, int]:
        return Belief(int(self.belief[client_index])), int(self.holds[client_index])

    def take_resyncs(self) -> int:
        """Dense downlinks since the last call (for the round's metrics)."""
        count, self.resyncs = self.resyncs, 0
        return count

    def group(self, delta: Delta) -> TensorGroup:
        """The delta as a tensor group, one object per delta: clients sent the same deltas are sent the same
        objects, which the runtime encodes once (``coordinator.downlinks``)."""
        cached = self.groups.get(id(delta))
        if cached is None or cached[0] is not delta:
            section = SparseSection.with_indices(self.layout.names, self.layout.shapes, delta.indices, delta.values)
            cached = self.groups[id(delta)] = (delta, TensorGroup(dense=delta.integers, sparse=section,
                                                                  value_dtype=self.value_dtype))
        return cached[1]

    def size(self, key: tuple[int, ...], groups: Mapping[str, TensorGroup]) -> int:
        """The encoded size of a downlink's groups, measured once while the public model stays as it is."""
        if key not in self.sizes:
            self.sizes[key] = encoded_size(groups)
        return self.sizes[key]

    def publish(self, round_number: int, sent: Compressed, integers: Arrays, keyframe: bool) -> None:
        """The round's step ``sent`` (top fraction of S - K): a new keyframe, or the catch-up of the next round."""
        values = sent.group.sparse.values  # type: ignore[union-attr]
        narrow = np.int32 if self.layout.size < 2**31 else np.int64  # half the memory and checkpoint of int64
        step = Delta(self.key_version, sent.indices.astype(narrow), values, integers)
        moved = advance(self.key, self.layout, sent.indices, sent.decoded, integers)
        if keyframe:
            self.history[round_number] = step
            for old in sorted(self.history)[:-self.history_size]:
                del self.history[old]
            self.key, self.key_version, self.key_crc = moved, round_number, public_crc(moved)
            self.catchup, self.public, self.crc = None, self.key, self.key_crc
        else:
            self.catchup, self.public, self.crc = step, moved, public_crc(moved)
        self.version = round_number
        live = [*self.history.values(), *([self.catchup] if self.catchup is not None else [])]
        self.groups = {k: v for k, v in self.groups.items() if any(v[0] is d for d in live)}
        self.sizes = {}

    def chain(self, start: int) -> list[int] | None:
        """The stored keyframe versions leading from ``start`` to the current keyframe, or None when one is missing."""
        versions = [v for v in sorted(self.history) if v > start]
        previous = start
        for version in versions:
            if self.history[version].previous != previous:
                return None
            previous = version
        return versions if previous == self.key_version else None

    def downlink(self, client_index: int) -> tuple[dict[str, TensorGroup], dict[str, Any]]:
        """What client ``client_index`` needs to hold this round's public model: groups and meta (``EfTask``)."""
        belief, held = self.believed(client_index)
        tail: dict[str, TensorGroup] = {}
        if self.catchup is not None:
            tail["catchup"] = self.group(self.catchup)

        def described(source: Source, start: int, chain: tuple[int, ...]) -> dict[str, Any]:
            return EfTask(version=self.version, crc=self.crc, keyframe=self.key_version, keyframe_crc=self.key_crc,
                          source=source, start=start, chain=chain, catchup=self.catchup is not None,
                          start_crc=self.start_crc).to_meta()

        start = held if belief is Belief.HOLDS else 0 if belief is Belief.UNSYNCED and self.rebuildable else None
        versions = self.chain(start) if start is not None else None
        if start is not None and versions is not None:
            groups = {**{f"delta-{v}": self.group(self.history[v]) for v in versions}, **tail}
            dense_dtype = self.start_dtype if self.key_version == 0 else "f32"
            dense = {"public": TensorGroup(dense=self.key, value_dtype=dense_dtype), **tail}
            if len(versions) <= 1 or self.size(tuple(versions), groups) < self.size((), dense):
                return groups, described(Source.CHAIN, start, tuple(versions))
        self.resyncs += 1
        dense_dtype = self.start_dtype if self.key_version == 0 else "f32"
        return ({"public": TensorGroup(dense=self.key, value_dtype=dense_dtype), **tail},
                described(Source.DENSE, self.key_version, ()))

    def state_dict(self, prefix: str) -> tuple[Arrays, dict[str, Any]]:
        arrays: Arrays = {f"{prefix}key/{k}": v for k, v in self.key.items()}
        arrays[f"{prefix}holds"] = self.holds
        arrays[f"{prefix}belief"] = self.belief
        steps = {f"history/{v}": d for v, d in self.history.items()}
        if self.catchup is not None:
            steps["catchup"] = self.catchup
        for name, delta in steps.items():
            arrays.update({f"{prefix}{name}/{k}": v for k, v in self.stored(delta).items()})
            arrays.update({f"{prefix}{name}/int/{k}": v for k, v in delta.integers.items()})
        meta = {"schema": CHECKPOINT_SCHEMA, "version": self.version, "key_version": self.key_version,
                "arrived": self.clock.arrived,
                "rounds_since_key": self.clock.rounds,
                "history": [[v, d.previous] for v, d in self.history.items()],
                "catchup": None if self.catchup is None else self.catchup.previous}
        return arrays, meta

    def stored(self, delta: Delta) -> Arrays:
        """A delta as the checkpoint keeps it (``delta_store.compact``), made once per delta."""
        cached = self.compact.get(id(delta))
        if cached is not None and cached[0] is delta:
            return cached[1]
        form = compact(self.layout, delta.indices, delta.values)
        live = {id(d) for d in (*self.history.values(), self.catchup) if d is not None}
        self.compact = {k: v for k, v in self.compact.items() if k in live}
        self.compact[id(delta)] = (delta, form)
        return form

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any], prefix: str) -> None:
        def delta(name: str, previous: int) -> Delta:
            ints = f"{prefix}{name}/int/"
            indices, values = expand(self.layout, arrays, f"{prefix}{name}/")
            return Delta(int(previous), indices, values,
                         {k[len(ints):]: v.copy() for k, v in arrays.items() if k.startswith(ints)})

        if meta.get("schema") != CHECKPOINT_SCHEMA:
            raise ValueError(f"this ef checkpoint is of schema {meta.get('schema', 1)}, this Fedge reads schema "
                             f"{CHECKPOINT_SCHEMA} (ef's typed sub-protocol): finish the run with the Fedge that wrote "
                             "it")
        key = f"{prefix}key/"
        self.key = {k[len(key):]: v.copy() for k, v in arrays.items() if k.startswith(key)}
        self.key_version, self.key_crc = int(meta["key_version"]), public_crc(self.key)
        self.holds = np.array(arrays[f"{prefix}holds"], dtype=np.int64)
        self.belief = np.array(arrays[f"{prefix}belief"], dtype=np.uint8)
        self.clock.arrived, self.clock.rounds = int(meta["arrived"]), int(meta["rounds_since_key"])
        self.history = {int(v): delta(f"history/{v}", p) for v, p in meta["history"]}
        self.catchup = None if meta["catchup"] is None else delta("catchup", meta["catchup"])
        self.public = self.key if self.catchup is None else advance(
            self.key, self.layout, self.catchup.indices, decoded(self.group(self.catchup)).sparse.values,  # type: ignore[union-attr]
            self.catchup.integers)
        self.version, self.crc = int(meta["version"]), public_crc(self.public)
        self.groups, self.sizes = {}, {}


class Replica:
    """A client's copy of the keyframe (device state) and the round's public model it trains from."""

    def __init__(self, start_dtype: str) -> None:
        self.start_dtype = start_dtype
        self.initial: Arrays | None = None  # the initial model as this device built it (``initial_model``)
        self.key: Arrays = {}
        self.version: int | None = None     # the keyframe version held; None: no replica yet

    def rebuild(self, crc: int) -> None:
        if self.initial is None:
            raise RuntimeError("ef: the packet asks this device to rebuild the initial model, which it was not given; "
                               "the coordinator must resync it densely")
        self.key, self.version = start_model(self.initial, self.start_dtype), 0
        if public_crc(self.key) != crc:
            raise RuntimeError("ef: the initial model rebuilt on this device differs from the coordinator's (another "
                               "torch version, or model.init?); the coordinator resyncs it densely")

    def sync(self, groups: Mapping[str, TensorGroup], task: EfTask) -> Arrays:
        """Bring the keyframe to the version the task names, check it, and return the round's public model."""
        for needed in ("public",) * (task.source is Source.DENSE) + ("catchup",) * task.catchup:
            if needed not in groups:
                raise ValueError(f"ef: the task names group {needed!r} but does not carry it")
        if task.source is Source.DENSE:
            self.key = {k: np.array(v, copy=True) for k, v in groups["public"].dense.items()}
            self.version = task.keyframe
        elif self.version is None and task.start == 0:
            self.rebuild(task.start_crc)
        elif self.version is None or self.version < task.start:
            raise RuntimeError(f"ef: the replica is at version {self.version} but the task starts at {task.start}; "
                               "the coordinator must resync this client densely (forget)")
        for version in task.chain:
            if version > self.version:  # type: ignore[operator]
                self.key = self.apply(self.key, groups[f"delta-{version}"], f"delta-{version}")
                self.version = version
        if self.version != task.keyframe or public_crc(self.key) != task.keyframe_crc:
            raise RuntimeError(f"ef: the replica (version {self.version}) differs from the keyframe "
                               f"(version {task.keyframe}); it needs a dense resync")
        if not task.catchup:
            return self.key
        public = self.apply(self.key, groups["catchup"], "catchup")
        if public_crc(public) != task.crc:
            raise RuntimeError(f"ef: the round's public model (version {task.version}) rebuilt here differs from "
                               "the coordinator's; it needs a dense resync")
        return public

    @staticmethod
    def apply(arrays: Arrays, group: TensorGroup, name: str) -> Arrays:
        section = group.sparse
        if section is None:
            raise ValueError(f"ef: {name} carries no sparse section")
        return advance(arrays, FlatLayout(section.names, section.shapes), section.positions(), section.values,
                       group.dense)

    def state_dict(self) -> Arrays:
        state: Arrays = {"ef/schema": np.array(CHECKPOINT_SCHEMA, dtype=np.int64)}
        if self.version is not None:
            state.update({f"ef/public/{k}": v for k, v in self.key.items()})
            state["ef/version"] = np.array(self.version, dtype=np.int64)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        ef_keys = [k for k in state if k.startswith("ef/")]
        if ef_keys and int(state.get("ef/schema", 1)) != CHECKPOINT_SCHEMA:
            raise ValueError(f"this device's ef state is of schema {int(state.get('ef/schema', 1))}, this Fedge "
                             f"reads schema {CHECKPOINT_SCHEMA}: start a new session")
        self.key = {k[len("ef/public/"):]: np.array(v, copy=True) for k, v in state.items()
                    if k.startswith("ef/public/")}
        self.version = int(state["ef/version"]) if "ef/version" in state else None
