"""The cryptography of secure aggregation, every primitive from ``cryptography``: X25519 key agreement, HKDF-SHA256
key derivation, ChaCha20 keystreams as masks, ChaCha20-Poly1305 to carry a share to one neighbour.

Every derived key is bound to the round's ``context`` (session, round, attempt and a hash of the round's support:
``round_context``) and to the two device ids it joins, so a key never serves two rounds, two attempts or two
supports. A mask is a ChaCha20 keystream (a Raspberry Pi has no AES instructions) read as little-endian words and
reduced modulo 2^bits: uniform on the field. Keys and nonces come from the OS. Nothing of Fedge, no I/O.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fedge.secagg.field import U64, modulus_mask

KEY_BYTES = 32
NONCE_BYTES = 12


class ShareRefused(ValueError):
    """A share that does not open: forged, damaged, or meant for another device, round or attempt."""


class KeyRefused(ValueError):
    """A public key no secret can be agreed with: of the wrong length, or a low-order point (every shared secret
    with it is zero, whatever the private key)."""


@dataclass(frozen=True)
class KeyPair:
    """An X25519 key pair; ``public`` is its 32 raw bytes."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def generate(cls) -> KeyPair:
        private = X25519PrivateKey.generate()  # from the OS's entropy
        return cls(private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        private = X25519PrivateKey.from_private_bytes(raw)
        return cls(private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def agree(self, peer_public: bytes) -> bytes:
        """The X25519 shared secret with a peer's public key; ``KeyRefused`` for one of the wrong length or of low
        order (the library refuses an all-zero secret)."""
        if len(peer_public) != KEY_BYTES:
            raise KeyRefused(f"an X25519 public key has {KEY_BYTES} bytes, not {len(peer_public)}")
        try:
            return self.private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:
            raise KeyRefused("a public key of low order: no secret can be agreed with it") from None


def usable_public_key(raw: bytes) -> bool:
    """Whether a secret can be agreed with this public key (a throwaway exchange: a low-order key gives none)."""
    try:
        KeyPair.generate().agree(raw)
    except KeyRefused:
        return False
    return True


def round_context(session: str, round_number: int, attempt: int, support_digest: bytes) -> bytes:
    """What every key of a round's secure aggregation is bound to."""
    name = session.encode()
    return b"fedge-secagg/1" + struct.pack(">HQI", len(name), round_number, attempt) + name + support_digest


def support_digest(indices: np.ndarray | None, size: int) -> bytes:
    """A hash of the round's support (the positions every device masks, in order; None: all ``size`` of them)."""
    digest = hashlib.sha256(struct.pack(">Q", size))
    if indices is not None:
        digest.update(np.ascontiguousarray(indices, dtype="<i8").tobytes())
    return digest.digest()


def seed_commitment(seed: bytes, context: bytes, device: str) -> bytes:
    """SHA-256 over the round's context, the device and its 32-byte random seed: binding (a rebuilt seed that differs
    is caught) and, the seed being secret and random, hiding."""
    return hashlib.sha256(b"fedge-secagg-seed/" + context + b"/" + _ids(device, device) + seed).digest()


def derive(secret: bytes, context: bytes, purpose: bytes, first: str, second: str) -> bytes:
    """A 32-byte key from ``secret`` by HKDF-SHA256, bound to the context, its purpose and the two ids."""
    info = context + b"/" + purpose + b"/" + _ids(first, second)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def _ids(first: str, second: str) -> bytes:
    a, b = first.encode(), second.encode()
    return struct.pack(">H", len(a)) + a + struct.pack(">H", len(b)) + b


def keystream(key: bytes, count: int, bits: int) -> U64:
    """``count`` words uniform modulo 2^bits: ChaCha20 under ``key`` (nonce and counter zero), 4 bytes a word for
    fields of at most 32 bits, 8 above."""
    width = 4 if bits <= 32 else 8
    encryptor = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    raw = encryptor.update(bytes(count * width))
    words = np.frombuffer(raw, dtype=f"<u{width}").astype(np.uint64)
    return words & modulus_mask(bits)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """ChaCha20-Poly1305 with a fresh random nonce, which leads the ciphertext."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated)


def open_sealed(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    if len(sealed) < NONCE_BYTES + 16:
        raise ShareRefused("a sealed share too short to hold its nonce and tag")
    try:
        return ChaCha20Poly1305(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except InvalidTag:
        raise ShareRefused("a share that does not open (forged, damaged, or for another device or round)") from None
