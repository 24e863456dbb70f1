"""Shamir's t-of-k secret sharing over the prime field GF(2^127 - 1): how a device's self-mask seed and masking
secret survive its dropping out, in pieces no t - 1 of its neighbours can put together.

A secret of up to 15 bytes is one field element; longer byte strings (a 32-byte key) are shared 15 bytes at a
time, every chunk with its own polynomial, evaluated at the same points. Shares are evaluated at nonzero points x
(the receiver's place in the round's roster, plus one). The polynomial's coefficients come from the OS
(``secrets``). Pure: integers only; nothing of Fedge, no I/O.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

PRIME = 2**127 - 1  # a Mersenne prime: every 15-byte chunk (120 bits) is below it
CHUNK = 15


def share(secret: int, threshold: int, points: Sequence[int]) -> dict[int, int]:
    """Shares of ``secret`` at each of ``points``: the values there of a random polynomial of degree
    ``threshold - 1`` whose constant term is the secret; any ``threshold`` of them give it back."""
    check_points(points)
    if not 0 <= secret < PRIME:
        raise ValueError("a Shamir secret must lie in [0, 2^127 - 1)")
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold {threshold} with {len(points)} shares: it must lie in [1, {len(points)}]")
    coefficients = [secret, *(secrets.randbelow(PRIME) for _ in range(threshold - 1))]
    return {x: evaluate(coefficients, x) for x in points}


def evaluate(coefficients: Sequence[int], x: int) -> int:
    """The polynomial with these coefficients (constant term first) at ``x``, by Horner's rule."""
    value = 0
    for coefficient in reversed(coefficients):
        value = (value * x + coefficient) % PRIME
    return value


def reconstruct(shares: Mapping[int, int], threshold: int) -> int:
    """The secret from at least ``threshold`` shares (point -> value): Lagrange interpolation at 0 over the first
    ``threshold`` points in order."""
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} share(s), {threshold} needed")
    points = sorted(shares)[:threshold]
    check_points(points)
    secret = 0
    for x_i in points:
        numerator, denominator = 1, 1
        for x_j in points:
            if x_j != x_i:
                numerator = numerator * x_j % PRIME
                denominator = denominator * (x_j - x_i) % PRIME
        secret = (secret + shares[x_i] * numerator * pow(denominator, -1, PRIME)) % PRIME
    return secret


def check_points(points: Sequence[int]) -> None:
    if len(set(points)) != len(points) or any(not 0 < x < PRIME for x in points):
        raise ValueError("Shamir points must be distinct and lie in [1, 2^127 - 1)")


def share_bytes(secret: bytes, threshold: int, points: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Shares of a byte string, one field element per 15-byte chunk, each point's as a tuple."""
    chunks = [int.from_bytes(secret[at:at + CHUNK], "big") for at in range(0, len(secret), CHUNK)]
    per_chunk = [share(chunk, threshold, points) for chunk in chunks]
    return {x: tuple(shares[x] for shares in per_chunk) for x in points}


def reconstruct_bytes(shares: Mapping[int, Sequence[int]], threshold: int, length: int) -> bytes:
    """The byte string of ``length`` bytes from at least ``threshold`` shares of ``share_bytes``."""
    chunks = -(-length // CHUNK)
    if any(len(values) != chunks for values in shares.values()):
        raise ValueError(f"a share of a {length}-byte secret has {chunks} part(s)")
    out = b""
    for at in range(chunks):
        value = reconstruct({x: values[at] for x, values in shares.items()}, threshold)
        size = min(CHUNK, length - at * CHUNK)
        if value >= 1 << (8 * size):
            raise ValueError("the shares do not reconstruct a secret of this length (shares of another secret?)")
        out += value.to_bytes(size, "big")
    return out


ELEMENT_BYTES = 16  # a field element on the wire, big-endian


def to_bytes(values: Sequence[int]) -> bytes:
    """A share's field elements as bytes (16 each, big-endian)."""
    return b"".join(value.to_bytes(ELEMENT_BYTES, "big") for value in values)


def from_bytes(data: bytes, count: int) -> tuple[int, ...]:
    """``count`` field elements from bytes; a wrong length or an element outside the field is refused."""
    if len(data) != count * ELEMENT_BYTES:
        raise ValueError(f"a share of {len(data)} bytes; {count * ELEMENT_BYTES} expected")
    values = tuple(int.from_bytes(data[at:at + ELEMENT_BYTES], "big") for at in range(0, len(data), ELEMENT_BYTES))
    if any(value >= PRIME for value in values):
        raise ValueError("a share element outside the field")
    return values
