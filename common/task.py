"""The LightningModule every domain builds on.

A ``Task`` owns the domain's network (``net``), calls it in ``forward``, logs the loss and its metrics by
stage, builds the optimiser and schedule from config, and records divergence as a result instead of a
crash. A domain's task says only what differs: how a batch splits into inputs and target
(``unpack``), its ``loss``, and, for test-time robustness, how an input is ``perturb``-ed: every test batch is
also evaluated under each of the task's ``perturbations``, its headline metric logged as ``test/<metric>_<condition>``.
"""
from __future__ import annotations

import math
import zlib
from functools import partial

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from timm.optim import Lamb
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from common.data import SPLITS
from common.errors import ConfigError
from common.metrics import MajorityClassAccuracy
from common.schema import Optim

# ``lamb``: timm's Lamb (You et al. 2020), DeiT-III's optimiser: Adam's bias-corrected step plus weight decay,
# rescaled per tensor by the trust ratio ‖w‖ / ‖step‖. Groups without weight decay (biases, norms, LayerScale:
# see ``Task.decayed``) take the plain Adam step (``always_adapt=False``): a trust ratio would freeze a
# LayerScale started at 1e-4. timm's own global gradient-norm clip (1.0 by default) is off: clipping is
# ``trainer.gradient_clip_val``'s. eps 1e-8 is what DeiT-III passes (timm's ``--opt-eps``).
LAMB = partial(Lamb, eps=1e-8, max_grad_norm=None, bias_correction=True, trust_clip=False, always_adapt=False)
OPTIMIZERS = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD, "lamb": LAMB}  # by Optim.name


def perturbation_generator(seed: int, batch_idx: int, condition: str, device: torch.device) -> torch.Generator:
    """The generator of ``condition``'s noise on test batch ``batch_idx`` (on ``device``, the batch's): seeded with the
    CRC-32 of ``"<seed>/<batch_idx>/<condition>"``, so a function of (seed, batch, condition) alone: every variant of
    a seed faces the same perturbed test set, whatever ran before it."""
    key = zlib.crc32(f"{seed}/{batch_idx}/{condition}".encode())
    return torch.Generator(device).manual_seed(key)


