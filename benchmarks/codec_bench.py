"""Sizes and speeds of the codec on the DSSA paper CNN, against the lossless floors.

    python benchmarks/codec_bench.py            # 100 Adam steps (batch 16) of training, 21 timing repeats
    python benchmarks/codec_bench.py --quick    # 20 steps, 11 repeats

The CNN (conv3x3 3->32->64->128, pad 1, ReLU + maxpool2 each, then Linear 2048->512->10, biases
everywhere: 1,146,720 weights + 746 biases) is built with torch.nn and trained briefly on
synthetic, learnable 32x32x3 data so its weights have a trained model's magnitude structure.
For each retained fraction k/N it prints, in one run:

* index bytes / log2 C(N,k): the encoded index field against the floor for an arbitrary k-subset;
* downlink bytes / (log2 C(N,k) + 32k bits + 4 bytes per bias): the whole Task packet;
* uplink bytes / 4(N-k): an index-free Update with the values at the N-k pruned positions;
* encode and decode ms (wall-clock medians; encode = values gathered from the dense weights +
  encode, decode = decode + dense arrays back), their sum as MB/s of the dense float32 model,
  and the same from this thread's CPU time (robust when other processes share the cores);
* np.copy and zstd level 1 over the dense float32 model, as references, and enc+dec time over
  the zstd-1 compress + decompress time of the dense model (comparable across machines and loads).

A last row uses a uniformly random mask at k/N = 0.1. Torch is used only here, never by codec/.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedge.codec import SparseSection, Task, TensorGroup, Update, decode, encode, retained_count, topk_mask  # noqa: E402
from fedge.codec.frames import compress, decompress  # noqa: E402
from fedge.codec.sparsewire import encode_section  # noqa: E402

FRACTIONS = ("0.1", "0.2", "0.3", "0.5", "0.8")


class PaperCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(2048, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in (self.conv1, self.conv2, self.conv3):
            x = nn.functional.max_pool2d(nn.functional.relu(conv(x)), 2)
        return self.fc2(nn.functional.relu(self.fc1(x.flatten(1))))


def trained_weights(steps: int) -> dict[str, np.ndarray]:
    """Train on noisy copies of 10 smooth random class prototypes (learnable, not trivial)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    net = PaperCNN()
    protos = nn.functional.interpolate(torch.randn(10, 3, 8, 8, generator=gen), size=32, mode="bilinear")
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(steps):
        labels = torch.randint(0, 10, (16,), generator=gen)
        images = protos[labels] + 3.0 * torch.randn(16, 3, 32, 32, generator=gen)
        loss = nn.functional.cross_entropy(net(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {name: t.detach().numpy().copy() for name, t in net.state_dict().items()}


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Medians of wall-clock and of this thread's CPU time, in ms (the second ignores preemption)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return float(np.median(wall)) * 1e3, float(np.median(cpu)) * 1e3


def measure_row(label: str, mask: np.ndarray, weights: dict[str, np.ndarray], biases: dict[str, np.ndarray],
                repeats: int) -> dict[str, Any]:
    names, arrays = list(weights), list(weights.values())
    n, k = mask.size, int(np.count_nonzero(mask))
    dense_bytes = 4 * (n + sum(b.size for b in biases.values()))

    def encode_down() -> bytes:
        section = SparseSection.from_dense(names, arrays, mask)
        return encode(Task("bench", 7, "coordinator", {"model": TensorGroup(biases, section)}))

    packet = encode_down()

    def decode_down() -> Any:
        group = decode(packet).groups["model"]
        return group.sparse.to_dense(), group.dense

    section = SparseSection.from_dense(names, arrays, mask)
    index_bytes = sum(len(seg[2]) + len(seg[3]) for seg in encode_section(section, "f32")["ix"])
    uplink = encode(Update("bench", 7, "agent-0", {"model": TensorGroup(
        {}, SparseSection.masked_from_dense(names, arrays, mask, select=False))}))
    floor_index = log2_binomial(n, k) / 8
    (enc_ms, enc_cpu), (dec_ms, dec_cpu) = median_ms(encode_down, repeats), median_ms(decode_down, repeats)
    return {
        "mask": label, "q": k / n, "k": k, "index": index_bytes, "index_ratio": index_bytes / floor_index,
        "down": len(packet), "down_ratio": len(packet) / (floor_index + 4 * k + 4 * sum(b.size for b in biases.values())),
        "up": len(uplink), "up_ratio": len(uplink) / (4 * (n - k)), "up_slack": len(uplink) - 0.86 * 4 * (n - k),
        "enc": enc_ms, "dec": dec_ms, "mbs": dense_bytes / 1e6 / ((enc_ms + dec_ms) / 1e3),
        "cpu_mbs": dense_bytes / 1e6 / ((enc_cpu + dec_cpu) / 1e3),
    }


def references(flat: np.ndarray, repeats: int) -> tuple[list[str], float]:
    """Reference lines, and the zstd-1 compress + decompress time of the dense model in ms."""
    raw = flat.tobytes()
    frame = compress(raw, level=1)
    mb = flat.nbytes / 1e6
    copy_ms = median_ms(lambda: np.copy(flat), repeats)[0]
    zc_ms = median_ms(lambda: compress(raw, level=1), repeats)[0]
    zd_ms = median_ms(lambda: decompress(frame, max_size=len(raw), where="ref", need_checksum=True), repeats)[0]
    return [f"np.copy of the dense fp32 model ({flat.nbytes:,} B): {copy_ms:.3f} ms = {mb / copy_ms * 1e3:,.0f} MB/s",
            f"zstd-1 over the dense fp32 model: compress {zc_ms:.2f} ms ({mb / zc_ms * 1e3:,.0f} MB/s), "
            f"decompress {zd_ms:.2f} ms ({mb / zd_ms * 1e3:,.0f} MB/s), ratio {len(frame) / len(raw):.3f}"], zc_ms + zd_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short training and 11 timing repeats")
    parser.add_argument("--steps", type=int, help="Adam steps of training (default 100, --quick 20)")
    args = parser.parse_args()
    steps = args.steps if args.steps is not None else (20 if args.quick else 100)
    repeats = 11 if args.quick else 21
    torch.set_num_threads(2)
    start = time.perf_counter()
    state = trained_weights(steps)
    torch.set_num_threads(1)
    weights = {n: a for n, a in state.items() if a.ndim >= 2}
    biases = {n: a for n, a in state.items() if a.ndim < 2}
    n = sum(a.size for a in weights.values())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# codec_bench: {n:,} weights + {sum(b.size for b in biases.values())} biases, {steps} Adam steps "
          f"({time.perf_counter() - start:.1f} s), medians of {repeats}, numpy {np.__version__}, "
          f"{platform.processor() or platform.machine()}, load average {load:.2f}")
    flat = np.concatenate([a.reshape(-1) for a in state.values()]).astype(np.float32)
    reference_lines, zstd_ms = references(flat, repeats)
    rows = []
    for q in FRACTIONS:
        mask = topk_mask(list(weights.values()), retained_count(n, keep=q))
        rows.append(measure_row("trained", mask, weights, biases, repeats))
    rng = np.random.default_rng(0)
    random_mask = np.zeros(n, dtype=bool)
    random_mask[rng.choice(n, retained_count(n, keep="0.1"), replace=False)] = True
    rows.append(measure_row("random", random_mask, weights, biases, repeats))
    print("| mask | k/N | k | index B | index / log2C | downlink B | down / (log2C+32k+b) | uplink B "
          "| up / 4(N-k) | enc ms | dec ms | enc+dec MB/s | (CPU-time MB/s) | enc+dec / zstd-1 dense c+d |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mask']} | {r['q']:.1f} | {r['k']:,} | {r['index']:,} | {r['index_ratio']:.3f} | {r['down']:,} "
              f"| {r['down_ratio']:.3f} | {r['up']:,} | {r['up_ratio']:.3f} | {r['enc']:.2f} | {r['dec']:.2f} "
              f"| {r['mbs']:,.0f} | {r['cpu_mbs']:,.0f} | {(r['enc'] + r['dec']) / zstd_ms:.2f} |")
    for line in reference_lines:
        print(f"reference: {line}")
    checks = [("index <= 1.05x at 0.1 (trained)", rows[0]["index_ratio"] <= 1.05),
              ("index <= 1.02x for 0.2-0.8 (trained)", all(r["index_ratio"] <= 1.02 for r in rows[1:5])),
              ("index <= 1.10x at 0.1 (random mask)", rows[5]["index_ratio"] <= 1.10),
              ("downlink <= 0.85x floor (trained)", all(r["down_ratio"] <= 0.85 for r in rows[:5])),
              ("uplink <= 0.86 x 4(N-k) + 64 B", all(r["up_slack"] <= 64 for r in rows)),
              ("enc+dec >= 450 MB/s at 0.5", rows[3]["mbs"] >= 450),
              ("enc+dec >= 1000 MB/s at 0.1", rows[0]["mbs"] >= 1000)]
    print("targets: " + ", ".join(f"{name}: {'PASS' if ok else 'FAIL'}" for name, ok in checks))
    print(f"# total {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
