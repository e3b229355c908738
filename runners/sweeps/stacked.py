"""The ensemble trainer of ``quest ensemble``: the runs of a sweep that share a model, trained together.

A run of a tiny model spends most of its time on process start-up, Lightning and checkpoints, not on its
arithmetic. Here each run is built by its domain exactly as ``quest train`` builds it (same seeding), the
runs' parameters are stacked (``torch.func.stack_module_state``), and one step vectorised over them
(``torch.func.vmap`` of ``grad``) computes every run's gradients, each on its own data in its own order.
The step is all it restates: AdamW and gradient-norm clipping vectorised over the runs (``StackedAdamW``,
``clip_grad_norms_``: torch's arithmetic, each run with its own learning rate and weight decay, the
task's decay groups and ``common.task.lr_schedule``); divergence and the best checkpoint follow
``common.rules``, as the Lightning callbacks do, and the run directory is written by ``runners.runs.record``
with Lightning's ``CSVLogger``. The rest of a Lightning run
is replayed per run: validation every ``check_val_every_n_epoch`` epochs and at the step a run diverges (as
Lightning does), the attention probes every ``probes.every_n_steps`` steps, and the test on the parameters of
the best validation epoch. Each run gets the ``record.json``, ``config.yaml`` and ``metrics.csv`` of
``quest train``, in the same run directory (no checkpoints), so ``quest aggregate``, ``quest sweep`` and
reruns treat both alike.

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

Groups and chunks. Runs whose configs differ only in ``PER_MEMBER`` (seed, learning rate, weight decay)
form a group, trained in chunks. Settings the replay does not cover (another optimiser, ``max_steps``,
fractional ``limit_*_batches``, another precision or device, several devices, test-time perturbations) are
refused before anything runs (``check_replayable``: exit 2); ``quest sweep`` runs those.
"""
from __future__ import annotations

import copy
import itertools
import logging
import math
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from common.errors import ConfigError, DataError, error_line
from common.registry import get_domain
from common.rules import LossWatch, improves, logit_breach
from runners.config import compose, config_hash, run_directory
from runners.runs.rundir import claimed
from runners.sweeps.bookkeeping import note_outcome, run_outcome, settled
from runners.sweeps.progress import Progress

log = logging.getLogger(__name__)

PER_MEMBER = ("seed", "optim.lr", "optim.weight_decay")
EVAL_MEMBERS = 32  # members evaluated in one vmapped pass


# --- what a chunk is made of ----------------------------------------------------------------------
@dataclass
class Member:
    """One run of a chunk: its config and place in the sweep, what its domain built, and what it logged."""

    index: int
    cfg: DictConfig
    run_dir: Path
    task: nn.Module | None = None
    datamodule: object = None
    rows: list[dict] = field(default_factory=list)  # metrics.csv, as Lightning's CSVLogger writes it
    probes: dict[str, float] = field(default_factory=dict)  # the latest probe summary
    divergence: dict | None = None
    watch: LossWatch | None = None  # the training loss and its bounds (common.rules)
    best: float | None = None  # best validation value so far (the checkpoint kept: common.rules.improves)
    metrics: dict[str, float] = field(default_factory=dict)  # test scores at the best checkpoint

    def diverge(self, step: int, reason: str) -> None:
        if self.divergence is None:  # the first reason stands, as Task.mark_diverged has it
            self.divergence = {"step": step, "reason": reason}


def group_key(cfg: DictConfig) -> str:
    """Equal for runs that may train together: configs equal but for ``PER_MEMBER``."""
    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for key in PER_MEMBER:
        OmegaConf.update(plain, key, 0)
    return config_hash(plain)


def check_replayable(cfg: DictConfig) -> None:
    """A ``ConfigError`` naming the settings of ``cfg`` that the ensemble trainer does not replay."""
    trainer, problems = cfg.trainer, []
    if cfg.optim.name != "adamw":
        problems.append(f"optim.name={cfg.optim.name}")
    if trainer.max_steps not in (-1, None):
        problems.append(f"trainer.max_steps={trainer.max_steps}")
    problems += [f"trainer.{k}={trainer[k]}" for k in ("limit_train_batches", "limit_val_batches", "limit_test_batches")
                 if trainer[k] != 1.0]
    if str(trainer.precision) not in ("32-true", "32"):
        problems.append(f"trainer.precision={trainer.precision}")
    if trainer.accelerator != "cpu" or trainer.devices != 1 or trainer.num_nodes != 1:
        problems.append("a device other than one CPU")
    if cfg.task.get("perturbations"):
        problems.append("task.perturbations")
    if problems:
        raise ConfigError(f"the ensemble trainer does not replay {', '.join(problems)}; run it with quest sweep")


