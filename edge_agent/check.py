"""``edge-agent check``: is this device ready to train? One line per item, and whether any would stop a session.

Items, in order: the torch build and the training device; the energy source the meter would use and why the others
were passed over; this device's data (samples, classes or targets, sample shape); with CurveZMQ, the key files and
the secret key's permissions; then the coordinator: a TCP connection, the ZMTP (CurveZMQ) handshake with the
configured keys, and a protocol answer. For the last, the check sends a Heartbeat from an identity that is not
registered (``check-CLIENT_ID``); the coordinator answers ``hello-first`` (with CurveZMQ, ``identity-mismatch``,
naming the id the key is allowed as, which the ``identity`` item compares with this agent's) and enrols nothing,
takes no client index.
Nothing here trains, writes device state or holds the state directory's lock, so it can run beside a running agent.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from fedge import codec
from fedge.codec import vocabulary as words
from fedge.edge_agent.config import AgentSettings


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    text: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.text}"


def check_torch(settings: AgentSettings) -> Item:
    import torch

    cuda = torch.cuda.is_available()
    if settings.device == "cuda" and not cuda:
        return Item("torch", False, f"torch {torch.__version__}: agent.device = cuda, but CUDA is not available "
                                    "(a CPU build of torch, or no GPU driver)")
    device = "cuda" if settings.device == "cuda" or (settings.device == "auto" and cuda) else "cpu"
    return Item("torch", True, f"torch {torch.__version__}, training on {device}"
                               + ("" if cuda else " (CUDA not available)"))


def check_energy(settings: AgentSettings) -> Item:
    from fedge.meter import SensorError, open_energy_source

    try:
        source, notes = open_energy_source(settings.energy)
    except (SensorError, ValueError) as exc:
        return Item("energy", False, f"agent.energy = {settings.energy}: {exc}")
    chosen = f"{source.source} ({source.kind}, {source.scope})" if source is not None else "none"
    return Item("energy", True, chosen + (f"; {'; '.join(notes)}" if notes else ""))


def check_data(settings: AgentSettings) -> Item:
    from fedge.client.data import DeviceData, LocalDataError

    try:
        data = DeviceData.open(settings.data)
    except LocalDataError as exc:
        return Item("data", False, str(exc))
    kind = "targets" if data.has_targets else "classes"
    return Item("data", True, f"{data.source}: {int(data.train_y.shape[0])} training and "
                              f"{int(data.test_y.shape[0])} test samples, {data.num_outputs} {kind}, samples "
                              f"shaped {tuple(data.input_shape)}")


def check_keys(settings: AgentSettings) -> Item:
    from fedge.plumbing.keys import AGENT_KEY

    secret = Path(settings.keys_dir) / f"{AGENT_KEY}.key_secret"
    for path in (secret, Path(settings.coordinator_public_key)):
        if not path.is_file():
            return Item("keys", False, f"{path} does not exist (edge-agent keygen --keys-dir {settings.keys_dir}, "
                                       "and the coordinator's public key file)")
        if not os.access(path, os.R_OK):
            return Item("keys", False, f"{path} is not readable by this user")
    mode = stat.S_IMODE(secret.stat().st_mode)
    if mode & 0o077:
        return Item("keys", False, f"{secret} is readable by others (mode {mode:04o}): chmod 600 {secret}")
    return Item("keys", True, f"{secret} (mode {mode:04o}) and the coordinator's key {settings.coordinator_public_key}")


def check_tcp(settings: AgentSettings, timeout_s: float) -> Item:
    from fedge.edge_agent.transport import tcp_peer

    peer = tcp_peer(settings.coordinator)
    if peer is None:
        return Item("coordinator", True, f"{settings.coordinator}: not a tcp:// address, no TCP check")
    try:
        with socket.create_connection(peer, timeout=timeout_s):
            pass
    except OSError as exc:
        return Item("coordinator", False, f"cannot reach {peer[0]}:{peer[1]} ({exc.strerror or exc})")
    return Item("coordinator", True, f"{peer[0]}:{peer[1]} accepts TCP connections")


def identity_item(reason: str, client_id: str) -> Item:
    """Whether the coordinator allows this device's key as its own client id (an ``identity-mismatch`` answer
    to the check's ``check-CLIENT_ID`` names the id the key is allowed as)."""
    allowed = re.search(r"allowed as client '([^']*)'", reason)
    if allowed is None:
        return Item("identity", False, f"the coordinator's answer names no client id: {reason}")
    if allowed.group(1) != client_id:
        return Item("identity", False, f"the coordinator allows this device's key as client {allowed.group(1)!r}, "
                                       f"but its client_id is {client_id!r}: set client_id = {allowed.group(1)!r}, or "
                                       f"rename allowed/{allowed.group(1)}.key to {client_id}.key on the coordinator")
    return Item("identity", True, f"the coordinator allows this device's key as client {client_id!r}")


