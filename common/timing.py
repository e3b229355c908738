"""Side-by-side timing for the benchmarks (`quest bench`, `quest <domain>-bench`): speed claims are
ratios of jobs timed in one process, interleaved, so that drift and load from other processes fall on all.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work, so that a timer reads the work and not its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved_seconds(jobs: dict[str, Callable[[], object]], rounds: int, device: torch.device | str,
                        warmup: int = 1) -> dict[str, float]:
    """Median seconds of each job over ``rounds`` rounds that run every job once, each round starting at the
    next job so that no position in a round favours any of them; ``warmup`` rounds first are not counted."""
    names = list(jobs)
    seen = {name: [] for name in names}
    for r in range(warmup + rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sync(device)
            start = time.perf_counter()
            jobs[name]()
            sync(device)
            if r >= warmup:
                seen[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seen.items()}


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")


def device_from(args: argparse.Namespace) -> torch.device:
    """The device ``add_device_arguments`` asked for (auto: the GPU if there is one), with its thread setting."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
