"""What the parties of a secure-aggregation round say to each other, stage by stage, as frozen dataclasses (the
wire format carries them; ``codec`` knows their bytes, this package their meaning).

1. Each device advertises ``Keys``; the coordinator answers with the ``Roster`` of every device that did.
2. Each device sends ``Shares``: its sealed shares, one per neighbour; each device is delivered the ``Delivery``
   of the shares addressed to it by the devices that shared.
3. Each device sends its ``MaskedInput``.
4. The coordinator sends every survivor one ``UnmaskRequest`` (who sent a masked input, who dropped); each answers
   ``UnmaskShares``: its share of each surviving neighbour's self-mask seed and of each dropped neighbour's masking
   secret, never both of one device. Nothing of Fedge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fedge.secagg.field import U64


@dataclass(frozen=True)
class Setup:
    """What every party of a round knows before it starts: the keys' context (``keys.round_context``), the field
    width, the number of words each input has, the threshold fraction, the size up to which the graph is complete
    and the seed of a larger graph's order."""

    context: bytes
    bits: int
    size: int
    threshold: float
    complete_up_to: int
    graph_seed: int


@dataclass(frozen=True)
class Keys:
    """A device's two public keys: ``channel`` to receive its shares, ``masking`` for the pairwise masks; and
    ``seed_digest``, its commitment to its self-mask seed (``keys.seed_commitment``), which the coordinator keeps to
    check the seed it rebuilds (a roster carries the keys alone)."""

    device: str
    channel: bytes
    masking: bytes
    seed_digest: bytes = b""


@dataclass(frozen=True)
class Roster:
    """The devices that advertised keys, with their keys: every party builds the graph from it."""

    keys: tuple[Keys, ...]

    def by_device(self) -> dict[str, Keys]:
        return {entry.device: entry for entry in self.keys}

    def points(self) -> dict[str, int]:
        """Each device's Shamir point: its place in the sorted roster, plus one."""
        return {device: at + 1 for at, device in enumerate(sorted(entry.device for entry in self.keys))}


@dataclass(frozen=True)
class SealedShare:
    """One device's shares for one neighbour, sealed with a key only the two of them can derive."""

    sender: str
    receiver: str
    sealed: bytes


@dataclass(frozen=True)
class Shares:
    device: str
    shares: tuple[SealedShare, ...]


@dataclass(frozen=True)
class Delivery:
    """The shares addressed to one device, from the devices that shared (their senders are its live neighbours)."""

    shares: tuple[SealedShare, ...]


@dataclass(frozen=True)
class MaskedInput:
    device: str
    words: U64


@dataclass(frozen=True)
class UnmaskRequest:
    """Who sent a masked input (``survivors``: their self masks are removed) and who did not (``dropped``: their
    pairwise masks are rebuilt); the two never overlap."""

    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True)
class UnmaskShares:
    """One survivor's answer: its share of each surviving neighbour's seed and of each dropped neighbour's masking
    secret (device -> the share's field elements)."""

    device: str
    seeds: Mapping[str, tuple[int, ...]]
    secrets: Mapping[str, tuple[int, ...]]
