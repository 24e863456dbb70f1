"""The coordinator's side of one secure-aggregation round: ``SecAggRound``, a state machine fed the devices'
messages that returns what to send, with no I/O, and at the end the sum of the survivors' inputs and nothing else.

Stages (``RoundStage``): KEYS (collecting ``Keys``) -> SHARES (collecting ``Shares`` from the roster) -> INPUTS
(collecting ``MaskedInput``s from the devices that shared) -> UNMASK (collecting ``UnmaskShares``) -> SUMMED, or
FAILED with its reason at any stage. It never holds one device's masked input: each is added to the running sum as
it arrives and dropped. The unmask stage rebuilds the self-mask seed of every survivor and the masking secret of
every dropped device that shared, never both of one device; a masked input that arrives after its stage closed
(its device then declared dropped) is refused. The round needs, at each stage, at least the threshold of each
device's neighbourhood: fewer, and it fails with its reason. Nothing of Fedge beyond this package; no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from fedge.secagg import field, shamir
from fedge.secagg.device import pair_mask, pair_sign, self_mask
from fedge.secagg.graph import MIN_DEVICES, neighbourhoods, threshold_of
from fedge.secagg.keys import KEY_BYTES, KeyPair, seed_commitment, usable_public_key
from fedge.secagg.messages import (
    Delivery,
    Keys,
    MaskedInput,
    Roster,
    SealedShare,
    Setup,
    Shares,
    UnmaskRequest,
    UnmaskShares,
)


class RoundStage(enum.Enum):
    KEYS = "keys"
    SHARES = "shares"
    INPUTS = "inputs"
    UNMASK = "unmask"
    SUMMED = "summed"
    FAILED = "failed"


class RoundFailed(RuntimeError):
    """The round cannot produce its sum (too few devices at a stage), with the reason."""


@dataclass(frozen=True)
class SecureSum:
    """The unmasked sum of the survivors' field words, and who they are."""

    words: field.U64
    contributors: tuple[str, ...]


