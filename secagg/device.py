"""A device's side of one secure-aggregation round: ``SecAggDevice``, a state machine fed the coordinator's
messages that returns its own, with no I/O.

Stages (``DeviceStage``): KEYS (two fresh X25519 pairs and a fresh self-mask seed, from the OS) -> SHARED (its seed
and masking secret cut into t-of-k Shamir shares, one sealed share per neighbour) -> MASKED (its field words plus
its self mask plus, for each neighbour that shared, the pairwise mask it agrees with that neighbour, added by the
lower id and subtracted by the higher, so each pair cancels in the sum) -> DONE (it answered the one unmask
request it will ever answer). A device refuses, with its reason (``Refused``): a roster that repeats a key or lacks
its own, fewer than t live neighbours, a share that does not open, and an unmask request that names a device
both survivor and dropped, names a device outside the roster, lists fewer than t of its neighbours among the
survivors, or comes before its own
masked input or a second time. Nothing of Fedge beyond this package; no I/O.
"""

from __future__ import annotations

import enum
import os

import numpy as np

from fedge.secagg import field, shamir
from fedge.secagg.graph import MIN_DEVICES, neighbourhoods, threshold_of
from fedge.secagg.keys import (
    KEY_BYTES,
    KeyPair,
    KeyRefused,
    ShareRefused,
    derive,
    keystream,
    open_sealed,
    seal,
    seed_commitment,
    usable_public_key,
)
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

