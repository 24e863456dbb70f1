"""Hostile updates: structural mutations of an honest Update, for the hostile cells (tests/test_hostile_cells.py)
and benchmarks/attacks.py.

Each mutation is a pure function of the honest Update packet a device would send (and the packets it sent before,
for a replay) to the frames a compromised device sends in its place: missing, extra and empty groups, tensors and
sections; wrong shapes and dtypes; duplicate, unsorted and out-of-range sparse indices; NaN and infinities; negative,
zero and huge sample counts and steps; the wrong round, run or sender; a replay of an earlier update; frames cut
short, of garbage, of another wire version, or past the codec's size limit. Every mutation applies to every
algorithm's update: where the update has no sparse section, the index mutations add one (an extra section with bad
indices). What the coordinator must then do is the mutation's ``expect``:

- ``refused``: the frames are refused with a reason naming the device, and the round closes as if the device had
  sent nothing;
- ``bounded``: the claim is counted as at most the weight cap (docs/robustness.md), so the round closes as if the
  device had sent its honest update claiming the cap;
- ``harmless``: the field changes nothing the coordinator aggregates (a step count; a second copy of an update
  already accepted; meta the algorithm does not read; a float64 tensor, which arrives as float32), so the round
  closes as if the device had sent its honest update;
- ``rounded``: a float16 tensor arrives as float32, accepted with the precision the device gave up: the round
  closes as if the honest update had been rounded through float16 (``rounded_f16``);
- ``zeroed``: an emptied section of a sparse update is a zero update: the round closes as if the honest update's
  section values had all been zero (``zeroed``).

A mutation's expectation may depend on the honest update (``Mutation.outcome``). What the codec refuses to build
(a negative count, an index list that is not a sorted set, a NaN in an f16 block) is built at byte level
(tests/hostile_bytes.py). Each mutation names its class (``kind``: a group, a tensor, an index, ...).

``STAGE_MUTATIONS`` are the secure-aggregation counterparts: stage messages for another round or attempt, from
another device, with a share missing or doubled. Pure: no I/O, no session; nothing here is shipped in an agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedge import codec
from fedge.codec.errors import Limits
from fedge.codec.sparse import SparseSection
from tests.hostile_bytes import join_packet, nonfinite_bytes, raw_index_section, split_packet, with_body

REFUSED, BOUNDED, HARMLESS = "refused", "bounded", "harmless"
ROUNDED, ZEROED = "rounded", "zeroed"
Expect = str | Callable[[codec.Update], str]


@dataclass(frozen=True)
class Mutation:
    """``make(honest frame, earlier frames of the same device) -> frames sent in its place``; ``expect``: one of
    the outcomes above, or a function of the honest update giving one (an update with meta, a sparse section)."""

    name: str
    make: Callable[[bytes, Sequence[bytes]], list[bytes]]
    expect: Expect = REFUSED
    kind: str = ""  # the class of hostile input (a group, a tensor, an index, ...) the benchmark's table groups by

    def outcome(self, honest: codec.Update) -> str:
        return self.expect if isinstance(self.expect, str) else self.expect(honest)


def decoded(frame: bytes) -> codec.Update:
    update = codec.decode(frame)
    assert isinstance(update, codec.Update), type(update)
    return update


def encoded(update: codec.Update) -> bytes:
    """Encode without the codec's own checks of values (a device may send what an honest encoder refuses)."""
    return codec.encode(update)


def on_update(change: Callable[[codec.Update], codec.Update]) -> Callable[[bytes, Sequence[bytes]], list[bytes]]:
    return lambda frame, _earlier: [encoded(change(decoded(frame)))]


def first_group(update: codec.Update) -> str:
    return sorted(update.groups)[0]


def with_group(update: codec.Update, name: str, group: codec.TensorGroup | None) -> codec.Update:
    groups = dict(update.groups)
    if group is None:
        groups.pop(name, None)
    else:
        groups[name] = group
    return dataclasses.replace(update, groups=groups)


def float_tensor(group: codec.TensorGroup) -> str | None:
    return next((n for n, a in sorted(group.dense.items()) if a.dtype.kind == "f" and a.size > 1), None)