# --- the stacked optimiser -----------------------------------------------------------------------------
def _per_member(values: list[float], like: Tensor) -> Tensor:
    """float32 [E, 1, ...] of per-member Python floats, rounded as torch rounds a Python scalar argument."""
    return torch.tensor(values, dtype=like.dtype).view(-1, *([1] * (like.dim() - 1)))


class StackedAdamW:
    """``torch.optim.AdamW`` as it runs on CPU (its single-tensor update, amsgrad off), on parameters
    stacked over members, each with its own base learning rate and weight decay: the vectorised step's
    optimiser. One torch optimiser per member over its slices would give the same bits but cost three times
    the chunk's training (a Python call per member and step). The operations, their order and their scalars
    are torch's, so a member's slice gets what its own AdamW would give (``tests/test_ensemble.py`` checks
    it to the bit); the groups are ``common.task.build_optimizer``'s (weight decay on the parameters
    ``Task.decayed`` names)."""

    def __init__(self, params: dict[str, Tensor], decayed: set[str], lrs: list[float], weight_decays: list[float],
                 betas: tuple[float, float], eps: float = 1e-8):
        self.lrs, self.weight_decays = lrs, weight_decays
        self.beta1, self.beta2 = betas
        self.eps, self.steps = eps, 0
        self.decay = decayed
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], factor: float) -> None:
        """One update with every member's learning rate at ``factor`` × its base (the LambdaLR schedule)."""
        self.steps += 1
        lrs = [lr * factor for lr in self.lrs]
        bias_correction1 = 1 - self.beta1**self.steps
        bias_correction2_sqrt = (1 - self.beta2**self.steps) ** 0.5
        for name, param in params.items():
            grad = grads[name]
            if name in self.decay:
                param.mul_(_per_member([1 - lr * wd for lr, wd in zip(lrs, self.weight_decays)], param))
            self.exp_avg[name].lerp_(grad, 1 - self.beta1)
            self.exp_avg_sq[name].mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (self.exp_avg_sq[name].sqrt() / bias_correction2_sqrt).add_(self.eps)
            # addcdiv_(exp_avg, denom, value=-step_size) computes self + (value * exp_avg) / denom
            step_size = _per_member([-lr / bias_correction1 for lr in lrs], param)
            param.add_(step_size * self.exp_avg[name] / denom)