class Task(pl.LightningModule):
    """The home of a run's metrics: their names and how they are computed (``metrics``), and what its record notes
    of them beside their values (``directions``, ``baselines``, ``summary_metrics``); a task that logs other test
    metrics adds theirs. The metric a run is judged on is the domain's registered one (known before anything is built, so
    that a run killed before its task exists is still recorded by it); ``primary`` (metric, "min" | "max")
    overrides it for a domain whose tasks differ in kind (graph: regression or classification).

    Args:
        net: The domain's network; ``forward`` calls it on a batch's inputs.
        optim: The run's ``Optim`` section; weight decay applies to the parameters ``decayed()`` names.
        metrics: Name -> torchmetrics metric, the headline first (a dict keeps its order; a ``MetricCollection``
            would sort the names); cloned per stage and logged as ``<stage>/<name>``.
        perturbations: Test-time condition name -> its settings (handed to ``perturb``). None: no perturbed evaluation.
        seed: The run's seed, from which each condition's noise is drawn.
    """

    primary: tuple[str, str] | None = None
    logit_dim: int | None = None  # where ``forward``'s output holds class logits (``optim.z_loss``); None: it has none

    def __init__(self, net: nn.Module, optim: Optim, metrics: dict[str, Metric], *,
                 perturbations: dict | None = None, seed: int = 0):
        super().__init__()
        if optim.z_loss and self.logit_dim is None:
            raise ConfigError(f"optim.z_loss applies to output logits, and {type(self).__name__} has none; set optim.z_loss=0")
        self.net = net
        self.optim = optim
        self.divergence: dict | None = None
        # No compute groups: metrics that filter their inputs differently may share a state layout, and
        # torchmetrics would then merge them for good after the first batch.
        collection = MetricCollection(dict(metrics), compute_groups=False)
        for stage in SPLITS:
            setattr(self, f"{stage}_metrics", collection.clone(prefix=f"{stage}/"))
        self.headline = next(iter(metrics))
        self.perturbations = dict(perturbations or {})
        self.perturbed_metrics = nn.ModuleDict({c: metrics[self.headline].clone() for c in self.perturbations})
        self.perturbed_names: set[str] = set()  # what ``summarize_perturbed`` logged
        self.seed = seed
        self.train_loss: Tensor | None = None  # the last training step's, for ``on_train_batch_end`` to log
        self.logged_steps = 0  # the optimiser steps ``on_train_batch_end`` has seen
        self.compiled_forward = None  # ``compile_training``'s; a plain function, so no second copy in the state dict

    # --- what a domain's task defines -------------------------------------------------------------
    def unpack(self, batch) -> tuple:
        """(inputs, target) of a batch as the data loader gives it; by default the batch itself, taken as that pair."""
        return batch

    def loss(self, output, target, stage: str) -> Tensor:
        """The loss of one batch; every domain's task defines it.

        Args:
            output: What ``forward`` returned for the batch's inputs.
            target: The batch's target, as ``unpack`` gives it.
            stage: ``"train"``, ``"val"`` or ``"test"``.

        Returns:
            The scalar loss.
        """
        raise NotImplementedError

    def predictions(self, output, target):
        """(predictions, target) as the metrics take them, from ``forward``'s output and ``unpack``'s target; by
        default the output detached and the target unchanged."""
        return output.detach(), target

    def perturb(self, inputs, condition: str, settings, generator: torch.Generator):
        """``inputs`` under one test-time condition; needed only when ``perturbations`` is set.

        Args:
            inputs: A test batch's inputs, as ``unpack`` gives them.
            condition: The condition's name, a key of ``perturbations``.
            settings: The condition's settings, ``perturbations[condition]``.
            generator: The source of all the condition's randomness (``perturbation_generator``).

        Returns:
            The perturbed inputs, as ``forward`` takes them.
        """
        raise NotImplementedError(f"{type(self).__name__} defines no test-time perturbations")

    # --- shared by every domain -------------------------------------------------------------------
    def forward(self, inputs):
        """``net(inputs)``: the network on a batch's inputs, as ``unpack`` gives them."""
        return self.net(inputs)

    def compile_training(self, **options) -> None:
        """Run training steps' ``forward`` (and so its backward) through ``torch.compile(**options)``. Only
        training steps: evaluation, test-time perturbations and attacks keep the eager model, so what is measured
        after training is computed as in an eager run; probe steps run eagerly too (``ProbeCallback``), since a
        probe's explicit logits are no part of the step being sped up."""
        self.compiled_forward = torch.compile(self.forward, **options)

    def step(self, batch, stage: str) -> Tensor:
        """One batch of any stage: forward, loss, logging and the stage's metrics.

        Args:
            batch: One batch as the data loader gives it.
            stage: ``"train"``, ``"val"`` or ``"test"``; training runs the compiled forward if there is one.

        Returns:
            The loss, not detached.
        """
        inputs, target = self.unpack(batch)
        compiled = stage == "train" and self.compiled_forward is not None
        output = self.compiled_forward(inputs) if compiled else self(inputs)
        loss = self.loss(output, target, stage)
        if stage == "train":
            self.train_loss = loss.detach()  # the task's loss, logged and watched; the z-loss is only trained on
            if self.trainer.progress_bar_callback is not None:
                self.log("train/loss", loss, prog_bar=True, logger=False, batch_size=len(target))
            if self.optim.z_loss:
                loss = loss + self.optim.z_loss * z_loss(output, self.logit_dim)
        else:
            # Evaluation losses are averaged over every DDP rank (the metrics sync themselves), so a loss that is
            # the primary metric picks the same checkpoint on every rank.
            self.log(f"{stage}/loss", loss, batch_size=len(target), sync_dist=True)
        self.update_metrics(stage, *self.predictions(output, target))
        return loss

    def update_metrics(self, stage: str, preds: Tensor, target: Tensor) -> None:
        """Update the stage's metrics; validation and test metrics are logged per epoch from here.

        Args:
            stage: ``"train"``, ``"val"`` or ``"test"``.
            preds: Predictions, as ``predictions`` gives them.
            target: The batch's target; its length is the logged batch size.
        """
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(preds, target)
        if stage != "train":
            self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(target))

    def on_train_start(self) -> None:
        """Lightning hook: count logged steps from the trainer's current global step."""
        self.logged_steps = self.trainer.global_step  # a resumed or repeated fit starts where its trainer is

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Lightning hook: send the last optimiser step's training loss to the loggers when it is due."""
        # The training loss goes to the loggers as a per-step self.log would send it (the loss of every
        # log_every_n_steps-th optimiser step, and of a step that stops training), but straight: self.log costs
        # about 0.6 ms a call on CPU (``quest bench --model``), a twentieth of a short step.
        stepped, every = self.trainer.global_step, self.trainer.log_every_n_steps
        if stepped == self.logged_steps or self.train_loss is None:
            return  # a batch that only accumulates gradients, or a step skipped for a non-finite loss
        self.logged_steps = stepped
        if every > 0 and (stepped % every == 0 or self.trainer.should_stop) and self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                logger.log_metrics({"train/loss": float(self.train_loss), "epoch": self.current_epoch},
                                   step=stepped - 1)
        self.train_loss = None

    def on_train_epoch_end(self) -> None:
        """Lightning hook: log the epoch's training metrics and reset them."""
        # Training metrics are logged once an epoch from the state they accumulated, as Lightning's epoch
        # aggregation of a logged Metric would log them; a self.log_dict per step costs about a millisecond
        # a step on CPU (``quest bench --model``) for the same values.
        if any(metric.update_called for metric in self.train_metrics.values()):
            self.log_dict(self.train_metrics.compute())
        self.train_metrics.reset()

    def training_step(self, batch, batch_idx):
        """Lightning's training step: the loss, or None (no backward) when it is not finite on some rank, which marks
        the run diverged."""
        loss = self.step(batch, "train")
        # Every rank must agree, or DDP would wait forever on the rank that skipped its backward.
        if self.trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss)), all=False):
            self.mark_diverged("non-finite training loss")
            return None
        return loss

    def validation_step(self, batch, batch_idx):
        """Lightning's validation step: loss and metrics of one batch, logged."""
        self.step(batch, "val")

    def test_step(self, batch, batch_idx):
        """Lightning's test step: the batch as given, then under each test-time condition."""
        self.step(batch, "test")
        if not self.perturbations:
            return
        inputs, target = self.unpack(batch)
        device = target.device if isinstance(target, Tensor) else self.device
        for condition, settings in self.perturbations.items():
            generator = perturbation_generator(self.seed, batch_idx, condition, device)
            output = self(self.perturb(inputs, condition, settings, generator))
            self.perturbed_metrics[condition].update(*self.predictions(output, target))

    def on_test_epoch_end(self) -> None:
        """Lightning hook: log ``summarize_perturbed`` of the per-condition scores as ``test/<name>``."""
        if not self.perturbations:
            return
        scores = {condition: metric.compute() for condition, metric in self.perturbed_metrics.items()}
        summary = self.summarize_perturbed(scores)
        self.perturbed_names = set(summary)
        self.log_dict({f"test/{name}": value for name, value in summary.items()})
        for metric in self.perturbed_metrics.values():
            metric.reset()

    def directions(self) -> dict[str, str]:
        """Which way each test metric is better: the loss, what each torchmetrics metric says of itself
        (``higher_is_better``; one that says nothing is left out), and each perturbed score the headline's way.

        Returns:
            Logged name less ``test/`` -> ``"min"`` | ``"max"``.
        """
        found = {"loss": "min"} | {name: "max" if metric.higher_is_better else "min"
                                   for name, metric in self.test_metrics.items(keep_base=True) if metric.higher_is_better is not None}
        if self.headline in found:
            found.update(dict.fromkeys(self.perturbed_names, found[self.headline]))
        return found

    def baselines(self) -> dict[str, str]:
        """Metric name -> what its trivial baseline predicts (its ``description``), for each such test metric."""
        return {name: metric.description for name, metric in self.test_metrics.items(keep_base=True)
                if hasattr(metric, "description")}

    def summary_metrics(self, primary: str) -> list[str]:
        """The test metrics a run's summary line shows: ``primary``, its trivial baseline where the task has one, then
        ``robustness_summary``; per-class and per-condition scores stay in the record."""
        baseline = f"{primary}_baseline"
        return [primary, *([baseline] if baseline in self.baselines() else []), *self.robustness_summary()]

    def robustness_summary(self) -> list[str]:
        """The perturbed scores that summarise robustness; by default each one logged (a condition each), sorted."""
        return sorted(self.perturbed_names)

    def summarize_perturbed(self, scores: dict[str, Tensor]) -> dict[str, Tensor]:
        """What is logged of ``scores`` (condition -> the headline metric under it): name -> value, each logged as
        ``test/<name>``; by default each score as ``<metric>_<condition>``."""
        return {f"{self.headline}_{condition}": score for condition, score in scores.items()}

    def mark_diverged(self, reason: str) -> None:
        """End training now and remember why (``reason``, with the global step; only the first call's is kept); the
        runner records ``status: diverged``."""
        if self.divergence is None:
            self.divergence = {"step": int(self.global_step), "reason": reason}
        self.trainer.should_stop = True

    def decayed(self) -> set[str]:
        """Names of the parameters that take weight decay: those of two or more dimensions (not biases,
        norms or attention gains), less any the net exempts by name in ``no_weight_decay()`` (timm's
        convention: a ViT's position embedding and cls token).

        Returns:
            The names as ``named_parameters`` gives them (prefixed ``net.``); frozen parameters are left out.
        """
        exempt = {f"net.{name}" for name in getattr(self.net, "no_weight_decay", set)()}
        return {name for name, p in self.named_parameters() if p.requires_grad and p.dim() > 1 and name not in exempt}

    def configure_optimizers(self):
        """Lightning hook: ``build_optimizer`` over the trainable parameters for the trainer's estimated steps, the
        schedule stepped every optimiser step."""
        total = max(1, int(self.trainer.estimated_stepping_batches))
        trained = [(name, p) for name, p in self.named_parameters() if p.requires_grad]
        optimizer, schedule = build_optimizer(trained, self.decayed(), self.optim, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def z_loss(logits: Tensor, dim: int) -> Tensor:
    """PaLM's z-loss: the mean over positions of log² Z, Z the softmax normaliser of ``logits`` over ``dim`` (0 at
    log Z = 0, so the logits keep no shared offset)."""
    return torch.logsumexp(logits.float(), dim).square().mean()


def build_optimizer(trained: list[tuple[str, Tensor]], decayed: set[str], optim: Optim, total: int):
    """``(optimizer, scheduler)`` of a run of ``total`` optimiser steps over its ``trained`` (name, parameter) pairs,
    as the ``optim`` section sets them: two groups, weight decay on the ``decayed`` names and none on the rest, and a
    ``LambdaLR`` stepped once per optimiser step (``quest ensemble``'s vectorised AdamW keeps these groups and this
    schedule). Independent decay (``optim.independent_weight_decay``) gives AdamW ``weight_decay / lr``, which it
    multiplies by each step's rate: every weight shrinks by ``weight_decay`` × the schedule's factor, whatever lr."""
    decay = optim.weight_decay / optim.lr if optim.independent_weight_decay else optim.weight_decay
    groups = [{"params": [p for name, p in trained if name in decayed], "weight_decay": decay},
              {"params": [p for name, p in trained if name not in decayed], "weight_decay": 0.0}]
    settings = {"momentum": optim.momentum, "nesterov": optim.nesterov} if optim.name == "sgd" else {"betas": optim.betas}
    optimizer = OPTIMIZERS[optim.name](groups, lr=optim.lr, **settings)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(optim, total))


