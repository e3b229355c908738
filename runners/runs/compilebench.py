"""A domain's training step on CPU, eager and compiled (``quest bench --model ... --compile``): per variant, the bare step
(``runners.runs.stepbench.bare_step``) of an eager task beside the same task with ``Task.compile_training``, both
built from the run's seed and trained on the same batches, interleaved in rounds in one process.

What is reported per variant: the median step of each, after warm-up; the compile time, i.e. the first pass over
the batches less a warm pass, cold (inductor's cache on disk empty: the first run of a shape on a machine) and warm
(the cache filled, dynamo's in-memory state reset: any later run, which traces again and finds inductor's code on
disk); the peak resident memory of a pass above what the process held before it, in a child process whose allocator
returns freed pages at once (``_memory_in_child``); and the whole run's training-step time eager over compiled at
the config's own step count, with the warm compile time paid once (``run_speedup``).
Evaluation is eager in both (``compile_training`` compiles training steps only), so it is left out of that ratio.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from common.benchmark import peak_resident_mb
from common.timing import interleaved_seconds
from runners import console
from runners.config import compose
from runners.runs.stepbench import bare_loop, build, train_batches
from runners.runs.training import torch_threads

COMPILED = "+compiled"  # a compiled job's name: the variant's and this


def measure_compiled(args: list[str], variants: list[str], steps: int, rounds: int, mode: str = "default") -> dict:
    """Eager and compiled bare steps of every variant of the run ``args`` describe (see the module's docstring),
    at the run's ``threads``."""
    console.quiet()
    with (torch_threads(compose(args).threads), tempfile.TemporaryDirectory(prefix="quest-inductor-") as cache,
          torch._dynamo.config.patch(recompile_limit=8 * len(variants))):  # each variant's task: a fresh guard on one code
        before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # cold: nothing an earlier process compiled
        try:
            return _measure(args, variants, steps, rounds, mode)
        finally:
            torch._dynamo.reset()
            if before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def _measure(args: list[str], variants: list[str], steps: int, rounds: int, mode: str) -> dict:
    # (cfg, datamodule, eager task), compiled task: built from the same seed, the same weights
    built = {variant: (build(args, variant), build(args, variant)[2]) for variant in variants}
    (cfg, datamodule, _), _ = built[variants[0]]
    batches, planned = train_batches(datamodule, steps), planned_steps(cfg, datamodule)
    jobs, first_pass = {}, {}
    for variant, ((cfg, _, eager), compiled) in built.items():
        compiled.compile_training(mode=mode)
        jobs[variant] = bare_loop(cfg, eager, batches)
        jobs[variant + COMPILED] = job = bare_loop(cfg, compiled, batches)
        cold = _seconds(job)
        torch._dynamo.reset()  # as a later run finds it: dynamo traces again, inductor's code is on disk
        first_pass[variant] = (cold, _seconds(job))
    seconds = interleaved_seconds(jobs, rounds, "cpu")
    memory = _memory_in_child(args, variants, steps, mode)
    results = {}
    for variant in variants:
        eager_s, compiled_s = seconds[variant], seconds[variant + COMPILED]
        cold, warm = (max(0.0, first - compiled_s) for first in first_pass[variant])
        per_step = (eager_s / steps, compiled_s / steps)
        results[variant] = {
            "eager_steps_per_s": 1 / per_step[0], "compiled_steps_per_s": 1 / per_step[1],
            "speedup": eager_s / compiled_s, "compile_cold_s": cold, "compile_warm_s": warm,
            "peak_mb_eager": memory[variant], "peak_mb_compiled": memory[variant + COMPILED],
            "run_speedup": planned * per_step[0] / (planned * per_step[1] + warm)}
    return {"config": args, "mode": mode, "steps": steps, "rounds": rounds, "threads": torch.get_num_threads(),
            "run_steps": planned, "variants": results}


def planned_steps(cfg, datamodule) -> int:
    """The optimiser steps a run of ``cfg`` takes: ``trainer.max_steps``, else its epochs of the training loader
    (as far as ``limit_train_batches`` lets it, over ``accumulate_grad_batches``)."""
    trainer = cfg.trainer
    if trainer.max_steps > 0:
        return int(trainer.max_steps)
    batches, limit = len(datamodule.train_dataloader()), trainer.limit_train_batches
    per_epoch = min(batches, limit) if isinstance(limit, int) and limit > 1 else math.ceil(batches * limit)
    return trainer.max_epochs * math.ceil(per_epoch / trainer.accumulate_grad_batches)


def _seconds(job: Callable[[], None]) -> float:
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


def _memory_in_child(args: list[str], variants: list[str], steps: int, mode: str) -> dict[str, float]:
    """``peak_memory`` in a fresh interpreter whose allocator returns every block of a page or more to the system when
    it is freed (glibc's ``MALLOC_MMAP_THRESHOLD_``), so that its resident memory follows the tensors alive; it reads
    the compiled code from this process's inductor cache. NaN per job if it fails."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4096"}
    done = subprocess.run([sys.executable, "-m", __name__, json.dumps([args, variants, steps, mode])], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        return {name: math.nan for variant in variants for name in (variant, variant + COMPILED)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_memory(args: list[str], variants: list[str], steps: int, mode: str) -> dict[str, float]:
    """Per eager and compiled job, the peak resident memory (MB) of one pass over ``steps`` batches above what the
    process held just before it, after a first pass (compiling, and creating the optimiser's state)."""
    console.quiet()
    torch._dynamo.config.recompile_limit = 8 * len(variants)
    peaks = {}
    for variant in variants:
        (cfg, datamodule, eager), (*_, compiled) = build(args, variant), build(args, variant)
        compiled.compile_training(mode=mode)
        batches = train_batches(datamodule, steps)
        for name, task in ((variant, eager), (variant + COMPILED, compiled)):
            job = bare_loop(cfg, task, batches)
            job()
            peaks[name] = peak_resident_mb(job)
    return peaks


if __name__ == "__main__":  # _memory_in_child's child
    print(json.dumps(peak_memory(*json.loads(sys.argv[1]))))
