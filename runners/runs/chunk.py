"""The runs of one group trained together (``Chunk``), for the ensemble trainer (``runners.runs.ensemble``).

Their parameters are stacked (``torch.func.stack_module_state``), and one step vectorised over them
(``torch.func.vmap`` of ``grad``) computes every run's gradients, each on its own data in its own order; the
optimiser is ``runners.runs.stacked_adamw``'s. What Lightning does around the step is replayed per run:
validation every ``check_val_every_n_epoch`` epochs and at the step a run diverges, the attention probes
every ``probes.every_n_steps`` steps, the divergence rules and the best checkpoint of ``common.rules``, and the
test on the parameters of the best validation epoch. Each ``Member`` keeps the rows its run logs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from common.probes import attention_probes, probe_log, raise_peaks, summarize
from common.registry import get_domain
from common.rules import LossWatch, improves, logit_breach
from common.schema import RunConfig
from common.task import lr_schedule
from runners.runs.stacked_adamw import StackedAdamW, clip_grad_norms_
from runners.runs.stacked_data import StackedData

EVAL_MEMBERS = 32  # members evaluated in one vmapped pass


@dataclass
class Member:
    """One run of a chunk: its config, what its domain built, and what it logged."""

    cfg: RunConfig
    task: nn.Module | None = None
    datamodule: object = None
    rows: list[dict] = field(default_factory=list)  # metrics.csv, as Lightning's CSVLogger writes it
    probes: dict[str, float] = field(default_factory=dict)  # the latest probe summary
    peak: dict[str, float] = field(default_factory=dict)  # each maximum's peak over the probe steps (raise_peaks)
    divergence: dict | None = None
    watch: LossWatch | None = None  # the training loss and its bounds (common.rules)
    best: float | None = None  # best validation value so far (the checkpoint kept: common.rules.improves)
    metrics: dict[str, float] = field(default_factory=dict)  # test scores at the best checkpoint

    def diverge(self, step: int, reason: str) -> None:
        if self.divergence is None:  # the first reason stands, as Task.mark_diverged has it
            self.divergence = {"step": step, "reason": reason}


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


class Chunk:
    """Runs of one group trained together: ``fit`` trains and validates them, ``test`` tests each at its best
    validation epoch."""

    def __init__(self, members: list[Member]):
        self.members = members
        self.cfg = members[0].cfg
        self.template = members[0].task
        params, buffers = stack_module_state([m.task for m in members])
        self.params = {name: p.detach() for name, p in params.items()}
        self.buffers = buffers
        self.decayed = self.template.decayed()
        self.clip_order = [n for n in self.params if n in self.decayed] + [n for n in self.params if n not in self.decayed]
        self.metric, self.mode = get_domain(self.cfg.domain).primary_of(self.template)
        self.data = StackedData(members)
        train, evaluate = _Bound(self.template, _train_loss), _Bound(self.template, _outputs)

        def member_step(params, buffers, batch):
            return grad(lambda p: functional_call(train, (_prefixed(p), _prefixed(buffers)), (batch,)),
                        has_aux=True)(params)

        def member_outputs(params, buffers, batch):
            return functional_call(evaluate, (_prefixed(params), _prefixed(buffers)), (batch,))

        self.train_step = vmap(member_step)
        self.forward = vmap(member_outputs)

    def _select(self, tensors: dict[str, Tensor], which: Tensor) -> dict[str, Tensor]:
        return {name: t[which] for name, t in tensors.items()}

    # training
    def fit(self) -> None:
        trainer, optim = self.cfg.trainer, self.template.optim
        schedule = lr_schedule(optim, max(1, self.data.steps_per_epoch * trainer.max_epochs))
        self.optimizer = StackedAdamW(self.params, self.decayed, [m.task.optim.lr for m in self.members],
                                      [m.task.optim.weight_decay for m in self.members], optim.betas)
        self.best_params = {name: p.clone() for name, p in self.params.items()}
        self.active = torch.ones(len(self.members), dtype=torch.bool)
        step = 0
        for epoch in range(trainer.max_epochs):
            for index in self.data.epoch():
                self._train_batch(index, step, epoch, schedule(step))
                step += 1
                if not self.active.any():
                    return
            if (epoch + 1) % trainer.check_val_every_n_epoch == 0:
                self._validate(self.active.nonzero()[:, 0], epoch, step)

    def _train_batch(self, index: Tensor, step: int, epoch: int, factor: float) -> None:
        which = self.active.nonzero()[:, 0]
        batch = self.data.batch("train", index, torch.arange(len(self.members)))
        every = self.cfg.probes.every_n_steps
        max_logits = self._probe(batch, which, step) if every > 0 and step % every == 0 else {}
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

    @torch.no_grad()
    def _probe(self, batch: tuple[Tensor, ...], which: Tensor, step: int) -> dict[int, float]:
        """``common.callbacks.ProbeCallback``'s probes, on each member's own forward pass of its batch (the
        probes keep Python state, which vmap cannot carry). Returns each member's max logit."""
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
            raise_peaks(member.peak, member.probes)
            member.rows.append({**probe_log(per_layer, member.probes), "step": step + 1})
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
            for batch_index in self.data.eval_batches[split]:
                index = torch.as_tensor(batch_index).expand(len(part), -1)
                outputs, targets = self.forward(sub_params, sub_buffers, self.data.batch(split, index, part))
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
