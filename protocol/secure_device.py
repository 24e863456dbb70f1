"""A device's side of a securely aggregated round, with no I/O: ``secagg.device.SecAggDevice`` behind the codec's
messages, and how a masked input travels in an Update (docs/secure-aggregation.md).

``SecureDevice`` is made from a Task whose ``secagg`` settings are set, over the device's float tensors' sizes: it
reads the round's grid and setup (refusing nonsense with ``ValueError``), advertises its keys (``keys``), answers
the roster with its sealed shares and the unmask request with its reveal (``receive``), keeps its delivery, and
masks its change once both the change and the delivery are there (``masked_group``); ``SecureTask`` is what an
agent holds of such a task (the model it was sent, its plaintext update until the delivery). What it refuses raises
``secagg.device.Refused`` with the reason: the driver reports the round failed and sends nothing more for it. The
masked words travel as the Update's one group ``secagg``, one dense unsigned tensor ``words`` of the narrowest
width that holds ``bits`` (``masked_group``, read back by ``masked_words``). No sockets, threads or clocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedge import codec
from fedge.protocol.payload import DELTA_GROUP, MODEL_GROUP, SUPPORT_GROUP
from fedge.secagg import field, shamir
from fedge.secagg.device import Refused, SecAggDevice
from fedge.secagg.distributed import NoisyGrid
from fedge.secagg.encoding import Grid, grid_of, rounding_rng, setup_of
from fedge.secagg.messages import Delivery, Keys, Roster, SealedShare, UnmaskRequest

MASKED_GROUP = "secagg"
MASKED_TENSOR = "words"
# An Update's fields a securely aggregated round leaves out: computed from the device's data or its change
DROPPED_FIELDS = ("evaluation", "personal_accuracy", "train_loss", "clip_scale")
# The meter's fields it sends as null: counted from the change (how many parameters it moved, and the optimizer's
# FLOPs on those, which give the count back divided by the steps and FLOPs per element the record keeps)
DROPPED_RECORD_FIELDS = frozenset({"params_updated", "flops_opt_updated"})


def word_dtype(bits: int) -> np.dtype[np.unsignedinteger]:
    """The narrowest unsigned integer that holds a word of ``bits`` bits."""
    for width in (8, 16, 32, 64):
        if bits <= width:
            return np.dtype(f"<u{width // 8}")
    raise ValueError(f"{bits} bits")


def masked_group(words: field.U64, bits: int) -> codec.TensorGroup:
    return codec.TensorGroup(dense={MASKED_TENSOR: np.asarray(words, np.uint64).astype(word_dtype(bits))})


def masked_words(groups: Mapping[str, codec.TensorGroup], size: int, bits: int) -> tuple[field.U64 | None, str]:
    """The masked words an Update carries, or None and why they cannot be used."""
    group = groups.get(MASKED_GROUP)
    if set(groups) != {MASKED_GROUP} or group is None or set(group.dense) != {MASKED_TENSOR} or \
            group.sparse is not None:
        return None, f"a securely aggregated update carries exactly the group {MASKED_GROUP!r} with its tensor " \
                     f"{MASKED_TENSOR!r}"
    words = group.dense[MASKED_TENSOR]
    if words.dtype != word_dtype(bits) or words.shape != (size,):
        return None, f"masked words of dtype {words.dtype} and shape {words.shape}; the round needs {size} of " \
                     f"{word_dtype(bits)}"
    return np.asarray(words).astype(np.uint64), ""


@dataclass(frozen=True)
class SecureLayout:
    """The coordinates a securely aggregated round masks, in order, as both sides read them from the round's task
    (``of_task``): its published support (``SUPPORT_GROUP``: ef-shared's mask, its selected coordinates), or else its
    model group (``of``): each dense float tensor, then, when the group is sparse (a DSSA round's retained values and
    mask), the complement of its mask, the coordinates every device sends. ``sizes`` are the grid's tensors;
    ``support`` the masked coordinates in the model's flat space (dense tensors first, then the sparse section's),
    bound into every key. ``change`` reads a device's update group as that vector (less ``reference`` for a model
    upload's dense tensors), and ``groups`` writes a mean vector back as the ``delta`` group the server half folds."""

    dense: tuple[tuple[str, tuple[int, ...]], ...]
    section: codec.SparseSection | None = None  # the model group's sparse section (kind "mask"), or the support's
    select: bool = False                        # the side of its mask that is sent: the support's (True) or not

    @classmethod
    def of_task(cls, groups: Mapping[str, codec.TensorGroup]) -> SecureLayout:
        support = groups.get(SUPPORT_GROUP)
        if support is None:
            model = groups.get(MODEL_GROUP)
            if model is None:
                raise ValueError(f"a securely aggregated task carries its model as the group {MODEL_GROUP!r} or "
                                 f"publishes its support as the group {SUPPORT_GROUP!r}")
            return cls.of(model)
        section = support.sparse
        if support.dense or section is None or section.kind != "mask" or section.mask is None:
            raise ValueError("a published support is one sparse section that carries its mask")
        return cls((), section, select=True)

    @classmethod
    def of(cls, model: codec.TensorGroup) -> SecureLayout:
        section = model.sparse
        if section is not None and (section.kind != "mask" or section.mask is None or not section.select):
            raise ValueError("a securely aggregated round's model group is dense, or sparse on a mask it carries")
        return cls(tuple((name, tuple(np.shape(a))) for name, a in model.dense.items() if np.asarray(a).dtype.kind == "f"),
                   section)

    @property
    def sizes(self) -> list[int]:
        sizes = [int(np.prod(shape)) for _, shape in self.dense]
        if self.section is not None and self.section.mask is not None:
            sizes.append(int(np.count_nonzero(self.section.mask == self.select)))
        return sizes

    @property
    def support(self) -> npt.NDArray[np.int64] | None:
        if self.section is None or self.section.mask is None:
            return None
        dense = sum(int(np.prod(shape)) for _, shape in self.dense)
        return np.concatenate([np.arange(dense), dense + np.flatnonzero(self.section.mask == self.select)]
                              ).astype(np.int64)

    def change(self, group: codec.TensorGroup, reference: Mapping[str, npt.NDArray[np.floating]] | None
               ) -> npt.NDArray[np.float64]:
        """A device's update group as the masked vector (raises ``Refused`` when it does not fit the layout)."""
        names = [name for name, _ in self.dense]
        section = group.sparse
        if any(name not in group.dense or np.size(group.dense[name]) != int(np.prod(shape)) for name, shape
               in self.dense) or set(n for n, a in group.dense.items() if np.asarray(a).dtype.kind == "f") - set(names):
            raise Refused("a securely aggregated update carries the round's dense tensors, each in full")
        pieces = [np.asarray(group.dense[name], np.float64).ravel() -
                  (np.asarray(reference[name], np.float64).ravel() if reference is not None else 0.0)
                  for name in names]
        expected = self.section
        if expected is None:
            if section is not None:
                raise Refused("a securely aggregated update of a dense round carries no sparse section")
        else:
            if section is None or section.kind != "masked-values" or section.select != self.select or \
                    section.mask_crc != expected.mask_crc or section.names != expected.names or \
                    section.shapes != expected.shapes:
                raise Refused("a securely aggregated update of a sparse round carries its values on the round's "
                              "support or the complement of its mask (masked values bound to it)")
            pieces.append(np.asarray(section.values, np.float64))
        return np.concatenate(pieces) if pieces else np.zeros(0)

    def groups(self, flat: npt.NDArray[np.floating]) -> dict[str, codec.TensorGroup]:
        """A mean change vector as the ``delta`` group a device of this round would have sent."""
        dense: dict[str, np.ndarray] = {}
        at = 0
        for name, shape in self.dense:
            size = int(np.prod(shape))
            dense[name] = np.asarray(flat[at:at + size], np.float64).reshape(shape).astype(np.float32)
            at += size
        section = None
        if self.section is not None and self.section.mask is not None:
            section = codec.SparseSection.masked_values(self.section.names, self.section.shapes, self.section.mask,
                                                        np.asarray(flat[at:], np.float64).astype(np.float32),
                                                        select=self.select)
        return {DELTA_GROUP: codec.TensorGroup(dense=dense, sparse=section)}


