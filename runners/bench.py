"""`quest bench`: forward+backward time of every variant over `standard`, measured side by side in one
process (round-robin, median of repeats), and peak memory of quest vs standard vs a naive explicit
softmax at a long sequence, each measured in a fresh child process (peak RSS on CPU, or peak CUDA memory).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from common.attention import VARIANTS, attend, elliptical_metric, get_variant


def make_inputs(shape, variant: str, device: str, dtype=torch.float32, seed: int = 0):
    """q, k, v, the variant's fold (its learnable scales as in a model) and, for elliptical variants,
    previous values."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_() for _ in range(3))
    spec, (_, heads, _, head_dim) = get_variant(variant), shape
    fold = spec.make_fold(heads, head_dim).to(device, dtype)
    prev = torch.randn(*shape, generator=g, dtype=dtype).to(device) if spec.elliptical else None
    return q, k, v, fold, prev


def step(variant: str, q, k, v, fold, prev, naive: bool = False) -> None:
    """One forward+backward; elliptical variants include computing their weights."""
    metric = elliptical_metric(v.detach(), prev) if prev is not None else None
    if naive:
        qf, kf, scale = fold(q, k, metric)
        out = ((qf @ kf.transpose(-2, -1)) * scale).softmax(-1) @ v
    else:
        out = attend(q, k, v, variant, fold=fold, metric=metric)
    out.sum().backward()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_variants(shape, variants, device: str, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per forward+backward. Variants are interleaved, and each round starts at the next
    variant, so neither drift nor a position in the round favours any of them."""
    inputs = {v: make_inputs(shape, v, device) for v in variants}
    times = {v: [] for v in variants}
    for r in range(warmup + repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            _sync(device)
            t0 = time.perf_counter()
            step(v, *inputs[v])
            _sync(device)
            if r >= warmup:
                times[v].append(time.perf_counter() - t0)
    return {v: statistics.median(t) for v, t in times.items()}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def peak_memory_mb(shape, variant: str, naive: bool, device: str) -> float:
    """Peak memory of one forward+backward above what the inputs already hold (run in this process)."""
    inputs = make_inputs(shape, variant, device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(variant, *inputs, naive=naive)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    base = _rss_mb()
    step(variant, *inputs, naive=naive)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base


def _memory_in_child(shape, variant: str, naive: bool, device: str) -> float:
    cmd = [sys.executable, "-m", "runners.bench", "--_memory", json.dumps([list(shape), variant, naive, device])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest bench", description=__doc__)
    parser.add_argument("--shape", default="8,8,1024,64", help="batch,heads,tokens,head_dim for the timing table")
    parser.add_argument("--long", default="1,4,16384,64", help="long-sequence shape (timing of standard/quest, memory)")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive explicit-softmax memory column")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--_memory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._memory:
        shape, variant, naive, device = json.loads(args._memory)
        print(peak_memory_mb(tuple(shape), variant, naive, device))
        return 0

    shape = tuple(int(x) for x in args.shape.split(","))
    long = tuple(int(x) for x in args.long.split(","))
    result = {"device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "shape": shape, "long_shape": long}
    times = time_variants(shape, list(VARIANTS), args.device, args.repeats)
    result["time_ms"] = {v: 1e3 * t for v, t in times.items()}
    result["ratio"] = {v: t / times["standard"] for v, t in times.items()}
    long_times = time_variants(long, ["standard", "quest"], args.device, max(1, args.repeats // 2), warmup=0)
    result["long_ratio_quest"] = long_times["quest"] / long_times["standard"]
    result["long_time_ms"] = {v: 1e3 * t for v, t in long_times.items()}
    memory = {"standard": _memory_in_child(long, "standard", False, args.device),
              "quest": _memory_in_child(long, "quest", False, args.device)}
    if not args.no_naive:
        memory["quest (naive explicit softmax)"] = _memory_in_child(long, "quest", True, args.device)
    result["peak_memory_mb"] = memory

    print(f"forward+backward on {args.device} ({result['threads']} threads), float32, shape {list(shape)}, "
          f"median of {args.repeats}")
    print(f"{'variant':18s} {'ms':>9s} {'× standard':>11s}")
    for v in VARIANTS:
        print(f"{v:18s} {result['time_ms'][v]:9.1f} {result['ratio'][v]:11.3f}")
    print(f"\nlong sequence {list(long)}: quest {result['long_ratio_quest']:.3f}× standard "
          f"({long_times['standard']:.2f} s vs {long_times['quest']:.2f} s)")
    print("peak memory above inputs, one forward+backward:")
    for name, mb in memory.items():
        print(f"  {name:32s} {mb:10.1f} MB  ({mb / memory['standard']:.2f}× standard)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
