"""Lightning callbacks of the training layer: ``ProbeCallback`` reads the attention probes of
``common.probes`` while a model trains."""
from __future__ import annotations

import math

import pytorch_lightning as pl

from common.probes import Probe, attention_probes, summarize


class ProbeCallback(pl.Callback):
    """Every ``every_n_steps`` training steps, probe every attention layer on ``max_samples`` samples and
    log ``probe/<layer>/<stat>`` plus a cross-layer summary ``probe/<stat>``; ``trajectory`` keeps every
    probe step's per-layer statistics for the run record. A max logit beyond ``max_logit_bound`` (or a
    non-finite one) is reported to the module's ``mark_diverged``."""

    def __init__(self, every_n_steps: int = 50, max_samples: int = 4, max_logit_bound: float | None = None):
        self.every_n_steps = every_n_steps
        self.max_samples = max_samples
        self.max_logit_bound = max_logit_bound
        self.latest: dict[str, float] = {}
        self.trajectory: dict = {"step": [], "layers": {}}  # layers: {name: {stat: [value per step]}}

    def _switch(self, pl_module: pl.LightningModule, on: bool) -> dict[str, Probe]:
        found = attention_probes(pl_module)
        for probe in found.values():
            probe.enabled, probe.max_samples = on, self.max_samples
            if on:
                probe.stats = {}
        return found

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.every_n_steps > 0 and trainer.global_step % self.every_n_steps == 0:
            self._switch(pl_module, True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        found = attention_probes(pl_module)
        if not any(p.enabled for p in found.values()):
            return
        self._switch(pl_module, False)
        per_layer = {name: p.stats for name, p in found.items() if p.stats}
        if not per_layer:
            return
        self.latest = summarize(per_layer)
        self.trajectory["step"].append(int(trainer.global_step))
        for name, stats in per_layer.items():
            layer = self.trajectory["layers"].setdefault(name, {})
            for stat, value in stats.items():
                layer.setdefault(stat, []).append(float(value))
        # Straight to the loggers: self.log would drop steps that miss Trainer(log_every_n_steps).
        metrics = {f"probe/{name}/{stat}": float(v) for name, stats in per_layer.items() for stat, v in stats.items()}
        metrics.update({f"probe/{stat}": v for stat, v in self.latest.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        max_logit = self.latest["max_logit"]
        if not math.isfinite(max_logit) or (self.max_logit_bound is not None and max_logit > self.max_logit_bound):
            mark = getattr(pl_module, "mark_diverged", None)
            if mark is not None:
                mark(f"max attention logit {max_logit:.3g} past bound {self.max_logit_bound}")


class DivergenceCallback(pl.Callback):
    """Ends a run as diverged when its training loss blows up while staying finite (non-finite losses are
    caught by the task itself): above ``loss_ratio`` × max(first training loss, 1), or above ``max_loss``.
    The floor of 1 keeps a near-zero first loss (a regression that starts well) from making the ratio
    bound trip on ordinary noise. Either bound may be None. All ranks agree before stopping. It also
    remembers the first, last and lowest training loss (``losses``) for the run record."""

    def __init__(self, loss_ratio: float | None = 1e3, max_loss: float | None = 1e6):
        self.loss_ratio, self.max_loss = loss_ratio, max_loss
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.best_loss = math.inf

    @property
    def losses(self) -> dict[str, float]:
        if self.first_loss is None:
            return {}
        return {"train_first": self.first_loss, "train_last": self.last_loss, "train_best": self.best_loss}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:  # the task skipped a non-finite step and has marked the run already
            return
        value = float(loss.detach())
        if self.first_loss is None:
            self.first_loss = value
        self.last_loss, self.best_loss = value, min(self.best_loss, value)
        bounds = []
        if self.loss_ratio is not None:
            bounds.append(self.loss_ratio * max(abs(self.first_loss), 1.0))
        if self.max_loss is not None:
            bounds.append(self.max_loss)
        bad = bool(bounds) and value > min(bounds)
        if trainer.strategy.reduce_boolean_decision(bad, all=False):
            pl_module.mark_diverged(f"training loss {value:.3g} past bound {min(bounds):.3g}" if bad
                                    else "training loss past its bound on another rank")
