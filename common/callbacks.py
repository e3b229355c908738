"""Lightning callbacks of the training layer; those that judge a run apply the rules of ``common.rules``."""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from common.probes import Probe, attention_probes, probe_log, raise_peaks, summarize
from common.rules import LossWatch, improves, logit_breach


class ProbeCallback(pl.Callback):
    """Every ``every_n_steps`` training steps, probe every attention layer on ``max_samples`` samples and
    log ``probe/<layer>/<stat>`` plus a cross-layer summary ``probe/<stat>``; ``trajectory`` keeps every
    probe step's per-layer statistics for the run record, and ``peak`` the largest of each maximum over every probe
    step (``common.probes.raise_peaks``). A max logit beyond ``max_logit_bound`` (or a
    non-finite one) is reported to the module's ``mark_diverged``."""

    def __init__(self, every_n_steps: int = 50, max_samples: int = 4, max_logit_bound: float | None = None):
        self.every_n_steps = every_n_steps
        self.max_samples = max_samples
        self.max_logit_bound = max_logit_bound
        self.latest: dict[str, float] = {}
        self.trajectory: dict = {"step": [], "layers": {}}  # layers: {name: {stat: [value per step]}}
        self.peak: dict[str, float] = {}
        self._step = 0
        self._probes: dict[str, Probe] = {}
        self._probing = False

    def on_fit_start(self, trainer, pl_module):
        # A walk over every module: once a fit, not once a step (it cost more than a short step's logging).
        self._probes = attention_probes(pl_module)

    def _switch(self, on: bool) -> None:
        self._probing = on
        # A compiled training step (``Task.compile_training``) runs eagerly while probed: the probes' explicit
        # logits and Python-side statistics would otherwise be traced into a second graph for one step in k.
        torch.compiler.set_stance("force_eager" if on else "default")
        for probe in self._probes.values():
            probe.enabled, probe.max_samples = on, self.max_samples
            if on:
                probe.stats = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0:
            self._switch(True)
            self._step = int(trainer.global_step)  # the weights probed: those before this step's update

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self._probing:
            return
        self._switch(False)
        per_layer = {name: p.stats for name, p in self._probes.items() if p.stats}
        if not per_layer:
            return
        self.latest = summarize(per_layer)
        raise_peaks(self.peak, self.latest)
        self.trajectory["step"].append(self._step)
        for name, stats in per_layer.items():
            layer = self.trajectory["layers"].setdefault(name, {})
            for stat, value in stats.items():
                layer.setdefault(stat, []).append(float(value))
        # Straight to the loggers: self.log would drop steps that miss Trainer(log_every_n_steps).
        metrics = probe_log(per_layer, self.latest)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=self._step)
        reason = logit_breach(self.latest["max_logit"], self.max_logit_bound)
        if reason is not None and hasattr(pl_module, "mark_diverged"):
            pl_module.mark_diverged(reason)


class DivergenceCallback(pl.Callback):
    """Ends a run as diverged when its finite training loss breaks ``common.rules.LossWatch``'s bounds
    (non-finite losses are caught by the task itself); all ranks agree before stopping. ``losses``: the watch's."""

    def __init__(self, loss_ratio: float | None = 1e3, max_loss: float | None = 1e6):
        self.watch = LossWatch(loss_ratio, max_loss)

    @property
    def losses(self) -> dict[str, float]:
        return self.watch.losses

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:  # the task skipped a non-finite step and has marked the run already
            return
        reason = self.watch.breach(float(loss.detach()))
        if trainer.strategy.reduce_boolean_decision(reason is not None, all=False):
            pl_module.mark_diverged(reason or "training loss past its bound on another rank")


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, keeping the validation epoch that ``common.rules.improves`` picks (the
    rule ``quest ensemble`` follows too) as its one best checkpoint. ``save_s``: the seconds spent writing
    checkpoints, part of a run's fixed cost."""

    save_s = 0.0

    def _save_checkpoint(self, trainer, filepath) -> None:
        start = time.perf_counter()
        super()._save_checkpoint(trainer, filepath)
        self.save_s += time.perf_counter() - start

    def check_monitor_top_k(self, trainer, current=None) -> bool:
        if current is None:
            return False
        kept = self.best_k_models.get(self.kth_best_model_path)
        better = improves(float(current), None if kept is None else float(kept), self.mode)
        return trainer.strategy.reduce_boolean_decision(better)


