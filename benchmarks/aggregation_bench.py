"""What order-independent streaming aggregation costs the coordinator, against a plain float64 running sum.

    python benchmarks/aggregation_bench.py [--updates 10] [--repeats 5]

Builds FedAvg's server half on the paper CNN at 3x32x32 (1,147,466 parameters) and folds ``--updates`` dense model
uploads of random float32 values (sample counts 50-5,000) into it (``Server.fold``, the exact sums of
``algorithms.accumulate``), then closes the round; and, in the same run, the same uploads through a plain float64
weighted sum in client order (what aggregation was before: fast, but its bits depend on the order). Prints the
milliseconds per update of each (best of ``--repeats``), their ratio, the accumulator's memory, and whether two
orders gave the same bits for each method. Figures only: no thresholds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedge.algorithms import fedavg
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.codec import TensorGroup
from fedge.models import ModelSpec, build, state_to_arrays

SPEC = {"name": "cnn", "input_shape": [3, 32, 32], "num_classes": 10, "pan": "off", "pan_a": 0.1, "pan_t": 1.0,
        "options": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = build(ModelSpec.from_dict(SPEC), seed=0)
    initial = state_to_arrays(model)
    context = ServerContext(num_clients=args.updates, layout=ModelLayout.of(model), seed=0)
    rng = np.random.default_rng(0)
    updates = [ClientUpdate(f"c{i}", i, int(rng.integers(50, 5000)), Payload(groups={"model": TensorGroup(dense={
        name: (value + 0.01 * rng.standard_normal(value.shape)).astype(value.dtype) if value.dtype.kind == "f"
        else value for name, value in initial.items()})})) for i in range(args.updates)]
    size = sum(v.size for v in initial.values() if v.dtype.kind == "f")

    def exact(order: list[int]) -> tuple[float, dict[str, np.ndarray], int]:
        server = fedavg.Server(fedavg.Config(), initial, context)
        started = time.perf_counter()
        for i in order:
            server.fold(1, updates[i])
        slices = sum(len(t.slices) * t.size * 8 for t in server.folding.weighted.sums.values()) if server.folding else 0
        server.close_round(1)
        return time.perf_counter() - started, server.model, slices

    def running(order: list[int]) -> tuple[float, dict[str, np.ndarray]]:
        started = time.perf_counter()
        total = sum(u.num_samples for u in updates)
        sums = {n: np.zeros(v.shape, dtype=np.float64) for n, v in initial.items() if v.dtype.kind == "f"}
        for i in order:
            weight = updates[i].num_samples / total
            for name, array in updates[i].payload.groups["model"].dense.items():
                if name in sums:
                    sums[name] += weight * array.astype(np.float64)
        return time.perf_counter() - started, {n: s.astype(np.float32) for n, s in sums.items()}

    forward, backward = list(range(args.updates)), list(range(args.updates))[::-1]
    exact_s = min(exact(forward)[0] for _ in range(args.repeats))
    running_s = min(running(forward)[0] for _ in range(args.repeats))
    _, a, memory = exact(forward)
    _, b, _ = exact(backward)
    _, c = running(forward)
    _, d = running(backward)
    same_exact = all(a[n].tobytes() == b[n].tobytes() for n in a)
    same_running = all(c[n].tobytes() == d[n].tobytes() for n in c)
    print(f"FedAvg on the paper CNN at 3x32x32 ({size:,} float parameters), {args.updates} dense updates")
    print(f"  exact streaming sums   {1000 * exact_s / args.updates:7.1f} ms per update "
          f"(accumulators {memory / 2**20:.0f} MiB, {memory / (size * 8):.1f} float64 copies of the model)")
    print(f"  float64 running sum    {1000 * running_s / args.updates:7.1f} ms per update")
    print(f"  ratio                  {exact_s / running_s:7.2f}")
    print(f"  same bits in reverse order: exact {same_exact}, running sum {same_running}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
