"""ef's sub-protocol, typed: what an ef Task says of the public model it carries (``EfTask``) and what an ef Update
says of the model it was trained from (``EfUpdate``), each the one key ``ef`` of its payload's meta: a list whose
first item is the schema version of the sub-protocol (``SCHEMA``) and whose others are the fields in their
declared order (no field names on the wire).

Every field is always present and means one thing: no key whose absence carries meaning, no sentinel versions.
``from_meta`` refuses, in one line naming the field, a structure of another schema, with a missing or extra field,
or with a value of the wrong type or range; the coordinator answers such an update ``invalid-update``, and a device
reports such a task as a failed round. Plain data over the codec's msgpack types: no torch, no numpy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

SCHEMA = 1
KEY = "ef"


class Source(enum.Enum):
    """Where a device's keyframe comes from before the task's chain of keyframe deltas is applied."""

    DENSE = "dense"  # the task carries the keyframe dense (group ``public``)
    CHAIN = "chain"  # the device's keyframe at version ``start``: its replica, or, at version 0 for a device with
    #                  none yet, the start rebuilt from the model spec and the session seed (checked by start_crc)


@dataclass(frozen=True)
class EfTask:
    """The public model a task carries. ``start`` is the keyframe version the chain starts from (``keyframe`` for
    DENSE); ``chain`` the keyframe versions whose deltas it carries, in
    order; after it the device holds keyframe ``keyframe`` (CRC ``keyframe_crc``). With ``catchup`` the task also
    carries the round's catch-up (group ``catchup``), and the round's public model is keyframe + catch-up, version
    ``version``, CRC ``crc``; without, it is the keyframe itself. ``start_crc`` is the CRC of the start model as
    the coordinator built it (a device that rebuilds it checks it)."""

    version: int
    crc: int
    keyframe: int
    keyframe_crc: int
    source: Source
    start: int
    chain: tuple[int, ...]
    catchup: bool
    start_crc: int

    def __post_init__(self) -> None:
        if self.source is Source.DENSE and (self.start != self.keyframe or self.chain):
            raise ValueError("meta.ef: a dense keyframe carries no chain and starts at the keyframe")
        versions = (self.start, *self.chain)
        if any(b <= a for a, b in zip(versions, versions[1:], strict=False)) or versions[-1] != self.keyframe:
            raise ValueError(f"meta.ef: the chain {list(self.chain)} from {self.start} does not end at keyframe "
                             f"{self.keyframe}")
        if not 0 <= self.keyframe <= self.version or self.catchup != (self.keyframe < self.version):
            raise ValueError(f"meta.ef: keyframe {self.keyframe} and version {self.version} do not fit "
                             f"(catch-up: {self.catchup})")

    def to_meta(self) -> dict[str, Any]:
        return {KEY: [SCHEMA, self.version, self.crc, self.keyframe, self.keyframe_crc, self.source.value, self.start,
                      list(self.chain), self.catchup, self.start_crc]}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> EfTask:
        raw = _structure(meta, [f.name for f in fields(cls)])
        try:
            source = Source(raw["source"])
        except ValueError:
            raise ValueError(f"meta.ef.source must be one of {[s.value for s in Source]}, got "
                             f"{raw['source']!r:.40}") from None
        chain = raw["chain"]
        if not isinstance(chain, (list, tuple)) or not all(_is_int(v) and v >= 0 for v in chain):
            raise ValueError(f"meta.ef.chain must be a list of versions, got {chain!r:.40}")
        if not isinstance(raw["catchup"], bool):
            raise ValueError(f"meta.ef.catchup must be true or false, got {raw['catchup']!r:.40}")
        return cls(version=_version(raw, "version"), crc=_crc(raw, "crc"), keyframe=_version(raw, "keyframe"),
                   keyframe_crc=_crc(raw, "keyframe_crc"), source=source, start=_version(raw, "start"),
                   chain=tuple(int(v) for v in chain), catchup=raw["catchup"], start_crc=_crc(raw, "start_crc"))


@dataclass(frozen=True)
class EfUpdate:
    """An update's origin: the public model version it was trained from (``base``) and the keyframe version its
    device holds (``keyframe``)."""

    base: int
    keyframe: int

    def to_meta(self) -> dict[str, Any]:
        return {KEY: [SCHEMA, self.base, self.keyframe]}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> EfUpdate:
        raw = _structure(meta, [f.name for f in fields(cls)])
        return cls(base=_version(raw, "base"), keyframe=_version(raw, "keyframe"))


def _structure(meta: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The fields of meta's ef list by name, after its schema and length are checked."""
    raw = meta.get(KEY)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"meta.{KEY} must be ef's structure (a list, schema {SCHEMA}), got {raw!r:.40}")
    if raw[0] != SCHEMA or isinstance(raw[0], bool):
        raise ValueError(f"meta.{KEY} is of schema {raw[0]!r:.20}; this side speaks schema {SCHEMA}")
    if len(raw) != len(names) + 1:
        raise ValueError(f"meta.{KEY} has {len(raw) - 1} fields; schema {SCHEMA} has {len(names)} "
                         f"({', '.join(names)})")
    return dict(zip(names, raw[1:], strict=True))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _version(raw: Mapping[str, Any], name: str) -> int:
    value = raw[name]
    if not _is_int(value) or not 0 <= value < 2**62:
        raise ValueError(f"meta.ef.{name} must be a version (an integer >= 0), got {value!r:.40}")
    return int(value)


def _crc(raw: Mapping[str, Any], name: str) -> int:
    value = raw[name]
    if not _is_int(value) or not 0 <= value < 2**32:
        raise ValueError(f"meta.ef.{name} must be a CRC-32, got {value!r:.40}")
    return int(value)