def check_protocol(settings: AgentSettings, timeout_s: float) -> list[Item]:
    """The handshake with the configured keys, then a hello-first answer to an unregistered heartbeat."""
    from fedge.edge_agent.transport import CurveClientKeys, DealerTransport

    curve = None
    if settings.curve == "on":
        curve = CurveClientKeys.load(settings.keys_dir, settings.coordinator_public_key)
    identity = f"check-{settings.client_id}"
    try:
        transport = DealerTransport(settings.coordinator, identity, curve)
    except Exception as exc:  # zmq.ZMQError for an address libzmq cannot use
        return [Item("handshake", False, f"cannot connect to {settings.coordinator!r}: {exc}")]
    try:
        until = time.monotonic() + timeout_s
        while not transport.handshakes and not transport.last_failure and time.monotonic() < until:
            transport.poll(50)
        mechanism = "CurveZMQ" if curve else "ZMTP (no encryption)"
        if transport.last_failure:
            return [Item("handshake", False, transport.last_failure)]
        if not transport.handshakes:
            why = "a wrong coordinator public key, or CurveZMQ on one side only" if curve else \
                "CurveZMQ on the coordinator's side only?"
            return [Item("handshake", False, f"no {mechanism} handshake within {timeout_s:.0f} s ({why})")]
        items = [Item("handshake", True, f"{mechanism} handshake with {settings.coordinator}")]
        transport.send(codec.encode(codec.Heartbeat(run_id="", round=0, sender=identity)))
        while time.monotonic() < until:
            for frame in transport.poll(100):
                try:
                    answer = codec.decode(frame)
                except codec.UnsupportedVersion as exc:
                    return [*items, Item("protocol", False, f"the coordinator speaks wire-format version "
                                                            f"{exc.version}, this agent {codec.PROTOCOL_VERSION}: "
                                                            "upgrade the coordinator")]
                except codec.CodecError as exc:
                    return [*items, Item("protocol", False, f"the coordinator's answer does not decode: {exc}")]
                if isinstance(answer, codec.ErrorMessage):
                    items.append(Item("protocol", True, f"the coordinator answers in wire-format version "
                                                        f"{codec.PROTOCOL_VERSION} ({answer.code}: nothing was "
                                                        "enrolled)"))
                    if answer.code == words.IDENTITY_MISMATCH:  # CurveZMQ on: the answer names the key's id
                        items.append(identity_item(answer.reason, settings.client_id))
                    return items
        return [*items, Item("protocol", False, f"no answer within {timeout_s:.0f} s")]
    finally:
        transport.close()


def run_checks(settings: AgentSettings, timeout_s: float = 5.0) -> list[Item]:
    items = [check_torch(settings), check_energy(settings), check_data(settings)]
    if settings.curve == "on":
        items.append(check_keys(settings))
    reach = check_tcp(settings, timeout_s)
    items.append(reach)
    if reach.ok and all(item.ok for item in items if item.name == "keys"):
        items += check_protocol(settings, timeout_s)
    return items
