"""A round's downlink bodies, encoded once for every client that is sent the same payload.

FedAvg, FedProx, SCAFFOLD and a dense FedBN send every selected client the same model: compressing it once per
client was most of the coordinator's time per agent. ``DownlinkBodies.frame`` encodes a Task's body (its tensor
groups and meta) the first time a payload is seen in the round and joins the cached body to each client's own
header (``codec.encode(task, body=...)``: the same bytes as encoding the whole Task), or hands out the header and
the shared body in parts (``parts``) for the transport to send as the frames of one message. A payload counts as seen when
its groups hold the very same tensors (the same array objects and the same sparse section object: a server half
that hands every client its one model does) and an equal meta; anything else (ef's catch-ups, pFedLA's personal
models) is encoded for its client alone. Identity, not content, is compared, so the check costs nothing per
tensor, and the cached groups are kept referenced for the round so that no identity can be reused. Cleared at every round
(in an asynchronous session, at every base version: each task has its own round, its task id).

``parts`` cuts the body into frames of at most ``frame_bytes`` (views of the one body, not copies). Under CurveZMQ
libzmq encrypts a frame when a connection's engine takes it from its queue and takes the next only once that one is
written, so a connection holds one frame's ciphertext at a time: a thousand agents being sent a 4.6 MB model hold a
thousand 16 KiB ciphertexts (``CURVE_BODY_FRAME``) instead of a thousand whole copies (docs/scale.md). Pure bytes in memory:
no sockets, no algorithms by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedge import codec

MAX_BODIES = 64  # distinct payloads cached in one round (beyond, a payload is encoded for its client alone)
# The largest body frame of a Task sent in parts. Under CurveZMQ it is one connection's ciphertext, so it is kept
# small there (16 KiB: ef's own 143 KB bodies at 1,000 agents held 64 MB of ciphertext in 64 KiB frames, 16 MB in
# these); without it nothing is held per connection, and fewer frames cost the sender less.
BODY_FRAME = 64 * 1024
CURVE_BODY_FRAME = 16 * 1024


def same_groups(a: Mapping[str, codec.TensorGroup], b: Mapping[str, codec.TensorGroup]) -> bool:
    """True when two payloads' groups carry the same tensors."""
    if a.keys() != b.keys():
        return False
    for name, group in a.items():
        other = b[name]
        if group.sparse is not other.sparse or group.dense.keys() != other.dense.keys():
            return False
        if any(array is not other.dense[key] for key, array in group.dense.items()):
            return False
    return True


class DownlinkBodies:
    """The bodies encoded in the current round; ``frame(task)`` is the Task's packet."""

    def __init__(self, frame_bytes: int = BODY_FRAME) -> None:
        self.frame_bytes = frame_bytes
        self.key: tuple[str, int] = ("round", -1)  # the round (or an asynchronous task's base version) cached
        self.cached: list[tuple[dict[str, codec.TensorGroup], dict[str, Any], bytes]] = []
        self.encoded = 0  # bodies compressed this round
        self.shared = 0   # tasks that reused a body this round

    def body(self, task: codec.Task) -> bytes:
        """The Task's body, encoded once for every task of the round with the same payload."""
        key = ("round", task.round) if task.base_version is None else ("version", task.base_version)
        if key != self.key:
            self.key, self.cached, self.encoded, self.shared = key, [], 0, 0
        for groups, meta, body in self.cached:
            if meta == task.meta and same_groups(groups, task.groups):
                self.shared += 1
                return body
        body = codec.encode_body(task.groups, task.meta)
        self.encoded += 1
        if len(self.cached) < MAX_BODIES:
            self.cached.append((dict(task.groups), dict(task.meta), body))
        return body

    def parts(self, task: codec.Task) -> list[bytes | memoryview]:
        """The Task's packet in parts, its own header and then the (shared) body in frames of at most
        ``frame_bytes`` bytes: the packet is their concatenation, and an agent that says it takes ``task-parts`` is
        sent them as the frames of one ZeroMQ message, so that the body's bytes are queued once however many
        agents are sent them."""
        body, size = memoryview(self.body(task)), self.frame_bytes
        return [codec.encode_header(task), *(body[at:at + size] for at in range(0, len(body), size))]

    def frame(self, task: codec.Task) -> bytes:
        """The Task's packet in one piece."""
        return codec.encode(task, body=self.body(task))
