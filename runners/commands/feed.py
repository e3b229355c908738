"""`quest feed domain=<d> preset=<p> [key=value ...]`: will the data keep the accelerator busy?

Measures, for one domain and preset, the samples per second of the data pipeline alone (the training
loader with its configured workers, batches collated and discarded) and of the model's training step on
the chosen device (forward, backward and an optimiser step on batches already in memory), and prints both
with their ratio. A ratio below 1 means the device would wait for data: raise ``data.num_workers``, or
move per-sample work onto the device.
"""
from __future__ import annotations

import itertools
import time

import torch
from pytorch_lightning.utilities import move_data_to_device

from common.arguments import CommandParser, positive_int
from common.registry import get_domain
from common.timing import sync
from runners import console
from runners.config import compose


def data_rate(datamodule, task, batches: int) -> float:
    """Samples/s of the training loader alone, after one batch to start its workers."""
    loader = iter(datamodule.train_dataloader())
    next(loader)
    start = time.perf_counter()
    count = sum(len(task.unpack(batch)[1]) for batch in itertools.islice(loader, batches))
    return count / (time.perf_counter() - start)


def step_rate(cfg, datamodule, task, batches: int, device: torch.device) -> float:
    """Samples/s of training steps (``runners.runs.stepbench.bare_step``, with the datamodule's augmentation on
    the device) over batches held in memory on ``device``, one warm-up step first."""
    from runners.runs.stepbench import bare_step

    held = [move_data_to_device(b, device) for b in itertools.islice(iter(datamodule.train_dataloader()), batches + 1)]
    step = bare_step(cfg, task.to(device), getattr(datamodule, "augment_batch", lambda batch: batch))
    step(held[0])
    sync(device)
    start = time.perf_counter()
    for batch in held[1:]:
        step(batch)
    sync(device)
    return sum(len(task.unpack(b)[1]) for b in held[1:]) / (time.perf_counter() - start)


def main(argv: list[str]) -> int:
    parser = CommandParser("quest feed", __doc__)
    parser.add_argument("overrides", nargs="+", help="domain=<name> preset=<p> key=value ...")
    parser.add_argument("--batches", type=positive_int, default=20, help="batches timed for each side")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_intermixed_args(argv)
    cfg = compose(args.overrides)
    console.quiet()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    datamodule, task = get_domain(cfg.domain).build(cfg)
    datamodule.setup("fit")
    data = data_rate(datamodule, task, args.batches)
    model = step_rate(cfg, datamodule, task, args.batches, torch.device(args.device))
    workers = getattr(datamodule, "num_workers", "?")
    print(f"{cfg.domain} ({cfg.preset}): data pipeline {data:,.0f} samples/s (num_workers={workers}); "
          f"training step on {args.device} {model:,.0f} samples/s; data / step = {data / model:.2f}")
    return 0