class ProgressLines(pl.Callback):
    """Progress for a log file or a pipe, where a bar would write a line per refresh: one line every
    ``every_n_steps`` training steps (0: none between) and one when training ends,

        step 400/2000 · loss 2.31 · val loss 2.35 · 38 it/s · eta 1 min

    the loss averaged over the steps since the last line, ``val`` the last validation's loss and ``monitor``,
    the rate over those steps' training time (validation left out), the eta from their wall time. A line
    falls due at its step and is printed after that step's validation, if one follows, so that it carries
    it. Losses are summed on their device and read only when a line is printed, so a GPU is not made to
    wait every step."""

    def __init__(self, every_n_steps: int, monitor: str):
        self.every_n_steps, self.monitor = every_n_steps, monitor
        self._sum, self._count, self._train_s, self._due = 0.0, 0, 0.0, False
        self._since = self._last_line = 0.0

    def on_train_start(self, trainer, pl_module):
        self._last_line = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._due:
            self._print(trainer)
        self._since = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._train_s += time.perf_counter() - self._since
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # {} or None: a step skipped
        if loss is not None:
            self._sum, self._count = self._sum + loss.detach(), self._count + 1
        self._due = bool(self.every_n_steps) and trainer.global_step % self.every_n_steps == 0

    def on_validation_end(self, trainer, pl_module):
        if self._due and not trainer.sanity_checking:
            self._print(trainer)

    def on_train_end(self, trainer, pl_module):
        if self._count:  # steps since the last line
            self._print(trainer)

    def _print(self, trainer) -> None:
        total = trainer.estimated_stepping_batches
        parts = [f"step {trainer.global_step}/{total}" if math.isfinite(total) else f"step {trainer.global_step}"]
        if self._count:
            parts.append(f"loss {float(self._sum) / self._count:.4g}")
        parts += [f"{name.replace('/', ' ')} {float(trainer.callback_metrics[name]):.4g}"
                  for name in dict.fromkeys(("val/loss", self.monitor)) if name in trainer.callback_metrics]
        if self._count:
            now = time.perf_counter()
            parts.append(f"{self._count / max(self._train_s, 1e-9):.3g} it/s")
            if math.isfinite(total) and total > trainer.global_step:
                step_s = (now - self._last_line) / self._count
                parts.append(f"eta {_duration((total - trainer.global_step) * step_s)}")
            self._last_line = now
        print(" · ".join(parts), flush=True)
        self._sum, self._count, self._train_s, self._due = 0.0, 0, 0.0, False


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class Snapshots(pl.Callback):
    """The weights at fixed fractions of training, saved to ``<dirpath>/step<N>.ckpt`` (``fractions`` of the
    run's optimiser steps, each rounded to a step): one run's checkpoints then stand for shorter trainings, each
    without the end of its own learning-rate schedule. ``saved`` lists them for the run record."""

    def __init__(self, dirpath: Path, fractions: Sequence[float]):
        self.dirpath, self.fractions = Path(dirpath), sorted(set(fractions))
        self.due: dict[int, float] = {}
        self.saved: list[dict] = []

    def on_train_start(self, trainer, pl_module):
        total = int(trainer.estimated_stepping_batches)
        self.due = {max(1, round(fraction * total)): fraction for fraction in self.fractions}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(trainer.global_step)
        if step in self.due and not any(s["step"] == step for s in self.saved):
            path = self.dirpath / f"step{step}.ckpt"
            trainer.save_checkpoint(path, weights_only=True)
            self.saved.append({"fraction": self.due[step], "step": step, "file": path.name})
