"""The ensemble trainer of ``quest ensemble``: the runs of a sweep that share a model, trained together
(``docs/guides/ensemble.md``).

A run of a tiny model spends most of its time on process start-up, Lightning and checkpoints, not on its
arithmetic. Here each run is built by its domain exactly as ``quest train`` builds it (same seeding) and the
runs are trained together in a ``runners.runs.chunk.Chunk``; each record is filled and written by
``runners.runs.recording``, as ``quest train``'s is, with the CSV log of ``runners.runs.trackers``. Each run gets
the ``record.json``, ``config.yaml`` and ``metrics.csv`` of ``quest train``, in the same run directory (no
checkpoints), so ``quest aggregate``, ``quest sweep`` and reruns treat both alike.

Identity. vmap runs each operation on the stacked runs with the kernel a single run uses (a fused SDPA
kernel, which has no batching rule, once per run: slow; the retrieval model asks for SDPA's math kernel,
which batches), so on CPU a run's record equals that of ``quest train`` with its config and as many torch
threads; ``tests/test_ensemble.py`` checks this for a few seeds. Only the training loss a run logs may
differ in the last bit (vmap reduces a batched loss in another order); its gradients do not. What a domain
needs: in-memory ``TensorDataset`` splits; a train loader whose sampler draws the order from a generator of
its own (``RandomSampler(dataset, generator=...)``), not from the global one (otherwise each run still gets
a fresh shuffle, but not the one ``quest train`` draws); a task that runs under ``vmap`` (no Python branch
on tensor values in ``unpack``, ``forward`` and ``loss``); and, optionally, ``task.train_stats(batch)``:
statistics of each training batch that the task's own ``step`` logs too (``domains/retrieval`` logs the
answer token's key norms that way).

Groups of runs that may train together, and the settings the replay does not cover (refused before anything
runs: exit 2), are ``runners.runs.replayable``'s; a sweep trains a group in chunks (``runners.sweeps.ensemble``).
"""
from __future__ import annotations

import time
import traceback

import pytorch_lightning as pl

from common.errors import error_line
from common.probes import with_peaks
from common.records import RunRecord
from common.registry import get_domain
from common.rules import LossWatch
from common.schema import RunConfig
from runners import console
from runners.config import as_dict
from runners.runs.chunk import Chunk, Member
from runners.runs.recording import fresh_run_directory, new_record, read_log, save_record, settle, write_text
from runners.runs.replayable import check_replayable
from runners.runs.trackers import csv_log
from runners.runs.training import build_run, check_settings, torch_threads


def train_ensemble(cfgs: list[RunConfig]) -> list[RunRecord]:
    """Train the runs of ``cfgs`` (of one group, each held under its lock by the caller) together and write
    their run directories; returns their records, in order. Wrong input raises ``ConfigError`` or
    ``DataError`` before any run directory is made; a chunk that fails while training is a failed record per
    run. The record's ``wall_time_s`` is the chunk's wall time shared out over its runs."""
    with torch_threads(cfgs[0].threads):
        chunk, template = _prepare([Member(cfg) for cfg in cfgs])
        start = time.perf_counter()
        try:
            chunk.fit()
            chunk.test()
        except Exception as err:  # a failed chunk is a failed record per run, and the sweep goes on
            return [_write_failed(member, template, err) for member in chunk.members]
        wall = time.perf_counter() - start
        return [_write_run(member, template, len(cfgs), wall) for member in chunk.members]


def _prepare(members: list[Member]) -> tuple[Chunk, RunRecord]:
    """The chunk, built and checked as ``quest train`` checks a run before its directory exists, and the
    record its runs start from."""
    console.quiet()  # after Lightning's import, which sets its own log level
    cfg = members[0].cfg
    batch = check_settings(cfg)
    check_replayable(cfg)
    domain = get_domain(cfg.domain)
    for member in members:  # built as ``runners.runs.training.run`` builds them (same seeding)
        pl.seed_everything(member.cfg.seed, workers=True, verbose=False)
        member.datamodule, member.task = build_run(domain, member.cfg)
        member.watch = LossWatch(**dict(member.cfg.divergence))
    chunk, template = Chunk(members), new_record(cfg, domain, batch)
    template.primary_metric, template.mode = chunk.metric, chunk.mode
    return chunk, template


def _member_record(member: Member, template: RunRecord) -> RunRecord:
    record = template.model_copy(deep=True)
    record.seed, record.config = int(member.cfg.seed), as_dict(member.cfg)
    return record


def _write_run(member: Member, template: RunRecord, chunk_size: int, wall_s: float) -> RunRecord:
    """The member's run directory as ``quest train`` leaves it (config.yaml, metrics.csv, record.json;
    no checkpoints); returns the record."""
    build_dir = fresh_run_directory(member.cfg)
    log = csv_log(build_dir)
    for row in member.rows:
        log.log_metrics({k: v for k, v in row.items() if k != "step"}, step=row.get("step"))
    log.save()
    record = _member_record(member, template)
    record.params = sum(p.numel() for p in member.task.parameters())
    record.probes = with_peaks(member.probes, member.peak)
    record.wall_time_s = round(wall_s / chunk_size, 3)
    record.hardware.update(world_size=1, ensemble_members=chunk_size)
    read_log(record, build_dir / "metrics.csv", member.watch.losses)
    settle(record, member.task, member.divergence, member.metrics)
    save_record(build_dir, record)
    return record


def _write_failed(member: Member, template: RunRecord, err: Exception) -> RunRecord:
    build_dir = fresh_run_directory(member.cfg)
    record = _member_record(member, template)
    record.fail(error_line(err))
    write_text(build_dir / "error.log", traceback.format_exc())
    save_record(build_dir, record)
    return record
