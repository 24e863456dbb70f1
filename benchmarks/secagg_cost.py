"""What secure aggregation costs a round, from the protocol alone (``protocol.secure_device`` on each device,
``protocol.secure_round`` on the coordinator, every message a real packet), before the runtime runs it.

    python benchmarks/secagg_cost.py                       # 10 devices, the paper CNN at 1x28x28, 16 bits
    python benchmarks/secagg_cost.py --devices 10 --values 500000 --bits 16 32

For each field width it prints, per device and round: the masked Update's packet bytes against 4 bytes per value
(the dense float32 payload) and against the plaintext Update of the same change (a dense f32 group, zstd level 1),
the bytes of the four stages' other packets each way (keys, roster, shares, delivery, unmask request, reveal), the
time one device takes to mask (its quantisation and keystreams; the median device) and the coordinator's time to
unmask. The change is uniform noise of the scale of a round's update; masked words are uniform whatever it is.

    python benchmarks/secagg_cost.py --known-answer        # the same round with fixed keys and seeds

``--known-answer`` replaces every device's X25519 pairs and self-mask seed with ones derived from its name (never
done outside this check) and prints one SHA-256 over every masked Update packet and the unmasked sum: a machine of
another architecture must print the same digest, or its masks would not cancel with this one's
(deploy/aarch64-emulation.sh compares them).
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import time

import numpy as np

from fedge import codec
from fedge.protocol.events import Send
from fedge.protocol.secure_device import SecureDevice, SecureLayout
from fedge.protocol.secure_round import SecureRound, peers_by_id
from fedge.secagg.encoding import grid_for, setup_of, task_settings
from fedge.secagg.keys import KeyPair


def fix_secrets(device: SecureDevice, name: str) -> None:
    """The known answer's keys and seed, from the device's name (a check of portability, not of secrecy)."""
    def derived(what: str) -> bytes:
        return hashlib.sha256(f"fedge known answer/{what}/{name}".encode()).digest()

    device.machine.channel = KeyPair.from_private_bytes(derived("channel"))
    device.machine.masking = KeyPair.from_private_bytes(derived("masking"))
    device.machine.seed = derived("seed")


def paper_cnn_sizes() -> list[int]:
    from fedge.models import ModelSpec, build, state_to_arrays

    arrays = state_to_arrays(build(ModelSpec("cnn", (1, 28, 28), 10), seed=0))
    return [int(a.size) for a in arrays.values() if a.dtype.kind == "f"]


def one_round(devices: int, sizes: list[int], bits: int, known_answer: bool = False) -> dict[str, float | str]:
    names = [f"device-{i:02d}" for i in range(devices)]
    grid = grid_for(bits, 0.05, sizes, devices)
    task = codec.Task("run", 2, "coordinator", secagg=task_settings(grid, 0.6, 50, 1, 0))
    layout = SecureLayout(tuple((f"t{i}", (size,)) for i, size in enumerate(sizes)))
    members = {name: SecureDevice("run", name, i, 0, task, layout) for i, name in enumerate(names)}
    if known_answer:
        for name, member in members.items():
            fix_secrets(member, name)
    digest = hashlib.sha256()
    secure = SecureRound("run", 2, 0, setup_of("run", 2, task.secagg or {}, grid.size), names,
                         peers_by_id({n: n.encode() for n in names}), 60.0, now=0.0)
    sent = {"up": 0, "down": 0}  # the stage packets' bytes, all devices

    def up(name: str, message: codec.Message) -> list[Send]:
        packet = codec.encode(message)
        sent["up"] += len(packet)
        return [e for e in secure.receive(name, codec.decode(packet), 0.0) if isinstance(e, Send)]

    def down(events: list[Send]) -> None:
        for event in events:
            packet = codec.encode(event.message)
            sent["down"] += len(packet)
            name = event.peer.decode()
            for reply in members[name].receive(codec.decode(packet)):
                down(up(name, reply))

    down([e for name in names for e in up(name, members[name].keys())])
    rng = np.random.default_rng(0)
    masking, masked_bytes, plain_bytes = [], [], []
    for name in names:
        # integers scaled: exact on every machine (a normal draw may take libm's last bit from the platform)
        change = (rng.integers(-(1 << 20), 1 << 20, grid.size) * (0.02 / (1 << 20))).astype(np.float32)
        started = time.perf_counter()
        group = members[name].masked_group(change)
        masking.append(time.perf_counter() - started)
        packet = codec.encode(codec.Update("run", 2, name, groups={"secagg": group}, num_samples=1))
        masked_bytes.append(len(packet))
        digest.update(packet)
        plain_bytes.append(len(codec.encode(codec.Update("run", 2, name, groups={"delta": codec.TensorGroup(
            dense={"change": change})}, num_samples=1))))
        update = codec.decode(packet)
        assert isinstance(update, codec.Update)
        words = np.asarray(update.groups["secagg"].dense["words"]).astype(np.uint64)
        assert secure.masked(name, words) == ""
    started = time.perf_counter()
    down([e for e in secure.close_inputs(0.0) if isinstance(e, Send)])
    unmask_s = time.perf_counter() - started
    total = secure.total()
    assert total is not None, secure.failed
    digest.update(np.ascontiguousarray(total, dtype="<u8").tobytes())
    return {"digest": digest.hexdigest(), "values": grid.size, "masked": statistics.median(masked_bytes), "plain": statistics.median(plain_bytes),
            "stages_up": sent["up"] / devices, "stages_down": sent["down"] / devices,
            "mask_s": statistics.median(masking), "unmask_s": unmask_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=10)
    parser.add_argument("--values", type=int, default=0, help="values per update (0: the paper CNN at 1x28x28)")
    parser.add_argument("--bits", type=int, nargs="+", default=[16])
    parser.add_argument("--known-answer", action="store_true",
                        help="fixed keys and seeds; print a digest of the masked packets and the sum")
    args = parser.parse_args()
    sizes = [args.values] if args.values else paper_cnn_sizes()
    print(f"# secagg_cost: {args.devices} devices (a complete graph), {sum(sizes):,} values per update; "
          f"{platform.machine()}, {platform.python_version()}")
    print("| bits | masked Update bytes | / (4 B x values) | / plaintext f32 Update | stage packets up / down per "
          "device | mask s per device | unmask s (coordinator) |")
    print("|---|---|---|---|---|---|---|")
    for bits in args.bits:
        r = one_round(args.devices, sizes, bits, args.known_answer)
        print(f"| {bits} | {r['masked']:,.0f} | {r['masked'] / (4 * r['values']):.3f} | "
              f"{r['masked'] / r['plain']:.3f} | {r['stages_up']:,.0f} / {r['stages_down']:,.0f} B | "
              f"{r['mask_s']:.3f} | {r['unmask_s']:.3f} |", flush=True)
        if args.known_answer:
            print(f"known answer, {bits} bits: {r['digest']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