SHARE_CHUNKS = -(-KEY_BYTES // shamir.CHUNK)  # field elements per shared 32-byte secret


class Refused(ValueError):
    """A message this device will not act on, with its reason."""


class DeviceStage(enum.Enum):
    KEYS = "keys"
    SHARED = "shared"
    MASKED = "masked"
    DONE = "done"


def pair_sign(device: str, other: str) -> int:
    """+1 when ``device`` adds the pair's mask (the lower id), -1 when it subtracts it."""
    return 1 if device < other else -1


def self_mask(seed: bytes, setup: Setup, device: str) -> field.U64:
    return keystream(derive(seed, setup.context, b"self", device, device), setup.size, setup.bits)


def pair_mask(agreed: bytes, setup: Setup, device: str, other: str) -> field.U64:
    low, high = sorted((device, other))
    return keystream(derive(agreed, setup.context, b"pair", low, high), setup.size, setup.bits)


def share_key(agreed: bytes, setup: Setup, sender: str, receiver: str) -> bytes:
    return derive(agreed, setup.context, b"share", sender, receiver)


def associated(setup: Setup, sender: str, receiver: str) -> bytes:
    return setup.context + b"/" + sender.encode() + b"->" + receiver.encode()


def encode_share(seed: tuple[int, ...], secret: tuple[int, ...]) -> bytes:
    return shamir.to_bytes((*seed, *secret))


def decode_share(data: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    try:
        values = shamir.from_bytes(data, 2 * SHARE_CHUNKS)
    except ValueError as error:
        raise Refused(str(error)) from None
    return values[:SHARE_CHUNKS], values[SHARE_CHUNKS:]


class SecAggDevice:
    """One device in one round (one attempt): see the module docstring."""

    def __init__(self, device: str, setup: Setup) -> None:
        self.device = device
        self.setup = setup
        self.stage = DeviceStage.KEYS
        self.channel = KeyPair.generate()
        self.masking = KeyPair.generate()
        self.seed = os.urandom(KEY_BYTES)
        self.roster: dict[str, Keys] = {}
        self.neighbours: tuple[str, ...] = ()
        self.threshold = 0
        self.live: tuple[str, ...] = ()  # the neighbours whose shares arrived: the ones it masks with
        self.held: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # sender -> (seed share, secret share)

    def keys(self) -> Keys:
        return Keys(self.device, self.channel.public, self.masking.public,
                    seed_commitment(self.seed, self.setup.context, self.device))

    def share(self, roster: Roster) -> Shares:
        """Stage 2: its seed and masking secret in t-of-k shares, one sealed share for each neighbour."""
        self.expect(DeviceStage.KEYS, "a roster")
        entries = roster.by_device()
        publics = [key for entry in roster.keys for key in (entry.channel, entry.masking)]
        if len(entries) != len(roster.keys) or len(set(publics)) != len(publics):
            raise Refused("the roster repeats a device or a public key")
        own = entries.get(self.device)
        if own is None or (own.channel, own.masking) != (self.channel.public, self.masking.public):
            raise Refused("the roster does not carry this device's own keys")
        if len(entries) < MIN_DEVICES:
            raise Refused(f"a roster of {len(entries)} devices; secure aggregation needs at least {MIN_DEVICES}")
        if not all(usable_public_key(key) for key in publics):
            raise Refused("the roster holds a public key of low order: no secret can be agreed with it")
        self.roster = entries
        self.neighbours = neighbourhoods(list(entries), self.setup.complete_up_to, self.setup.graph_seed)[self.device]
        self.threshold = threshold_of(len(self.neighbours), self.setup.threshold)
        points = roster.points()
        at = [points[other] for other in self.neighbours]
        seeds = shamir.share_bytes(self.seed, self.threshold, at)
        secrets = shamir.share_bytes(self.masking.private_bytes(), self.threshold, at)
        sealed = []
        for other, x in zip(self.neighbours, at, strict=True):
            key = share_key(self.channel.agree(entries[other].channel), self.setup, self.device, other)
            sealed.append(SealedShare(self.device, other, seal(key, encode_share(seeds[x], secrets[x]),
                                                               associated(self.setup, self.device, other))))
        self.stage = DeviceStage.SHARED
        return Shares(self.device, tuple(sealed))

    def mask(self, delivery: Delivery, words: field.U64) -> MaskedInput:
        """Stage 3: ``words`` (its field words, ``setup.size`` of them) plus its self mask and the pairwise mask of
        each neighbour whose share arrived."""
        self.expect(DeviceStage.SHARED, "a delivery of shares")
        if len(words) != self.setup.size:
            raise Refused(f"an input of {len(words)} words; the round masks {self.setup.size}")
        for sealed in delivery.shares:
            if sealed.receiver != self.device or sealed.sender not in self.neighbours or sealed.sender in self.held:
                raise Refused(f"a share from {sealed.sender!r} to {sealed.receiver!r} is not one this device awaits")
            key = share_key(self.channel.agree(self.roster[sealed.sender].channel), self.setup, sealed.sender,
                            self.device)
            try:
                self.held[sealed.sender] = decode_share(open_sealed(key, sealed.sealed,
                                                                    associated(self.setup, sealed.sender, self.device)))
            except ShareRefused as error:
                raise Refused(f"the share from {sealed.sender}: {error}") from None
        self.live = tuple(other for other in self.neighbours if other in self.held)
        if len(self.live) < self.threshold:
            raise Refused(f"{len(self.live)} live neighbour(s), fewer than the threshold {self.threshold}: its "
                          "secrets could not be rebuilt")
        masked = field.add(np.asarray(words, np.uint64) & field.modulus_mask(self.setup.bits),
                           self_mask(self.seed, self.setup, self.device), self.setup.bits)
        try:
            for other in self.live:
                mask = pair_mask(self.masking.agree(self.roster[other].masking), self.setup, self.device, other)
                masked = field.add(masked, mask, self.setup.bits) if pair_sign(self.device, other) > 0 else \
                    field.subtract(masked, mask, self.setup.bits)
        except KeyRefused as error:  # the roster's keys were checked: only a library's change would get here
            raise Refused(str(error)) from None
        self.stage = DeviceStage.MASKED
        return MaskedInput(self.device, masked)

    def unmask(self, request: UnmaskRequest) -> UnmaskShares:
        """Stage 4, answered once: the seed share of each surviving neighbour and the secret share of each dropped
        one, after the soundness checks of the module docstring."""
        self.expect(DeviceStage.MASKED, "an unmask request")
        survivors, dropped = set(request.survivors), set(request.dropped)
        if survivors & dropped:
            raise Refused(f"the request names {sorted(survivors & dropped)[:3]} both survivor and dropped: it would "
                          "reveal a device's input")
        if self.device not in survivors:
            raise Refused("the request does not list this device among the survivors")
        unknown = (survivors | dropped) - set(self.roster)
        if unknown:
            raise Refused(f"the request names devices outside the round: {sorted(unknown)[:3]}")
        if len(survivors) < MIN_DEVICES or len(survivors & set(self.neighbours)) < self.threshold:
            raise Refused(f"fewer than the threshold {self.threshold} survivors around this device (or fewer than "
                          f"{MIN_DEVICES} in all)")
        self.stage = DeviceStage.DONE
        return UnmaskShares(self.device,
                            seeds={other: self.held[other][0] for other in self.live if other in survivors},
                            secrets={other: self.held[other][1] for other in self.live if other in dropped})

    def expect(self, stage: DeviceStage, what: str) -> None:
        if self.stage is not stage:
            raise Refused(f"{what} in stage {self.stage.value}")