class SecAggRound:
    """See the module docstring. ``selected``: the devices asked to take part."""

    def __init__(self, setup: Setup, selected: Sequence[str]) -> None:
        self.setup = setup
        self.selected = frozenset(selected)
        self.stage = RoundStage.KEYS
        self.reason = ""
        self.keys: dict[str, Keys] = {}
        self.withdrawn: set[str] = set()  # devices that left during the keys stage
        self.graph: dict[str, tuple[str, ...]] = {}
        self.thresholds: dict[str, int] = {}
        self.sealed: dict[str, tuple[SealedShare, ...]] = {}  # sender -> its sealed shares
        self.total: field.U64 = np.zeros(setup.size, np.uint64)
        self.masked: set[str] = set()
        self.request: UnmaskRequest | None = None
        self.seed_shares: dict[str, dict[int, tuple[int, ...]]] = {}    # survivor -> point -> share
        self.secret_shares: dict[str, dict[int, tuple[int, ...]]] = {}  # dropped -> point -> share
        self.answered: set[str] = set()
        self.points: dict[str, int] = {}

    # stage 1
    def add_keys(self, keys: Keys) -> str:
        """'' when taken, else why it was refused."""
        if self.stage is not RoundStage.KEYS:
            return f"keys in stage {self.stage.value}"
        if keys.device not in self.selected or keys.device in self.keys or keys.device in self.withdrawn:
            return f"keys from {keys.device!r}, which is not selected, has withdrawn or has sent its keys already"
        if len(keys.channel) != KEY_BYTES or len(keys.masking) != KEY_BYTES or keys.channel == keys.masking:
            return "keys that are not two distinct 32-byte X25519 public keys"
        if not (usable_public_key(keys.channel) and usable_public_key(keys.masking)):
            return "a public key of low order: no secret can be agreed with it"
        if len(keys.seed_digest) != 32:
            return "keys without a 32-byte commitment to the device's seed"
        self.keys[keys.device] = keys
        return ""

    def withdraw(self, device: str) -> None:
        """A device that left before the keys stage closed (it declined, failed or said goodbye): it is not in the
        roster, whether its keys came or come later. After the keys stage it is a dropout like any other."""
        if self.stage is RoundStage.KEYS:
            self.withdrawn.add(device)
            self.keys.pop(device, None)

    def close_keys(self) -> Roster:
        """The roster of the devices that advertised keys (a device whose key repeats another's is left out)."""
        self.expect(RoundStage.KEYS)
        seen: dict[bytes, int] = {}
        for entry in self.keys.values():
            for key in (entry.channel, entry.masking):
                seen[key] = seen.get(key, 0) + 1
        kept = [entry for device, entry in sorted(self.keys.items())
                if seen[entry.channel] == 1 and seen[entry.masking] == 1]
        self.keys = {entry.device: entry for entry in kept}
        self.need(len(kept), "advertised keys")
        self.graph = neighbourhoods(list(self.keys), self.setup.complete_up_to, self.setup.graph_seed)
        self.thresholds = {device: threshold_of(len(others), self.setup.threshold)
                           for device, others in self.graph.items()}
        roster = Roster(tuple(Keys(entry.device, entry.channel, entry.masking) for entry in kept))
        self.points = roster.points()
        self.stage = RoundStage.SHARES
        return roster

    # stage 2
    def add_shares(self, shares: Shares) -> str:
        if self.stage is not RoundStage.SHARES:
            return f"shares in stage {self.stage.value}"
        if shares.device not in self.keys or shares.device in self.sealed:
            return f"shares from {shares.device!r}, which is not in the roster or has shared already"
        receivers = sorted(sealed.receiver for sealed in shares.shares)
        if any(sealed.sender != shares.device for sealed in shares.shares) or \
                receivers != sorted(self.graph[shares.device]):
            return "shares that are not one from this device to each of its neighbours"
        self.sealed[shares.device] = shares.shares
        return ""

    def close_shares(self) -> dict[str, Delivery]:
        """Each device that shared is delivered the shares addressed to it by the others that shared."""
        self.expect(RoundStage.SHARES)
        self.need(len(self.sealed), "shared their keys")
        self.check_neighbourhoods(set(self.sealed), "shared their keys")
        deliveries: dict[str, list[SealedShare]] = {device: [] for device in self.sealed}
        for sealed in (s for shares in self.sealed.values() for s in shares):
            if sealed.receiver in deliveries:
                deliveries[sealed.receiver].append(sealed)
        self.stage = RoundStage.INPUTS
        return {device: Delivery(tuple(found)) for device, found in deliveries.items()}

    # stage 3
    def add_masked(self, masked: MaskedInput) -> str:
        """A masked input, added to the running sum at once; refused after the stage closed (its device is then
        counted as dropped, and its input must never join the sum)."""
        if self.stage is not RoundStage.INPUTS:
            return f"a masked input in stage {self.stage.value}: its device is counted as dropped"
        if masked.device not in self.sealed or masked.device in self.masked:
            return f"a masked input from {masked.device!r}, which did not share its keys or has sent one already"
        words = np.asarray(masked.words)
        if words.dtype != np.uint64 or words.shape != (self.setup.size,) or \
                np.any(words > field.modulus_mask(self.setup.bits)):
            return f"a masked input that is not {self.setup.size} words of {self.setup.bits} bits"
        self.total = field.add(self.total, words, self.setup.bits)
        self.masked.add(masked.device)
        return ""

    def close_inputs(self) -> UnmaskRequest:
        self.expect(RoundStage.INPUTS)
        self.need(len(self.masked), "sent a masked input")
        self.check_neighbourhoods(self.masked, "sent a masked input", of=self.sealed)
        self.request = UnmaskRequest(tuple(sorted(self.masked)), tuple(sorted(set(self.sealed) - self.masked)))
        self.stage = RoundStage.UNMASK
        return self.request

    # stage 4
    def add_unmask(self, answer: UnmaskShares) -> str:
        if self.stage is not RoundStage.UNMASK or self.request is None:
            return f"unmask shares in stage {self.stage.value}"
        if answer.device not in self.masked or answer.device in self.answered:
            return f"unmask shares from {answer.device!r}, which is not a survivor or has answered already"
        neighbours = set(self.graph[answer.device])
        survivors, dropped = set(self.request.survivors), set(self.request.dropped)
        if not set(answer.seeds) <= survivors & neighbours or not set(answer.secrets) <= dropped & neighbours:
            return "unmask shares for devices the request did not ask this device for"
        point = self.points[answer.device]
        for device, values in answer.seeds.items():
            self.seed_shares.setdefault(device, {})[point] = tuple(values)
        for device, values in answer.secrets.items():
            self.secret_shares.setdefault(device, {})[point] = tuple(values)
        self.answered.add(answer.device)
        return ""

    def missing(self) -> list[str]:
        """The devices whose secret cannot be rebuilt yet (fewer shares than their threshold)."""
        assert self.request is not None
        return [device for device in self.request.survivors
                if len(self.seed_shares.get(device, {})) < self.thresholds[device]] + \
            [device for device in self.request.dropped
             if len(self.secret_shares.get(device, {})) < self.thresholds[device]]

    def finish(self) -> SecureSum:
        """The sum: every survivor's self mask and every pairwise mask of a dropped device taken off the total."""
        self.expect(RoundStage.UNMASK)
        assert self.request is not None
        lacking = self.missing()
        if lacking:
            self.fail(f"too few unmask shares for {len(lacking)} device(s) ({', '.join(lacking[:3])}): "
                      f"{len(self.answered)} of {len(self.request.survivors)} survivors answered")
        try:
            total = self.unmasked(self.request)
        except ValueError as error:  # shares that rebuild no secret, a key that agrees none: never a partial sum
            self.fail(f"the sum cannot be unmasked: {error}")
        self.stage = RoundStage.SUMMED
        return SecureSum(total, self.request.survivors)

    def unmasked(self, request: UnmaskRequest) -> field.U64:
        """The total with every survivor's self mask and every dropped device's pairwise masks taken off."""
        bits, total = self.setup.bits, self.total
        for device in request.survivors:
            seed = shamir.reconstruct_bytes(self.seed_shares[device], self.thresholds[device], KEY_BYTES)
            if seed_commitment(seed, self.setup.context, device) != self.keys[device].seed_digest:
                raise ValueError(f"the seed rebuilt for {device} does not match its commitment (a share was wrong)")
            total = field.subtract(total, self_mask(seed, self.setup, device), bits)
        for device in request.dropped:
            secret = KeyPair.from_private_bytes(
                shamir.reconstruct_bytes(self.secret_shares[device], self.thresholds[device], KEY_BYTES))
            if secret.public != self.keys[device].masking:
                raise ValueError(f"the masking secret rebuilt for {device} does not match its public key")
            for other in self.graph[device]:
                if other in self.masked:  # it masked with the dropped device, whose share it had received
                    mask = pair_mask(secret.agree(self.keys[other].masking), self.setup, other, device)
                    total = field.subtract(total, mask, bits) if pair_sign(other, device) > 0 else \
                        field.add(total, mask, bits)
        return total

    def need(self, count: int, what: str) -> None:
        if count < MIN_DEVICES:
            self.fail(f"{count} device(s) {what}; secure aggregation needs at least {MIN_DEVICES}")

    def check_neighbourhoods(self, live: Iterable[str], what: str, of: Iterable[str] | None = None) -> None:
        """Fail unless each device (of ``of``, by default of ``live``) has at least its threshold of neighbours in
        ``live``: the ones that will hold, or give back, its shares."""
        alive = set(live)
        for device in sorted(alive if of is None else set(of)):
            count = sum(other in alive for other in self.graph[device])
            if count < self.thresholds[device]:
                self.fail(f"{device} has {count} neighbour(s) that {what}, fewer than its threshold "
                          f"{self.thresholds[device]}")

    def fail(self, reason: str) -> NoReturn:
        self.stage, self.reason = RoundStage.FAILED, reason
        raise RoundFailed(reason)

    def expect(self, stage: RoundStage) -> None:
        if self.stage is not stage:
            raise RoundFailed(f"stage {self.stage.value}, not {stage.value}" +
                              (f" ({self.reason})" if self.reason else ""))