@torch.no_grad()
def clip_grad_norms_(grads: dict[str, Tensor], order: list[str], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_``, which Lightning applies, per member of the stack: the norm of each
    parameter's gradient, their norm in ``order`` (the optimiser's: decayed parameters first), and the same
    clipping coefficient (checked to the bit against torch's)."""
    norms = torch.stack([torch.linalg.vector_norm(grads[name].flatten(1), dim=1) for name in order], dim=1)
    coef = torch.clamp(max_norm / (torch.linalg.vector_norm(norms, dim=1) + 1e-6), max=1.0)
    for grad in grads.values():
        grad.mul_(coef.view(-1, *([1] * (grad.dim() - 1))))


# --- calling a task under torch.func --------------------------------------------------------------------
class _Bound(nn.Module):
    """``fn(task, *args)`` as a forward: ``torch.func.functional_call`` only calls forward, and this lets it
    swap in a member's parameters for everything ``fn`` does with the task."""

    def __init__(self, task: nn.Module, fn):
        super().__init__()
        self.task, self.fn = task, fn

    def forward(self, *args):
        return self.fn(self.task, *args)


def _train_loss(task, batch):
    inputs, target = task.unpack(batch)
    loss = task.loss(task(inputs), target, "train")
    stats = task.train_stats(batch) if hasattr(task, "train_stats") else {}
    return loss, (loss.detach(), stats)


def _outputs(task, batch):
    inputs, target = task.unpack(batch)
    return task(inputs), target


def _prefixed(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"task.{name}": t for name, t in tensors.items()}


# --- one chunk --------------------------------------------------------------------------------------
class Chunk:
    """Runs of one group trained together: ``fit`` trains and validates them, ``test`` tests each at its best
    validation epoch; each ``Member`` keeps what its run logged, for ``_write_run``."""

    def __init__(self, members: list[Member]):
        from torch.func import stack_module_state

        self.members = members
        self.cfg = members[0].cfg
        self.template = members[0].task
        params, buffers = stack_module_state([m.task for m in members])
        self.params = {name: p.detach() for name, p in params.items()}
        self.buffers = buffers
        self.decayed = self.template.decayed()
        self.clip_order = [n for n in self.params if n in self.decayed] + [n for n in self.params if n not in self.decayed]
        self.metric, self.mode = get_domain(self.cfg.domain).primary_of(self.template)
        self._data()
        self._functions()

    # setting up
    def _data(self) -> None:
        """Each seed's splits stacked once ([seeds, samples, ...]) and its train loader; members index them."""
        seeds = list(dict.fromkeys(m.cfg.seed for m in self.members))
        self.slot = torch.tensor([seeds.index(m.cfg.seed) for m in self.members])
        first = {seed: next(m for m in self.members if m.cfg.seed == seed) for seed in seeds}
        modules = [first[seed].datamodule for seed in seeds]
        for module in modules:
            module.setup("fit")
        self.data = {split: _stack_split(modules, split) for split in ("train", "val", "test")}
        self.train_loaders = [module.train_dataloader() for module in modules]
        if any(getattr(loader.sampler, "generator", False) is None for loader in self.train_loaders):
            log.warning("ensemble: the train loader draws its order from the global generator; runs will not "
                        "see the order quest train gives them")
        self.eval_batches = {split: list(getattr(modules[0], f"{split}_dataloader")().batch_sampler)
                             for split in ("val", "test")}

    def _functions(self) -> None:
        from torch.func import functional_call, grad, vmap

        train, evaluate = _Bound(self.template, _train_loss), _Bound(self.template, _outputs)

        def member_step(params, buffers, batch):
            return grad(lambda p: functional_call(train, (_prefixed(p), _prefixed(buffers)), (batch,)),
                        has_aux=True)(params)

        def member_outputs(params, buffers, batch):
            return functional_call(evaluate, (_prefixed(params), _prefixed(buffers)), (batch,))

        self.train_step = vmap(member_step)
        self.forward = vmap(member_outputs)

    def _batch(self, split: str, index: Tensor, which: Tensor) -> tuple[Tensor, ...]:
        """The samples ``index`` [members, batch] of ``split`` for the members ``which``."""
        slot = self.slot[which][:, None]
        return tuple(t[slot, index] for t in self.data[split])

    def _select(self, tensors: dict[str, Tensor], which: Tensor) -> dict[str, Tensor]:
        return {name: t[which] for name, t in tensors.items()}

    # training
    def fit(self) -> None:
        from common.task import lr_schedule

        trainer, optim = self.cfg.trainer, self.template.optim
        steps_per_epoch = len(self.train_loaders[0])
        schedule = lr_schedule(optim, max(1, steps_per_epoch * trainer.max_epochs))
        self.optimizer = StackedAdamW(self.params, self.decayed, [m.task.optim.lr for m in self.members],
                                      [m.task.optim.weight_decay for m in self.members], optim.betas)
        self.best_params = {name: p.clone() for name, p in self.params.items()}
        self.active = torch.ones(len(self.members), dtype=torch.bool)
        step = 0
        for epoch in range(trainer.max_epochs):
            orders = [_epoch_order(loader) for loader in self.train_loaders]
            for batch_idx in range(steps_per_epoch):
                index = torch.stack([torch.as_tensor(order[batch_idx]) for order in orders])[self.slot]
                self._train_batch(index, step, epoch, schedule(step))
                step += 1
                if not self.active.any():
                    return
            if (epoch + 1) % trainer.check_val_every_n_epoch == 0:
                self._validate(self.active.nonzero()[:, 0], epoch, step)

    def _train_batch(self, index: Tensor, step: int, epoch: int, factor: float) -> None:
        which = self.active.nonzero()[:, 0]
        batch = self._batch("train", index, torch.arange(len(self.members)))
        max_logits = self._probe(batch, which, step) if self._probe_step(step) else {}
        grads, (losses, stats) = self.train_step(self.params, self.buffers, batch)
        finite = torch.isfinite(losses)
        for e in which[~finite[which]].tolist():
            self.members[e].diverge(step, "non-finite training loss")  # Lightning skips that step's update
        still = ~self.active | ~finite  # finished members, and members whose step is skipped
        kept = {name: p[still].clone() for name, p in self.params.items()} if still.any() else None
        if self.cfg.trainer.gradient_clip_val:
            clip_grad_norms_(grads, self.clip_order, self.cfg.trainer.gradient_clip_val)
        self.optimizer.step(self.params, grads, factor)
        if kept is not None:
            for name, param in self.params.items():
                param[still] = kept[name]
        self._after_step(which, losses, stats, max_logits, step, epoch)

    def _probe_step(self, step: int) -> bool:
        every = self.cfg.probes.every_n_steps
        return every > 0 and step % every == 0

    @torch.no_grad()
    def _probe(self, batch: tuple[Tensor, ...], which: Tensor, step: int) -> dict[int, float]:
        """``common.callbacks.ProbeCallback``'s probes, on each member's own forward pass of its batch (the
        probes keep Python state, which vmap cannot carry). Returns each member's max logit."""
        from torch.func import functional_call

        from common.probes import attention_probes, summarize

        found = attention_probes(self.template)
        max_logits = {}
        for e in which.tolist():
            for probe in found.values():
                probe.enabled, probe.max_samples, probe.stats = True, self.cfg.probes.max_samples, {}
            inputs, _ = self.template.unpack(tuple(t[e] for t in batch))
            functional_call(self.template, (self._select(self.params, e), self._select(self.buffers, e)), (inputs,))
            per_layer = {name: p.stats for name, p in found.items() if p.stats}
            member = self.members[e]
            member.probes = summarize(per_layer)
            member.rows.append({**{f"probe/{name}/{stat}": float(v) for name, stats in per_layer.items()
                                   for stat, v in stats.items()},
                                **{f"probe/{stat}": v for stat, v in member.probes.items()}, "step": step + 1})
            max_logits[e] = member.probes["max_logit"]
        for probe in found.values():
            probe.enabled = False
        return max_logits

    def _after_step(self, which: Tensor, losses: Tensor, stats: dict[str, Tensor], max_logits: dict[int, float],
                    step: int, epoch: int) -> None:
        """What Lightning does at the end of a training batch: the probe's and the loss's divergence checks
        (in the order of the runner's callbacks), the step's logs, and a validation for runs that stop."""
        every = self.cfg.trainer.log_every_n_steps
        for e in which.tolist():
            member, loss = self.members[e], float(losses[e])
            reason = logit_breach(max_logits[e], self.cfg.probes.max_logit_bound) if e in max_logits else None
            if reason is None and math.isfinite(loss):
                reason = member.watch.breach(loss)
            if reason is not None:
                member.diverge(step + 1, reason)
            if (step + 1) % every == 0:
                logged = {name: float(v[e]) for name, v in stats.items() if torch.isfinite(v[e])}
                member.rows.append({"train/loss": loss, **logged, "epoch": epoch, "step": step})
        stopped = [e for e in which.tolist() if self.members[e].divergence is not None]
        if stopped:
            self.active[stopped] = False
            if (epoch + 1) % self.cfg.trainer.check_val_every_n_epoch == 0:  # Lightning validates a stopping run
                self._validate(torch.tensor(stopped), epoch, step + 1)

    # evaluation
    def _validate(self, which: Tensor, epoch: int, step: int) -> None:
        """Validation of the members ``which``, and the checkpoint each keeps (``common.rules.improves``)."""
        for e, scores in self._evaluate("val", self.params, which).items():
            member = self.members[e]
            member.rows.append({**scores, "epoch": epoch, "step": step})
            value = scores[f"val/{self.metric}"]
            if improves(value, member.best, self.mode):
                member.best = value
                for name, param in self.params.items():
                    self.best_params[name][e] = param[e]

    def test(self) -> None:
        which = torch.tensor([e for e, m in enumerate(self.members) if m.divergence is None], dtype=torch.long)
        if len(which):
            for e, scores in self._evaluate("test", self.best_params, which).items():
                self.members[e].rows.append(scores)
                self.members[e].metrics = scores

    @torch.no_grad()
    def _evaluate(self, split: str, params: dict[str, Tensor], which: Tensor) -> dict[int, dict[str, float]]:
        """``split``'s loss (averaged over batches weighted by their size, as Lightning does) and the task's
        metrics for the members ``which``: vmapped forward passes over a few members at a time (a whole
        chunk's outputs of one evaluation batch need not fit in memory at once), then each member's loss and
        metric updates on its own outputs, as its single run computes them."""
        results = {}
        for part in which.split(EVAL_MEMBERS):
            sub_params, sub_buffers = self._select(params, part), self._select(self.buffers, part)
            sums = {e: [torch.tensor(0.0), torch.tensor(0)] for e in part.tolist()}
            for batch_index in self.eval_batches[split]:
                index = torch.as_tensor(batch_index).expand(len(part), -1)
                outputs, targets = self.forward(sub_params, sub_buffers, self._batch(split, index, part))
                for i, e in enumerate(part.tolist()):
                    self._update(self.members[e].task, split, outputs[i], targets[i], sums[e])
            results.update({e: self._scores(self.members[e].task, split, *sums[e]) for e in sums})
        return results

    @staticmethod
    def _update(task, split: str, output, target, sums: list[Tensor]) -> None:
        loss = task.loss(output, target, split)
        sums[0] = sums[0] + loss * len(target)  # Lightning's mean over batches, in its dtypes
        sums[1] = sums[1] + len(target)
        getattr(task, f"{split}_metrics").update(*task.predictions(output, target))

    @staticmethod
    def _scores(task, split: str, loss_sum: Tensor, count: Tensor) -> dict[str, float]:
        metrics = getattr(task, f"{split}_metrics")
        scores = {name: float(value) for name, value in metrics.compute().items()}
        metrics.reset()
        return {f"{split}/loss": float(loss_sum / count), **scores}


def _epoch_order(loader) -> list[list[int]]:
    """The index batches of the loader's next epoch. Lightning takes ``len(loader)`` batches and never asks
    for more, so a sampler that would draw again on being asked (torch's RandomSampler draws a last, empty
    permutation) does not; taking exactly as many keeps its generator where Lightning leaves it."""
    return list(itertools.islice(iter(loader.batch_sampler), len(loader)))


def _stack_split(modules: list, split: str) -> tuple[Tensor, ...]:
    """A split's tensors of every datamodule, stacked: [datamodules, samples, ...]."""
    from torch.utils.data import TensorDataset

    datasets = [module.datasets[split] for module in modules]
    if not all(isinstance(d, TensorDataset) for d in datasets):
        raise ConfigError(f"the ensemble trainer needs in-memory TensorDatasets; the {split} split is "
                          f"{type(datasets[0]).__name__}")
    return tuple(torch.stack(parts) for parts in zip(*(d.tensors for d in datasets)))


# --- records --------------------------------------------------------------------------------------
def _write_run(member: Member, template: dict, chunk_size: int, wall_s: float) -> dict:
    """The member's run directory as ``quest train`` leaves it (config.yaml, metrics.csv, record.json;
    no checkpoints); returns the record."""
    from pytorch_lightning.loggers import CSVLogger

    from runners.runs.record import fresh_run_directory, logged, save_record

    build_dir = fresh_run_directory(member.cfg)
    csv_log = CSVLogger(build_dir, name="", version="")
    for row in member.rows:
        csv_log.log_metrics({k: v for k, v in row.items() if k != "step"}, step=row.get("step"))
    csv_log.save()
    record = copy.deepcopy(template)
    record.update(seed=int(member.cfg.seed), config=OmegaConf.to_container(member.cfg, resolve=True),
                  params=sum(p.numel() for p in member.task.parameters()), probes=member.probes,
                  wall_time_s=round(wall_s / chunk_size, 3),
                  **logged(build_dir / "metrics.csv", f"val/{record['primary_metric']}", record["mode"],
                           member.watch.losses))
    record["hardware"].update(world_size=1, ensemble_members=chunk_size)
    record.update(member.task.metric_notes(record["primary_metric"]))
    if member.divergence is not None:
        record.update(status="diverged", divergence=member.divergence)
    else:
        record["metrics"] = member.metrics
    save_record(build_dir, record)
    return record


def _write_failed(member: Member, template: dict, err: Exception) -> dict:
    from runners.runs.record import fresh_run_directory, save_record, write_text

    build_dir = fresh_run_directory(member.cfg)
    record = copy.deepcopy(template)
    record.update(seed=int(member.cfg.seed), config=OmegaConf.to_container(member.cfg, resolve=True),
                  status="failed", error=error_line(err))
    write_text(build_dir / "error.log", traceback.format_exc())
    save_record(build_dir, record)
    return record


# --- driving a sweep ------------------------------------------------------------------------------
def train_chunk(members: list[Member]) -> list[dict]:
    """Train the members (runs of one group, each held under its lock) together and write their runs;
    returns one sweep outcome per member. Wrong input is an ``invalid`` outcome for the whole chunk."""
    from runners.runs.training import torch_threads

    with torch_threads(members[0].cfg.threads):
        try:
            chunk, template = _prepare(members)
        except (ConfigError, DataError) as err:
            return [run_outcome(m.index, "invalid", error_line(err), m.run_dir) for m in members]
        return _train(chunk, template)


def _prepare(members: list[Member]) -> tuple[Chunk, dict]:
    """The chunk, built and checked as ``quest train`` checks a run before its directory exists, and the
    record template its runs share."""
    from runners import console
    from runners.runs.record import new_record
    from runners.runs.training import check_settings

    console.quiet()  # after Lightning's import, which sets its own log level
    cfg = members[0].cfg
    batch = check_settings(cfg)
    check_replayable(cfg)
    domain = get_domain(cfg.domain)
    for member in members:
        _build(member, domain)
    chunk, template = Chunk(members), new_record(cfg, domain, batch)
    template["primary_metric"], template["mode"] = chunk.metric, chunk.mode
    return chunk, template


def _train(chunk: Chunk, template: dict) -> list[dict]:
    members, start = chunk.members, time.perf_counter()
    try:
        chunk.fit()
        chunk.test()
    except Exception as err:  # a failed chunk is a failed record per run, and the sweep goes on
        wall = (time.perf_counter() - start) / len(members)
        return [run_outcome(m.index, "failed", _write_failed(m, template, err)["error"], m.run_dir, wall)
                for m in members]
    wall = time.perf_counter() - start
    records = [_write_run(m, template, len(members), wall) for m in members]
    return [run_outcome(m.index, r["status"], r["error"], m.run_dir, r["wall_time_s"])
            for m, r in zip(members, records)]


def _build(member: Member, domain) -> None:
    """The member's datamodule and task, built as ``runners.runs.training.run`` builds them (same seeding)."""
    import pytorch_lightning as pl

    from common.registry import build_config
    pl.seed_everything(member.cfg.seed, workers=True, verbose=False)
    try:
        member.datamodule, member.task = domain.build(build_config(member.cfg))
    except ValueError as err:
        raise ConfigError(f"domain {member.cfg.domain!r}: {str(err).strip().splitlines()[0]}") from None
    member.watch = LossWatch(**member.cfg.divergence)


def plan(runs: list[list[str]], progress: Progress, status_of: Callable[[Path], str | None]) -> list[Member]:
    """Compose every run once and tell ``progress`` about the invalid ones and those whose record stays
    (``status_of`` a run directory: its record's status if it stays, None if the run is to be made); returns
    the runs to make."""
    pending = []
    for index, args in enumerate(runs):
        try:
            cfg = compose(args)
        except ConfigError as err:
            progress.add(run_outcome(index, "invalid", error_line(err)))
            continue
        run_dir = run_directory(cfg)
        status = status_of(run_dir)
        if status is None:
            pending.append(Member(index, cfg, run_dir))
        else:
            progress.add(run_outcome(index, status, run_dir=run_dir))
    return pending


def chunks(members: list[Member], size: int) -> list[list[Member]]:
    """Members grouped by ``group_key`` (in sweep order), each group cut into the fewest chunks of at most
    ``size``, of equal sizes (give or take one), so that workers get even shares."""
    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(group_key(member.cfg), []).append(member)
    pieces = []
    for group in groups.values():
        parts = -(-len(group) // size)
        bounds = [len(group) * i // parts for i in range(parts + 1)]
        pieces += [group[a:b] for a, b in zip(bounds, bounds[1:])]
    return pieces


def run_chunks(pieces: list[list[Member]], report: Callable[[dict], None]) -> None:
    """Train each chunk's runs that no other process holds and that are still to be made (``settled``, read
    under their locks), reporting each run as it starts and as it ends."""
    for piece in pieces:
        with ExitStack() as held:
            mine = [m for m in piece if held.enter_context(claimed(m.run_dir)) and settled(m.run_dir) is None]
            for member in mine:  # so the launcher knows them if this process dies
                report(run_outcome(member.index, "running", run_dir=member.run_dir))
            for outcome in train_chunk(mine) if mine else []:
                note_outcome(Path(outcome["run_dir"]), outcome)
                report(outcome)