def on_first_float(update: codec.Update, change: Callable[[np.ndarray], np.ndarray]) -> codec.Update:
    """``change`` applied to the first dense float tensor of the update (by group, then tensor name); an update
    with no dense float tensor gets its first sparse section's values changed."""
    for name in sorted(update.groups):
        group = update.groups[name]
        tensor = float_tensor(group)
        if tensor is not None:
            return with_group(update, name, dataclasses.replace(
                group, dense={**group.dense, tensor: change(np.array(group.dense[tensor]))}))
    for name in sorted(update.groups):
        group = update.groups[name]
        if group.sparse is not None and group.sparse.values.size:
            values = change(np.array(group.sparse.values)).astype(np.float32)
            if values.size != group.sparse.values.size:
                values = np.resize(values, group.sparse.values.size)
            return with_group(update, name, dataclasses.replace(group, sparse=dataclasses.replace(
                group.sparse, values=values)))
    raise AssertionError("an update with no float values")


def poisoned(value: float) -> Callable[[codec.Update], codec.Update]:
    def change(array: np.ndarray) -> np.ndarray:
        out = array.copy()
        out.reshape(-1)[0] = value
        return out
    return lambda update: on_first_float(update, change)


def nonfinite_frame(value: float) -> Callable[[bytes, Sequence[bytes]], list[bytes]]:
    """The codec's encoder refuses NaN too. In an f32 group the value is written into the honest packet's first
    float tensor with the codec's own decoder told to allow it, then encoded again (f32 carries every bit pattern);
    in a group of a lossy encoding (ef's f16 sections) it is written into the first value of the encoded block at
    byte level (``nonfinite_bytes``)."""
    def make(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
        update = codec.decode(frame, Limits(allow_nonfinite=True))
        assert isinstance(update, codec.Update)
        if any(float_tensor(g) is not None and g.value_dtype == "f32" for g in update.groups.values()) or \
                all(g.value_dtype == "f32" for g in update.groups.values()):
            return [codec.encode(poisoned(value)(update))]
        return [nonfinite_bytes(frame, value)]
    return make


def header_field(**changes: Any) -> Callable[[bytes, Sequence[bytes]], list[bytes]]:
    """The honest packet with header fields (wire keys: ``n`` samples, ``st`` steps) set to what the codec refuses
    to build."""
    def make(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
        kind, header, body = split_packet(frame)
        return [join_packet(kind, {**header, **changes}, body)]
    return make


# ----------------------------------------------------------------------------------------------- groups, sections
def missing_group(update: codec.Update) -> codec.Update:
    return with_group(update, first_group(update), None)


def extra_group(update: codec.Update) -> codec.Update:
    group = update.groups[first_group(update)]
    return with_group(update, "hostile", dataclasses.replace(group))


def empty_group(update: codec.Update) -> codec.Update:
    return with_group(update, first_group(update), codec.TensorGroup())


def no_groups(update: codec.Update) -> codec.Update:
    return dataclasses.replace(update, groups={})


def missing_tensor(update: codec.Update) -> codec.Update:
    name = first_group(update)
    group = update.groups[name]
    if group.dense:
        dense = dict(group.dense)
        dense.pop(sorted(dense)[0])
        return with_group(update, name, dataclasses.replace(group, dense=dense))
    return with_group(update, name, dataclasses.replace(group, sparse=None))


def extra_tensor(update: codec.Update) -> codec.Update:
    name = first_group(update)
    group = update.groups[name]
    return with_group(update, name, dataclasses.replace(
        group, dense={**group.dense, "hostile.weight": np.ones((3, 2), np.float32)}))


def empty_sparse_section(update: codec.Update) -> codec.Update:
    """A dense group that also carries an empty index section."""
    name = first_group(update)
    group = update.groups[name]
    if group.sparse is not None:  # a sparse group: its section emptied
        sparse = group.sparse
        return with_group(update, name, dataclasses.replace(group, sparse=SparseSection.with_indices(
            sparse.names, sparse.shapes, np.zeros(0, np.int64), np.zeros(0, np.float32))))
    return with_group(update, name, dataclasses.replace(group, sparse=SparseSection.with_indices(
        (), (), np.zeros(0, np.int64), np.zeros(0, np.float32))))


def dense_beside_sparse(update: codec.Update) -> codec.Update:
    """A sparse group that also carries a dense tensor, or a dense group that also carries a real index section."""
    name = first_group(update)
    group = update.groups[name]
    if group.sparse is not None:
        tensor = group.sparse.names[0]
        return with_group(update, name, dataclasses.replace(
            group, dense={**group.dense, f"{tensor}.dense": np.ones(group.sparse.shapes[0], np.float32)}))
    tensor = float_tensor(group) or sorted(group.dense)[0]
    size = int(np.prod(group.dense[tensor].shape))
    return with_group(update, name, dataclasses.replace(group, sparse=SparseSection.with_indices(
        ("hostile",), ((size,),), np.arange(min(size, 4)), np.ones(min(size, 4), np.float32))))


def sparse_indices(kind: str) -> Callable[[bytes, Sequence[bytes]], list[bytes]]:
    """The first sparse section's positions made duplicate, unsorted, negative or out of range, written at byte
    level (``raw_index_section``: the codec refuses to encode such a list). A masked-values section (DSSA, ef-shared:
    its positions are the mask's, which the update does not carry) becomes an index section over the same tensors
    with its values at the first positions; an update without a section gets one over a 16-element tensor."""
    def make(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
        update = decoded(frame)
        for name in sorted(update.groups):
            group = update.groups[name]
            sparse = group.sparse
            if sparse is not None and sparse.values.size > 2:
                positions = np.array(sparse.indices if sparse.indices is not None else
                                     np.arange(sparse.values.size), np.int64)
                return [raw_index_section(group, sparse.names, sparse.shapes, bad(kind, positions, sparse.size),
                                          np.array(sparse.values, np.float32))(update, name)]
        name = first_group(update)
        return [raw_index_section(update.groups[name], ("hostile",), ((16,),), bad(kind, np.arange(4), 16),
                                  np.ones(4, np.float32))(update, name)]
    return make


def bad(kind: str, positions: np.ndarray, size: int) -> np.ndarray:
    out = positions.astype(np.int64).copy()
    if kind == "duplicate":
        out[1] = out[0]
    elif kind == "unsorted":
        out[0], out[1] = out[1], out[0]
    elif kind == "out-of-range":
        out[-1] = size + 7
    elif kind == "negative":
        out[0] = -1
    return out


def value_count(update: codec.Update) -> codec.Update:
    """A sparse section with one value fewer than its indices (or a dense tensor with an element fewer)."""
    for name in sorted(update.groups):
        group = update.groups[name]
        if group.sparse is not None and group.sparse.values.size > 1:
            return with_group(update, name, dataclasses.replace(group, sparse=dataclasses.replace(
                group.sparse, values=np.array(group.sparse.values[:-1]))))
    return on_first_float(update, lambda a: a.reshape(-1)[:-1])


# ----------------------------------------------------------------------------------------------- shapes, dtypes
def has_dense_float(update: codec.Update) -> bool:
    return any(float_tensor(group) is not None for group in update.groups.values())


def on_section_shape(update: codec.Update, change: Callable[[tuple[int, ...]], tuple[int, ...]]) -> codec.Update:
    """An update with no dense float tensor (ef's sections): its first section's first tensor declared in the
    shape ``change`` gives (of as many elements, so the index field still fits it)."""
    for name in sorted(update.groups):
        group = update.groups[name]
        if group.sparse is not None:
            shapes = (change(group.sparse.shapes[0]), *group.sparse.shapes[1:])
            return with_group(update, name, dataclasses.replace(group, sparse=dataclasses.replace(
                group.sparse, shapes=shapes, local_cache={})))
    raise AssertionError("an update with neither a dense float tensor nor a sparse section")


def wrong_shape(update: codec.Update) -> codec.Update:
    if not has_dense_float(update):
        return on_section_shape(update, lambda s: tuple(reversed(s)) if len(s) > 1 and s[0] != s[-1] else (1, *s))
    return on_first_float(update, lambda a: a.reshape(-1)[:-1].reshape(-1, 1) if a.size > 2 else np.zeros(3, a.dtype))


def flattened(update: codec.Update) -> codec.Update:
    if not has_dense_float(update):
        return on_section_shape(update, lambda s: (int(np.prod(s)),) if len(s) > 1 else (1, *s))
    return on_first_float(update, lambda a: a.reshape(-1) if a.ndim > 1 else a.reshape(1, -1))


def dtype(to: Any) -> Callable[[bytes, Sequence[bytes]], list[bytes]]:
    """The first dense float tensor sent in dtype ``to`` (the codec sends any float as float32, an integer array
    raw). An update with no dense float tensor (ef's sections, whose values travel in the group's value encoding
    whatever their dtype): its section's values in ``to`` if it is a float, else, at byte level, its first
    section tensor also in the dense table as ``to`` (the wire's one way to send a tensor's integers). An update
    of integers only (a masked update's words): its first tensor in ``to``."""
    def make(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
        update = decoded(frame)
        if has_dense_float(update) or np.dtype(to).kind == "f" and any(g.sparse for g in update.groups.values()):
            return [encoded(on_first_float(update, lambda a: a.astype(to)))]
        words = next(((n, g) for n, g in sorted(update.groups.items()) if g.dense), None)
        if words is not None:  # integers only (a masked update's words): the first tensor in ``to``
            name, group = words
            tensor = sorted(group.dense)[0]
            return [encoded(with_group(update, name, dataclasses.replace(
                group, dense={**group.dense, tensor: np.asarray(group.dense[tensor]).astype(to)})))]

        def change(body: dict[str, Any]) -> None:
            for name in sorted(body["g"]):
                group = body["g"][name]
                if group["sp"] is not None:
                    tensor, shape = group["sp"]["names"][0], group["sp"]["shapes"][0]
                    group["t"].append([tensor, "i32", shape])
                    group["i"] = bytes(group["i"]) + bytes(4 * int(np.prod(shape)))
                    return
            raise AssertionError("an update with neither a dense float tensor nor a sparse section")
        return [with_body(frame, change)]
    return make


def rounded_f16(update: codec.Update) -> codec.Update:
    """The honest update whose first float tensor lost its precision to float16 (the ``float16`` mutation's
    expected round: the codec sends it as float32, rounded)."""
    return on_first_float(update, lambda a: a.astype(np.float16).astype(np.float32))


def zeroed(update: codec.Update) -> codec.Update:
    """The honest update with its first group's section values zero (``empty_sparse_section``'s expected round)."""
    name = first_group(update)
    group = update.groups[name]
    assert group.sparse is not None
    return with_group(update, name, dataclasses.replace(group, sparse=dataclasses.replace(
        group.sparse, values=np.zeros_like(group.sparse.values), local_cache={})))


def if_sparse(yes: str, no: str) -> Callable[[codec.Update], str]:
    """``yes`` where the update's first group (the one a section mutation changes) carries a section."""
    return lambda update: yes if update.groups[first_group(update)].sparse is not None else no


def if_meta(yes: str, no: str) -> Callable[[codec.Update], str]:
    return lambda update: yes if update.meta else no


# ----------------------------------------------------------------------------------------------- runtime fields
def field(**changes: Any) -> Callable[[codec.Update], codec.Update]:
    def change(update: codec.Update) -> codec.Update:
        values = {k: (v(update) if callable(v) else v) for k, v in changes.items()}
        return dataclasses.replace(update, **values)
    return change


def extra_meta(update: codec.Update) -> codec.Update:
    return dataclasses.replace(update, meta={**update.meta, "hostile": "x" * 64})


def reserved_meta(update: codec.Update) -> codec.Update:
    """A meta key only the coordinator sets (the contributors of a securely aggregated sum)."""
    from fedge.protocol.payload import SECURE_CONTRIBUTORS

    return dataclasses.replace(update, meta={**update.meta, SECURE_CONTRIBUTORS: ["agent-01"]})


def meta_wrong_type(update: codec.Update) -> codec.Update:
    """Every meta value replaced by a string (an update with no meta gets one unexpected key)."""
    if not update.meta:
        return extra_meta(update)
    return dataclasses.replace(update, meta={k: "not a number" for k in update.meta})


# ----------------------------------------------------------------------------------------------- frames
def truncated(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    return [frame[: len(frame) // 2]]


def flipped_byte(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    out = bytearray(frame)
    out[len(out) // 2] ^= 0xFF
    return [bytes(out)]


def garbage(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    return [np.random.default_rng(len(frame)).integers(0, 256, len(frame), dtype=np.uint8).tobytes()]


def other_version(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    out = bytearray(frame)
    out[4] = codec.PROTOCOL_VERSION + 1
    return [bytes(out)]


def over_limit(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    """The honest packet padded one byte past the codec's packet limit."""
    return [frame + bytes(Limits().max_packet_bytes + 1 - len(frame))]


def at_meta_limit(update: codec.Update) -> codec.Update:
    """An unexpected meta value as large as the codec lets a meta map be (a packet at the meta limit)."""
    return dataclasses.replace(update, meta={**update.meta, "hostile": "x" * (Limits().max_meta_bytes - 4096)})


def replay_earlier(frame: bytes, earlier: Sequence[bytes]) -> list[bytes]:
    """The device's update of an earlier round, sent again as it was (its first task: this update labelled with
    the round before)."""
    if earlier:
        return [earlier[-1]]
    update = decoded(frame)
    return [encoded(dataclasses.replace(update, round=update.round - 1))]


def twice(frame: bytes, _earlier: Sequence[bytes]) -> list[bytes]:
    return [frame, frame]


def replay_relabelled(frame: bytes, earlier: Sequence[bytes]) -> list[bytes]:
    """An earlier round's update carrying this round's number: a stale base (the coordinator cannot tell stale
    values from fresh ones; what it can refuse is what does not fit this round's task: DSSA's support, ef's
    keyframe). Kept as a mutation, not a cell (see test_hostile_cells)."""
    if not earlier:
        return [frame]
    return [encoded(dataclasses.replace(decoded(earlier[-1]), round=decoded(frame).round))]


GROUP, TENSOR, SECTION, INDEX, SHAPE, DTYPE, NONFINITE, COUNT, HEADER, META, REPLAY, FRAME = (
    "group", "tensor", "section", "index", "shape", "dtype", "non-finite", "count", "header", "meta", "replay",
    "frame")
MUTATIONS: tuple[Mutation, ...] = (
    Mutation("missing-group", on_update(missing_group), kind=GROUP),
    Mutation("extra-group", on_update(extra_group), kind=GROUP),
    Mutation("empty-group", on_update(empty_group), kind=GROUP),
    Mutation("no-groups", on_update(no_groups), kind=GROUP),
    Mutation("missing-tensor", on_update(missing_tensor), kind=TENSOR),
    Mutation("extra-tensor", on_update(extra_tensor), kind=TENSOR),
    # an emptied section of a sparse update is a zero update (accepted); on a dense one it is a section too many
    Mutation("empty-sparse-section", on_update(empty_sparse_section), if_sparse(ZEROED, REFUSED), kind=SECTION),
    Mutation("extra-section", on_update(dense_beside_sparse), kind=SECTION),
    Mutation("duplicate-indices", sparse_indices("duplicate"), kind=INDEX),
    Mutation("unsorted-indices", sparse_indices("unsorted"), kind=INDEX),
    Mutation("out-of-range-index", sparse_indices("out-of-range"), kind=INDEX),
    Mutation("negative-index", sparse_indices("negative"), kind=INDEX),
    Mutation("value-count", on_update(value_count), kind=INDEX),
    Mutation("wrong-shape", on_update(wrong_shape), kind=SHAPE),
    Mutation("flattened-shape", on_update(flattened), kind=SHAPE),
    # floats arrive as float32 whatever the device's dtype: a float64 tensor loses nothing, a float16 one its own
    # precision; an integer tensor where the model's is float is refused
    Mutation("float64", dtype(np.float64), HARMLESS, kind=DTYPE),
    Mutation("float16", dtype(np.float16), ROUNDED, kind=DTYPE),
    Mutation("int32", dtype(np.int32), kind=DTYPE),
    Mutation("nan", nonfinite_frame(float("nan")), kind=NONFINITE),
    Mutation("inf", nonfinite_frame(float("inf")), kind=NONFINITE),
    Mutation("neg-inf", nonfinite_frame(float("-inf")), kind=NONFINITE),
    Mutation("negative-samples", header_field(n=-5), kind=COUNT),
    Mutation("zero-samples", on_update(field(num_samples=0)), kind=COUNT),
    Mutation("huge-samples", on_update(field(num_samples=2**62)), BOUNDED, kind=COUNT),
    Mutation("negative-steps", header_field(st=-1), kind=COUNT),
    Mutation("huge-steps", on_update(field(steps=2**62)), HARMLESS, kind=COUNT),
    Mutation("nan-loss", on_update(field(train_loss=float("nan"))), HARMLESS, kind=COUNT),
    Mutation("next-round", on_update(field(round=lambda u: u.round + 1)), kind=HEADER),
    Mutation("previous-round", on_update(field(round=lambda u: u.round - 1)), kind=HEADER),
    Mutation("other-run", on_update(field(run_id="another-run")), kind=HEADER),
    Mutation("other-sender", on_update(field(sender="c-impostor")), kind=HEADER),
    # meta the algorithm does not read is ignored; a meta key it reads, of another type, is refused
    Mutation("extra-meta", on_update(extra_meta), HARMLESS, kind=META),
    Mutation("meta-wrong-type", on_update(meta_wrong_type), if_meta(REFUSED, HARMLESS), kind=META),
    Mutation("meta-at-limit", on_update(at_meta_limit), HARMLESS, kind=META),
    Mutation("reserved-meta", on_update(reserved_meta), kind=META),
    Mutation("replay-earlier", replay_earlier, kind=REPLAY),
    Mutation("duplicate-update", twice, HARMLESS, kind=REPLAY),
    Mutation("truncated", truncated, kind=FRAME),
    Mutation("flipped-byte", flipped_byte, kind=FRAME),
    Mutation("garbage", garbage, kind=FRAME),
    Mutation("other-version", other_version, kind=FRAME),
    Mutation("over-limit", over_limit, kind=FRAME),
)
KINDS = (GROUP, TENSOR, SECTION, INDEX, SHAPE, DTYPE, NONFINITE, COUNT, HEADER, META, REPLAY, FRAME)


def mutation(name: str) -> Mutation:
    return next(m for m in MUTATIONS if m.name == name)


# ----------------------------------------------------------------------------------------------- secure aggregation
@dataclass(frozen=True)
class StageMutation:
    """A change to one secure-aggregation message of the attacked device (``kind``: keys, shares, reveal or the
    masked update); ``expect``: ``refused`` (the round closes as if the device had not sent that message) or
    ``harmless`` (the sum is the honest one: a reveal that others' reveals replace)."""

    name: str
    kind: type[codec.MessageBase]
    change: Callable[[Any, str], Any]  # (message, another device's id) -> message
    expect: str = REFUSED


def stage_frames(mutation: StageMutation, other: str) -> Callable[[bytes], list[bytes]]:
    return lambda frame: [codec.encode(mutation.change(codec.decode(frame), other))]


def shares_short(message: codec.SecAggShares, _other: str) -> codec.SecAggShares:
    return dataclasses.replace(message, shares=message.shares[:-1])


def shares_doubled(message: codec.SecAggShares, _other: str) -> codec.SecAggShares:
    return dataclasses.replace(message, shares=(*message.shares, message.shares[0]))


def shares_to_self(message: codec.SecAggShares, _other: str) -> codec.SecAggShares:
    return dataclasses.replace(message, shares=tuple((message.sender, sealed) for _, sealed in message.shares))


def masked_short(update: codec.Update, _other: str) -> codec.Update:
    group = update.groups[first_group(update)]
    tensor = sorted(group.dense)[0]
    return with_group(update, first_group(update), dataclasses.replace(
        group, dense={**group.dense, tensor: np.array(group.dense[tensor]).reshape(-1)[:-1]}))


def masked_extra_group(update: codec.Update, _other: str) -> codec.Update:
    return extra_group(update)


STAGE_MUTATIONS: tuple[StageMutation, ...] = (
    StageMutation("keys-next-round", codec.SecAggKeys, lambda m, _o: dataclasses.replace(m, round=m.round + 1)),
    StageMutation("keys-next-attempt", codec.SecAggKeys, lambda m, _o: dataclasses.replace(m, attempt=m.attempt + 1)),
    StageMutation("keys-as-another", codec.SecAggKeys, lambda m, o: dataclasses.replace(m, sender=o)),
    StageMutation("shares-next-round", codec.SecAggShares, lambda m, _o: dataclasses.replace(m, round=m.round + 1)),
    StageMutation("shares-one-short", codec.SecAggShares, shares_short),
    StageMutation("shares-one-doubled", codec.SecAggShares, shares_doubled),
    StageMutation("shares-to-itself", codec.SecAggShares, shares_to_self),
    StageMutation("reveal-next-round", codec.SecAggReveal, lambda m, _o: dataclasses.replace(m, round=m.round + 1),
                  HARMLESS),
    StageMutation("reveal-next-attempt", codec.SecAggReveal,
                  lambda m, _o: dataclasses.replace(m, attempt=m.attempt + 1), HARMLESS),
    StageMutation("masked-short", codec.Update, masked_short),
    StageMutation("masked-extra-group", codec.Update, masked_extra_group),
    StageMutation("masked-next-round", codec.Update, lambda m, _o: dataclasses.replace(m, round=m.round + 1)),
)
