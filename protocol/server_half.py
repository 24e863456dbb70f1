"""What the runtime calls on an algorithm's server half (``ServerHalf``; ``GlobalModelServer`` for a half that
keeps one global model a wrapper may replace), and the one aggregation path every driver and test takes
(``Aggregation``: fold each accepted update as it arrives, bounded by ``protocol.influence`` when a session bounds
influence, then close the round). Torch-free: the protocol objects
call a server half through this contract without importing an algorithm. The defaults of the optional hooks and
the streaming and batch bases are in ``algorithms.contract``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from fedge.codec import SparseSection, TensorGroup
from fedge.protocol.influence import Bounded, Influence, change_of, group_references, raw_norms, scale_change
from fedge.protocol.payload import SECURE_CONTRIBUTORS, Arrays, ClientUpdate, Payload
from fedge.protocol.privacy import Clipped, PrivateRound, Release
from fedge.protocol.robust_rules import RobustRule, combine, lower_median
from fedge.protocol.server_step import ServerStep
from fedge.protocol.validation import Unfoldable

# a round's layout, from its first update's shared form: per group, its dense tensors (name, shape, dtype kind) in
# order, and its sparse section (the support its values lie on)
Layout = dict[str, tuple[tuple[tuple[str, tuple[int, ...], str], ...], SparseSection | None]]


class ServerHalf(Protocol):
    """What the coordinator calls on an algorithm's server half. ``algorithms.contract.BaseServer`` gives every
    optional hook its default (``select``: the runtime's own selection; ``check_update``: nothing to add;
    ``missed``, ``forget``: nothing to do; ``pruned_evaluation_arrays``, ``change_reference``: none;
    ``influence_phase``: one phase; ``shared_form``: the update itself); an algorithm overrides what it needs. Aggregation streams: ``fold`` each accepted update, then ``close_round``."""

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        """The clients of this round among ``available``, or None for the runtime's fraction/count rule."""
    def downlink(self, round_number: int, client_index: int) -> Payload:
        """What client ``client_index`` receives in this round."""
    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """A reason to refuse an update that ``fold`` could not use (a group, tensor or meta key), or ''."""
    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """Take one accepted update of the round as it arrives (the coordinator then drops its tensors)."""
    def close_round(self, round_number: int) -> dict[str, Any]:
        """Close the round over what was folded (called only when something was): the same state, bit for bit,
        whatever order the updates were folded in; returns metrics for metrics.jsonl."""
    def missed(self, round_number: int, client_indices: Sequence[int]) -> None:
        """Selected clients that sent nothing before the round closed."""
    def forget(self, client_index: int) -> None:
        """Drop what the server half assumes of a device's state (it failed a round, or left the session)."""
    def change_reference(self, round_number: int, client_index: int) -> Arrays | None:
        """What a client's "model" group is a change from (the model it was sent this round), or None when that
        group's values are changes already; the norm bound measures the difference."""
    def influence_phase(self, round_number: int) -> str:
        """A name for the scale of this round's updates (DSSA: "dense" or "sparse"): the norm bound's median is
        measured again when it changes."""
    def shared_form(self, round_number: int, update: ClientUpdate) -> ClientUpdate | None:
        """The update with its values on the support every update of the round shares, for a robust rule to
        combine: the update itself, or (a half whose devices each send their own coordinates: ef) its values
        placed on every coordinate; None when its values join no sum this round (it is then folded as it is)."""
    def evaluation_arrays(self) -> Arrays | None:
        """The global model to evaluate, or None when the algorithm keeps none."""
    def pruned_evaluation_arrays(self) -> Arrays | None:
        """A second model to evaluate (DSSA's pruned one), or None."""
    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        """Everything needed to resume: arrays and JSON-able meta (the checkpoint)."""
    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        """The inverse of ``state_dict``."""


class GlobalModelServer(ServerHalf, Protocol):
    """A server half that keeps one global model, which a wrapper (DSSA) may read and replace between the base's
    steps: FedAvg's, FedProx's and SCAFFOLD's."""

    def global_model(self) -> Arrays:
        """The global model x (the server half's own arrays: a caller copies before it changes them)."""
    def set_global_model(self, arrays: Arrays) -> None:
        """Replace the global model x."""


def shared_support(first: SparseSection | None, other: SparseSection | None) -> bool:
    """Whether two sparse sections carry their values at the same positions (or neither has one)."""
    if first is None or other is None:
        return first is None and other is None
    if (first.kind, first.names, first.shapes, first.counts, first.mask_crc, first.select) != \
            (other.kind, other.names, other.shapes, other.counts, other.mask_crc, other.select):
        return False
    if first.indices is not None or other.indices is not None:
        return first.indices is not None and other.indices is not None and \
            np.array_equal(first.indices, other.indices)
    if first.mask is not None or other.mask is not None:
        return first.mask is not None and other.mask is not None and np.array_equal(first.mask, other.mask)
    return True  # "masked-values": bound to the same mask by its CRC