def lr_schedule(optim: Optim, total: int):
    """The learning-rate multiplier per 0-based step of a run of ``total`` optimiser steps, for ``LambdaLR``, as the
    ``optim`` section sets it: linear warm-up to 1 over ``warmup_steps``; then ``schedule`` down to ``min_lr_ratio`` (a
    fraction of the base rate) by step ``total - cooldown_steps`` — ``cosine``, ``poly`` (``(1 - progress) **
    poly_power``, Segmenter's schedule) or ``constant`` (stays at 1); then ``min_lr_ratio`` for the last
    ``cooldown_steps`` (DeiT's cool-down epochs). ``min_lr``, where set, is that end as a rate: ``min_lr_ratio``
    becomes min(min_lr / lr, 1)."""
    warmup = optim.warmup_steps
    min_ratio = optim.min_lr_ratio if optim.min_lr is None else min(optim.min_lr / optim.lr, 1.0)
    decay_end = max(warmup + 1, total - optim.cooldown_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if optim.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / (decay_end - warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if optim.schedule == "cosine" else (1 - progress) ** optim.poly_power
        return min_ratio + (1 - min_ratio) * shape

    return factor


def classification_metrics(num_classes: int) -> dict[str, Metric]:
    """Name -> metric over ``num_classes`` classes, the headline ``acc`` first (``Task``'s ``metrics``)."""
    return {"acc": MulticlassAccuracy(num_classes, average="micro"),
            "macc": MulticlassAccuracy(num_classes, average="macro"),
            "acc_baseline": MajorityClassAccuracy(num_classes)}


class ClassificationTask(Task):
    """Cross-entropy classifier over ``net(inputs)`` for batches ``(inputs, labels)``; logs ``acc`` and ``macc``
    (``classification_metrics``). ``optim``, ``perturbations`` and ``seed`` are ``Task``'s.

    Args:
        net: The network, mapping a batch's inputs to logits ``(batch, num_classes)``.
        num_classes: Number of classes.
        label_smoothing: Cross-entropy label smoothing, in training only.
    """

    logit_dim = -1

    def __init__(self, net: nn.Module, num_classes: int, optim: Optim, *, label_smoothing: float = 0.0,
                 perturbations: dict | None = None, seed: int = 0):
        super().__init__(net, optim, classification_metrics(num_classes), perturbations=perturbations, seed=seed)
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing

    def loss(self, logits: Tensor, labels: Tensor, stage: str) -> Tensor:
        """Mean cross-entropy of ``logits`` ``(batch, num_classes)`` against ``labels``, class indices ``(batch,)``,
        label-smoothed only where ``stage`` is ``"train"``."""
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing if stage == "train" else 0.0)