class SecureDevice:
    """See the module docstring. ``client_index`` and ``run_seed`` draw the rounding of its change."""

    def __init__(self, run_id: str, client_id: str, client_index: int, run_seed: int, task: codec.Task,
                 layout: SecureLayout) -> None:
        if task.secagg is None:
            raise ValueError("a task without secure-aggregation settings")
        self.run_id, self.client_id, self.round = run_id, client_id, task.round
        self.attempt = int(task.secagg["attempt"])
        self.grid: Grid | NoisyGrid = grid_of(task.secagg, layout.sizes)
        if isinstance(self.grid, NoisyGrid) and self.grid.noise <= 0:
            raise ValueError("a task under distributed noise that asks for no noise")
        self.setup = setup_of(run_id, task.round, task.secagg, self.grid.words, layout.support)
        self.rng = rounding_rng(run_seed, task.round, client_index, self.attempt)
        self.machine = SecAggDevice(client_id, self.setup)
        self.delivery: Delivery | None = None

    def keys(self) -> codec.SecAggKeys:
        keys = self.machine.keys()
        return codec.SecAggKeys(self.run_id, self.round, self.client_id, attempt=self.attempt,
                                channel_key=keys.channel, masking_key=keys.masking, seed_digest=keys.seed_digest)

    def receive(self, message: codec.Message) -> list[codec.Message]:
        """What to send back for a stage message of this round and attempt (raises ``Refused``)."""
        if message.run_id != self.run_id or message.round != self.round or \
                getattr(message, "attempt", None) != self.attempt:
            raise Refused(f"a {type(message).__name__} of another round or attempt")
        match message:
            case codec.SecAggRoster():
                shares = self.machine.share(Roster(tuple(Keys(*entry) for entry in message.keys)))
                return [codec.SecAggShares(self.run_id, self.round, self.client_id, attempt=self.attempt,
                                           shares=tuple((s.receiver, s.sealed) for s in shares.shares))]
            case codec.SecAggDelivery():
                if self.delivery is not None:
                    raise Refused("a second delivery of shares")
                self.delivery = Delivery(tuple(SealedShare(sender, self.client_id, sealed)
                                               for sender, sealed in message.shares))
                return []
            case codec.SecAggUnmask():
                survivors = len(set(message.survivors))  # a name repeated counts once
                if isinstance(self.grid, NoisyGrid) and survivors < self.grid.release:
                    raise Refused(f"an unmask of {survivors} inputs, fewer than the {self.grid.release} whose noise "
                                  "shares make the sum private")
                reveal = self.machine.unmask(UnmaskRequest(message.survivors, message.dropped))
                return [codec.SecAggReveal(
                    self.run_id, self.round, self.client_id, attempt=self.attempt,
                    seeds=tuple((device, shamir.to_bytes(share)) for device, share in reveal.seeds.items()),
                    secrets=tuple((device, shamir.to_bytes(share)) for device, share in reveal.secrets.items()))]
        raise Refused(f"a {type(message).__name__} is not a secure-aggregation stage message")

    @property
    def ready(self) -> bool:
        """Its delivery is here: a finished change can be masked."""
        return self.delivery is not None

    def masked_group(self, change: npt.NDArray[np.floating]) -> codec.TensorGroup:
        """Its flat change on the round's grid, masked, as the Update's group (once, after its delivery)."""
        if self.delivery is None:
            raise Refused("no delivery of shares yet: nothing can be masked")
        masked = self.machine.mask(self.delivery, self.grid.encode(np.asarray(change), self.rng))
        return masked_group(masked.words, self.grid.bits)