class Aggregation:
    """One round's aggregation on a server half: the one path every driver (a session, the in-process driver) and
    every test takes. ``fold`` each accepted update as it arrives, then ``close``, which calls the half's
    ``close_round`` only when something was folded (a round with no update leaves the server state as it was).

    With ``influence`` (``protocol.influence``), each update is bounded before the half folds it; a round that
    cannot be bounded as its updates arrive (the cap or this phase's median not known yet) holds them, each with
    its raw norms measured on arrival, and folds them, bounded, in client order at ``close``; ``keep`` is how the
    driver keeps a held update (a session spills the values of a large round to disk: ``coordinator.spill``).
    ``bounded`` lists what the bounds did to each update.

    With a robust ``rule`` (``protocol.robust_rules``), the bounded updates are held, each in its ``shared_form``,
    and, at ``close``, combined by the rule into one change; the half then folds, for every held update, that change
    under the update's own client, meta and a count of 1, so their mean is the rule's result (the rules are
    unweighted) and whatever the half keeps per device (ef: the keyframe each holds) is kept as without a rule. Only
    for halves whose updates are dense, or lie on one shared support in their shared form (the configuration
    refuses the others).

    Centred clipping of one iteration streams in a round that streams: its centre is no change and its radius
    ``cc_tau`` times the previous round's median of each group's norm, so each update is scaled into that radius
    and folded at once with a count of 1 (``centred``); the mean of those is the rule's one step.

    With ``private`` (``protocol.privacy``, in place of the bounds and the rule), each update's change in its
    shared form is clipped and added to the round's private sum as it arrives (its tensors dropped); at ``close``
    the noisy mean change is folded once for each device that sent one, with a count of 1, as a rule's change is;
    a round with too few updates is not released (nothing is folded; ``withheld``).

    A securely aggregated round folds nothing one device at a time: its unmasked mean change is folded once
    (``fold_secure_mean``), and closed like any other round.

    A fold takes an update whole or not at all: what it would refuse for what the device sent (``Unfoldable``: groups,
    tensors or a support unlike the round's first update's, ``check``, which the protocol runs before it accepts the
    update; or the half's own fold) leaves the round's sums, held updates, norms and the half's state as they were,
    and the update is listed in ``refused`` (``fold`` returns the reason; a held update refused at ``close`` is
    listed there too), for the driver to tell the protocol (``CoordinatorProtocol.unfolded``). Only ``Unfoldable`` is
    caught: any other exception is a bug of the coordinator's.

    With an active ``step`` (``protocol.server_step``), the closed round's change of the global model (a
    ``GlobalModelServer``'s) is taken through the server's optimizer step."""

    def __init__(self, server: ServerHalf, round_number: int, influence: Influence | None = None,
                 rule: RobustRule | None = None, private: PrivateRound | None = None,
                 step: ServerStep | None = None, keep: Callable[[ClientUpdate], ClientUpdate] | None = None) -> None:
        if private is not None and (influence is not None or (rule is not None and rule.robust)):
            raise ValueError("a private round takes neither the bounds nor a robust rule: its clip replaces them")
        self.server = server
        self.round = round_number
        self.folded = 0
        self.given = 0  # updates handed to the server half's fold
        self.private = private
        self.clipped: list[Clipped] = []
        self.released: Release | None = None
        self.withheld = False
        self.step = step if step is not None and step.active else None
        self.influence = influence
        self.phase = server.influence_phase(round_number) if influence is not None else ""
        self.holding = influence is not None and influence.holds(self.phase)
        self.thresholds = {} if influence is None or self.holding else influence.thresholds(influence.medians)
        self.keep = keep if keep is not None else (lambda update: update)
        self.held: list[tuple[ClientUpdate, dict[str, float]]] = []  # each held update and its raw norms
        self.norms: dict[str, list[float]] = {}
        self.bounded: list[Bounded] = []
        self.rule = rule if rule is not None and rule.robust else None
        self.for_rule: list[ClientUpdate] = []  # each held update without its float values (in ``rows``)
        self.rows: dict[str, list[np.ndarray]] = {}  # per group, each held update's change as a float32 row
        self.template: ClientUpdate | None = None    # the first held update, whole: the groups' layout
        self.layout: Layout | None = None  # the first checked or held update's layout (``layout_problem``)
        self.refused: list[Unfolded] = []  # the updates this round's fold refused, in the order it did
        self.radii: dict[str, float] = {}  # streaming centred clipping's radius per group (empty: not streaming)
        if self.rule is not None and self.rule.aggregator == "centered-clip" and self.rule.cc_iters == 1 and \
                influence is not None and not self.holding and influence.medians:
            self.radii = {name: self.rule.cc_tau * median for name, median in influence.medians.items()}

    @property
    def norm_bounds(self) -> dict[str, float]:
        """The bounds this round applies as its updates arrive, by group (``*``: every group), for its tasks to
        announce (``codec.Task.norm_bounds``); empty when the round holds (its bounds are known only at close)."""
        return {} if self.holding else {name: bound for name, bound in self.thresholds.items() if bound > 0}

    def fold(self, update: ClientUpdate) -> str:
        """Take one accepted update: '' once it is folded (or held), else the reason it was refused (``refused``),
        with nothing of it kept."""
        try:
            self.take(update)
        except Unfoldable as exc:
            return self.refuse(update, str(exc))
        self.folded += 1
        return ""

    def take(self, update: ClientUpdate) -> None:
        if self.influence is None:
            self.give(update)
        elif self.holding:  # its norms measured now, its values then kept as the driver keeps held updates
            norms = raw_norms(update, self.server.change_reference(self.round, update.index))
            self.held.append((self.keep(update), norms))
        else:
            self.fold_bounded(self.influence, update)

    def refuse(self, update: ClientUpdate, reason: str) -> str:
        self.refused.append(Unfolded(update.client_id, update.index, reason))
        return reason

    def check(self, update: ClientUpdate) -> str:
        """Why this round's fold would refuse the update for its layout (``layout_problem``, on its shared form, in
        a round that holds its updates for a robust rule or a private sum), or ''; run by the protocol before it
        accepts the update, so that what a fold checks refuses an update before it is accepted."""
        if self.radii or (self.rule is None and self.private is None):
            return ""
        form = self.server.shared_form(self.round, update)
        if form is None:
            return ""
        problem = self.layout_problem(form)
        if not problem and self.layout is None:
            self.layout = layout_of(form)
        return problem

    def fold_bounded(self, influence: Influence, update: ClientUpdate,
                     norms: dict[str, float] | None = None) -> None:
        reference = self.server.change_reference(self.round, update.index)
        bounded, record = influence.bound(update, reference, self.thresholds, norms)
        self.give(bounded)  # (Unfoldable: its norms are not kept either)
        for name, norm in record.norms.items():
            self.norms.setdefault(name, []).append(norm)
        self.bounded.append(record)

    def to_server(self, update: ClientUpdate) -> None:
        self.server.fold(self.round, update)
        self.given += 1

    def give(self, update: ClientUpdate) -> None:
        """Fold into the half, or keep for the robust rule or the private sum (in its shared form, when its values
        join the sum)."""
        if self.radii:
            self.to_server(self.centred(update))
            return
        form = None if self.rule is None and self.private is None else self.server.shared_form(self.round, update)
        if form is None:
            self.to_server(update)
        elif self.private is not None:
            self.add_private(self.private, form)
        else:
            self.hold(form)

    def fold_secure_mean(self, groups: Mapping[str, TensorGroup], contributor: tuple[str, int],
                         contributors: Sequence[int] = ()) -> None:
        """A securely aggregated round's mean change (``protocol.secure_round``: the coordinator never held one
        device's), folded once as the update a device of the round would have sent (its ``delta`` group:
        ``protocol.secure_device.SecureLayout.groups``) under a count of 1, so that the half's mean is that change.
        The halves secure aggregation applies to (FedAvg, FedProx, DSSA and ef-shared over them) keep nothing of a
        device's change;
        ``contributor`` (the first device in the sum) is the name the fold is made under; ``contributors`` (every
        index summed) go in its meta (``SECURE_CONTRIBUTORS``), for a half that keeps what each device holds (ef-shared)."""
        if self.influence is not None or self.rule is not None or self.private is not None or self.folded:
            raise ValueError("a securely aggregated round takes no bounds, robust rule or private sum, and no "
                             "update of its own")
        client_id, index = contributor
        meta = {SECURE_CONTRIBUTORS: list(contributors)}
        self.to_server(ClientUpdate(client_id=client_id, index=index, num_samples=1,
                                    payload=Payload(groups=groups, meta=meta)))

    def layout_problem(self, update: ClientUpdate) -> str:
        """Why an update (in its shared form) cannot join the round's held updates, or '': the same groups as the
        round's first, each with the same dense tensors (names, shapes, float or not, in order) and its sparse values
        on one shared support."""
        layout = self.layout
        if layout is None:
            return ""
        if set(update.payload.groups) != set(layout):
            return f"update of {update.client_id}: groups {sorted(update.payload.groups)}, the round's first had " \
                   f"{sorted(layout)}; the groups must be the same"
        for name, group in update.payload.groups.items():
            dense, sparse = layout[name]
            if dense_layout(group) != dense:
                return f"group {name!r}: the update's dense tensors (names, shapes, types, order) are not those of " \
                       "the round's first update"
            if not shared_support(sparse, group.sparse):
                return f"group {name!r}: the updates' sparse values lie on different supports; a robust " \
                       "aggregator or a private sum needs one shared support"
        return ""

    def keep_layout(self, update: ClientUpdate) -> dict[str, TensorGroup]:
        """Check an update against the round's layout (``layout_problem``: ``Unfoldable``, nothing kept; the first
        update's layout is the round's, and the first held one is kept whole, for the groups' layout at ``spread``),
        and keep it without its float values (its integer tensors and meta) for the fold at ``close``."""
        problem = self.layout_problem(update)
        if problem:
            raise Unfoldable(problem)
        self.layout = self.layout or layout_of(update)
        self.template = self.template or update
        kept = {name: TensorGroup(dense={t: a for t, a in group.dense.items() if a.dtype.kind != "f"})
                for name, group in update.payload.groups.items()}
        self.for_rule.append(dataclasses.replace(update, payload=Payload(groups=kept, meta=update.payload.meta)))
        return kept

    def hold(self, update: ClientUpdate) -> None:
        """Keep an update for the rule as one float32 change row per group (its tensors then dropped) and its
        integer tensors and meta: all of it, or nothing."""
        references = group_references(update, self.server.change_reference(self.round, update.index))
        rows = {}
        for name, group in update.payload.groups.items():
            reference = references[name]
            pieces = [np.asarray(array, np.float32).ravel() - np.asarray(reference[t], np.float32).ravel()
                      if reference is not None and t in reference else np.asarray(array, np.float32).ravel()
                      for t, array in group.dense.items() if array.dtype.kind == "f"]
            if group.sparse is not None:
                pieces.append(np.asarray(group.sparse.values, np.float32))
            rows[name] = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        self.keep_layout(update)
        for name, row in rows.items():
            self.rows.setdefault(name, []).append(row)

    def add_private(self, private: PrivateRound, update: ClientUpdate) -> None:
        """An update's change, every group's float values as one float64 row, clipped into the private sum: all of
        it, or nothing."""
        problem = self.layout_problem(update)
        if problem:
            raise Unfoldable(problem)
        references = group_references(update, self.server.change_reference(self.round, update.index))
        rows = {}
        for name, group in update.payload.groups.items():
            pieces = change_of(group, references[name])
            rows[name] = np.concatenate(pieces) if pieces else np.zeros(0, np.float64)
        record = private.add(update.client_id, update.index, rows, update.clip_scale)
        self.keep_layout(update)
        self.clipped.append(record)

    def centred(self, update: ClientUpdate) -> ClientUpdate:
        """Streaming centred clipping: the update with each group's change scaled into its radius (a group the
        previous round did not measure is left as it is), counted once."""
        reference = self.server.change_reference(self.round, update.index)
        references = group_references(update, reference)
        groups = dict(update.payload.groups)
        for name, norm in raw_norms(update, reference).items():
            radius = self.radii.get(name, 0.0)
            if radius > 0 and norm > radius:
                groups[name] = scale_change(groups[name], references[name], radius / norm)
        return dataclasses.replace(update, num_samples=1, payload=Payload(groups=groups, meta=update.payload.meta))

    def combined(self, rule: RobustRule) -> list[ClientUpdate]:
        """The rule's change over the held updates, once per held update (``spread``): each group's float values
        (its dense float tensors' changes, then its sparse values, which must lie on one support shared by every
        update: DSSA's complement, ef's shared form) combined as one change vector."""
        order = sorted(range(len(self.for_rule)), key=lambda i: self.for_rule[i].index)
        rows, self.rows = self.rows, {}
        changes = {}
        for name in list(rows):
            ordered = [rows[name][i] for i in order]
            rows[name] = []
            changes[name] = combine(rule, ordered)
            del ordered
        return self.spread(changes)

    def spread(self, changes: dict[str, np.ndarray]) -> list[ClientUpdate]:
        """One change per group, once per held update (in client order), each under its own client, meta and a
        count of 1: the change laid out over the group's dense float tensors (added to their reference) and then
        its sparse values; the integer tensors by their lower median."""
        updates = sorted(self.for_rule, key=lambda u: u.index)
        template = self.template
        assert template is not None
        references = group_references(template, self.server.change_reference(self.round, updates[0].index))
        self.for_rule, self.template = [], None
        groups: dict[str, TensorGroup] = {}
        for name, group in template.payload.groups.items():
            reference = references[name]
            integers = {t: lower_median([np.asarray(u.payload.groups[name].dense[t]) for u in updates])
                        for t, a in group.dense.items() if a.dtype.kind != "f"}
            change = changes[name]
            dense: dict[str, np.ndarray] = {}
            at = 0
            for t, array in group.dense.items():
                if array.dtype.kind != "f":
                    dense[t] = integers[t]
                    continue
                part = change[at:at + array.size].reshape(array.shape)
                at += array.size
                base = np.asarray(reference[t], np.float64) if reference is not None and t in reference else 0.0
                dense[t] = (base + part).astype(np.float32)
            sparse = None if group.sparse is None else \
                dataclasses.replace(group.sparse, values=change[at:].astype(np.float32))
            groups[name] = dataclasses.replace(group, dense=dense, sparse=sparse)
        return [dataclasses.replace(u, num_samples=1, payload=Payload(groups=groups, meta=u.payload.meta))
                for u in updates]

    def close(self) -> dict[str, Any]:
        influence = self.influence
        if influence is not None and self.held:
            held: list[tuple[ClientUpdate, dict[str, float]]] = []
            for update, norms in sorted(self.held, key=lambda entry: entry[0].index, reverse=True):
                problem = self.check(update)  # refused before the round's cap and medians are taken from the rest
                if problem:
                    self.refuse(update, problem)
                    self.folded -= 1
                else:
                    held.append((update, norms))
            self.held = []
            influence.fix_cap([update.num_samples for update, _ in held])
            own: dict[str, list[float]] = {}
            for _, norms in held:
                for name, norm in norms.items():
                    own.setdefault(name, []).append(norm)
            self.thresholds = influence.thresholds({name: float(np.median(v)) for name, v in own.items()})
            while held:  # in client order, each dropped once folded (a spilled one's map with it)
                update, norms = held.pop()
                try:
                    self.fold_bounded(influence, update, norms)
                except Unfoldable as exc:
                    self.refuse(update, str(exc))
                    self.folded -= 1
                del update
        if influence is not None:
            influence.remember(self.phase, self.norms)
        if self.rule is not None and self.for_rule:
            for update in self.combined(self.rule):
                self.to_server(update)
        if self.private is not None:
            self.released = self.private.release()
            self.withheld = self.released is None
            if self.released is not None and self.for_rule:
                for update in self.spread(dict(self.released.changes)):
                    self.to_server(update)
            self.for_rule, self.template = [], None
        before = None
        if self.step is not None and self.given:
            model = getattr(self.server, "global_model", None)
            if model is None:
                raise ValueError("a server step needs a server half that keeps one global model")
            before = {name: np.array(value) for name, value in model().items()}
        metrics = dict(self.server.close_round(self.round)) if self.given else {}
        if self.step is not None and before is not None:
            self.server.set_global_model(self.step.apply(before, self.server.global_model()))  # type: ignore[attr-defined]
        if influence is not None and self.folded:
            metrics["robust_capped"] = sum(record.capped for record in self.bounded)
            metrics["robust_clipped"] = sum(record.clipped for record in self.bounded)
        if (influence is not None or self.rule is not None) and self.folded:
            metrics["robust_aggregator"] = self.rule.aggregator if self.rule is not None else "mean"
        return metrics


@dataclasses.dataclass(frozen=True)
class Unfolded:
    """An accepted update that the round's fold refused (``Aggregation.refused``): whose, and why."""

    client_id: str
    index: int
    reason: str


def layout_of(update: ClientUpdate) -> Layout:
    return {name: (dense_layout(group), group.sparse) for name, group in update.payload.groups.items()}


def dense_layout(group: TensorGroup) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple((name, tuple(np.shape(array)), "f" if np.asarray(array).dtype.kind == "f" else "i")
                 for name, array in group.dense.items())


def aggregate_round(server: ServerHalf, round_number: int, updates: Sequence[ClientUpdate],
                    influence: Influence | None = None, rule: RobustRule | None = None,
                    private: PrivateRound | None = None) -> dict[str, Any]:
    """``updates`` folded in the order given and the round closed (``Aggregation``); the round's metrics."""
    aggregation = Aggregation(server, round_number, influence, rule, private)
    for update in updates:
        aggregation.fold(update)
    return aggregation.close()
