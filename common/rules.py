"""The rules a run is trained by, written once for both trainers: the Lightning callbacks of ``quest train``
(``common.callbacks``) and the vectorised replay of ``quest ensemble`` (``runners.runs.ensemble``). A run ends as
diverged (a result, not a failure) on a non-finite training loss too, which each trainer catches itself.
"""
from __future__ import annotations

import math


class LossWatch:
    """The training loss of one run: its first, last and lowest value (``losses``, for the record), and
    whether it has blown up while staying finite: above ``loss_ratio`` × max(first loss, 1), or above
    ``max_loss`` (either may be None). The floor of 1 keeps a near-zero first loss (a regression that starts
    well) from making the ratio bound trip on ordinary noise."""

    def __init__(self, loss_ratio: float | None = 1e3, max_loss: float | None = 1e6):
        self.loss_ratio, self.max_loss = loss_ratio, max_loss
        self.first: float | None = None
        self.last: float | None = None
        self.best = math.inf

    @property
    def losses(self) -> dict[str, float]:
        return {} if self.first is None else {"train_first": self.first, "train_last": self.last, "train_best": self.best}

    def breach(self, loss: float) -> str | None:
        """Take one finite training loss; the reason the run diverged, if it did."""
        if self.first is None:
            self.first = loss
        self.last, self.best = loss, min(self.best, loss)
        bounds = [b for b in (None if self.loss_ratio is None else self.loss_ratio * max(abs(self.first), 1.0),
                              self.max_loss) if b is not None]
        return f"training loss {loss:.3g} past bound {min(bounds):.3g}" if bounds and loss > min(bounds) else None


def logit_breach(max_logit: float, bound: float | None) -> str | None:
    """The reason a run diverged if its max attention logit is non-finite or past ``bound`` (None: no bound)."""
    breached = not math.isfinite(max_logit) or (bound is not None and max_logit > bound)
    return f"max attention logit {max_logit:.3g} past bound {bound}" if breached else None


def improves(value: float, best: float | None, mode: str) -> bool:
    """Whether a validation ``value`` makes the checkpoint to keep, ``best`` being the kept one's (None before
    the first validation): strictly better in ``mode`` ("min" or "max"), a NaN counting as the worst."""
    if best is None:
        return True
    worst = math.inf if mode == "min" else -math.inf
    value, best = (worst if math.isnan(v) else v for v in (value, best))
    return value < best if mode == "min" else value > best