class SecureTask:
    """What an agent holds of a securely aggregated task: its ``SecureDevice``, the float tensors of the model it
    was sent (what its change is measured from, in order) and, once trained, its plaintext update until its delivery
    of shares comes (``pending``)."""

    def __init__(self, run_id: str, client_id: str, client_index: int, run_seed: int, task: codec.Task) -> None:
        self.layout = SecureLayout.of_task(task.groups)
        model = task.groups.get(MODEL_GROUP)
        self.reference = {name: np.asarray(model.dense[name]) for name, _ in self.layout.dense} if model else {}
        self.round = task.round
        self.device = SecureDevice(run_id, client_id, client_index, run_seed, task, self.layout)
        self.pending: codec.Update | None = None

    def change_of(self, update: codec.Update) -> npt.NDArray[np.float64]:
        """The trained update's change in the layout's order: its one group (``delta``, ef-shared's ``update``), or
        its ``model`` group less the model sent (a sparse round's complement values are changes from zero, the
        pruned model's value there); raises ``Refused`` for anything else."""
        if len(update.groups) != 1:
            raise Refused("a securely aggregated update is one group")
        (name, group), = update.groups.items()
        return self.layout.change(group, self.reference if name == MODEL_GROUP else None)

    def masked_frame(self, update: codec.Update) -> bytes:
        """The Update to send: the change masked; of the runtime's fields only what describes the device's work
        (samples, steps, training seconds, the meter's record) is kept, and what is computed from its data or its
        change is dropped (``DROPPED_FIELDS``: the evaluation, the personal accuracy, the training loss, and the
        clip scale, which would give the change's norm; of the meter's record, ``DROPPED_RECORD_FIELDS``: how many
        parameters the change moved, directly or through the optimizer's FLOPs on them)."""
        group = self.device.masked_group(self.change_of(update))
        record = {**update.record, **dict.fromkeys(DROPPED_RECORD_FIELDS & set(update.record))}
        return codec.encode(codec.Update(update.run_id, update.round, update.sender, groups={MASKED_GROUP: group},
                                         num_samples=update.num_samples, steps=update.steps, train_s=update.train_s,
                                         record=record))
