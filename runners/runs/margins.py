"""How sure a choice on validation data is: the margin of a grid's best value over its runner-up, and the curve rule
that chooses a learning rate between grid values when the grid alone cannot (``docs/guides/selection.md``).

A grid is one setting's values (a learning rate), each with its runs' validation scores by seed, signed so that
higher is better, a diverged or failed run scoring ``-inf``. The grid's best value is the one with the best mean;
its **margin** is the paired difference to the runner-up (the next best mean) over the seeds both ran, with its 95%
t-interval: *decided* when the interval lies above 0, *within noise* otherwise. A best value at an end of the grid
is an **edge**: nothing says the curve does not go on rising past it.

The **curve rule** fits a parabola in log(value) through the mean scores of the best value and its two neighbours
and chooses its vertex, which lies between the neighbours. Both neighbours must have finished every run: next to a
value that diverged or failed, the best grid value stands (the curve is not a parabola there). Its interval comes
from resampling the seeds (a bootstrap of the vertex, seeded, so it is the same every time).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

Grid = dict[float, dict[int, float]]  # value -> {seed: signed score}, higher is better, -inf a run not ok
DECIDED, WITHIN_NOISE, EDGE = "decided", "within noise", "edge"
TIE = 1e-4  # scores this close are equal (the precision tables print): ties go to the smaller value, never decided
BOOTSTRAP = 2000  # resamples of the seeds for the vertex's interval


@dataclass(frozen=True)
class Margin:
    """The evidence behind one choice (``margin``); scores in the grid's signed units (higher is better)."""

    best: float  # the grid value with the best mean score
    runner_up: float | None  # the next best mean (None: a grid of one value)
    difference: float  # mean over the common seeds of best - runner-up (inf: the runner-up failed where best did not)
    low: float  # its 95% t-interval (NaN below two seeds or with a run not ok)
    high: float
    seeds: int  # the seeds both ran
    verdict: str  # DECIDED or WITHIN_NOISE
    edge: bool  # the best value is the grid's smallest or largest
    curve: float | None  # the curve rule's vertex; None at an edge or beside a value not ok
    curve_low: float | None  # the vertex's 90% bootstrap interval over seeds
    curve_high: float | None

    def as_json(self) -> dict:
        return {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
                for key, value in asdict(self).items()}

    @property
    def chosen(self) -> float:
        """The curve rule's choice: the vertex where there is one, else the best grid value."""
        return self.best if self.curve is None else self.curve

    def describe(self) -> str:
        """One line: best vs runner-up, the difference with its interval and verdict, then the curve's choice."""
        text = f"best {self.best:g}"
        if self.runner_up is not None:
            interval = f" [{self.low:+.4f}, {self.high:+.4f}]" if math.isfinite(self.low) else ""
            text += f" vs {self.runner_up:g}: {self.difference:+.4f}{interval} over {self.seeds} seeds, {self.verdict}"
        if self.edge:
            text += f"; {EDGE} of the grid (the curve may rise past it)"
        if self.curve is not None:
            text += f"; curve vertex {self.curve:.3g} [{self.curve_low:.3g}, {self.curve_high:.3g}]"
        return text


def margin(grid: Grid, *, ordered: bool = True) -> Margin:
    """The margin of ``grid``'s best value over its runner-up, and the curve rule's vertex (module doc). Without
    ``ordered`` the grid's keys only name candidates (several settings at once): no edge and no curve."""
    mean = {value: float(np.mean(list(scores.values()))) for value, scores in grid.items()}
    order = sorted(grid, key=lambda value: (-bucket(mean[value]), value))  # ties to the smaller value
    best, values = order[0], sorted(grid)
    edge = ordered and len(values) > 1 and best in (values[0], values[-1])
    runner_up = order[1] if len(order) > 1 else None
    difference, low, high, seeds = math.nan, math.nan, math.nan, 0
    verdict = WITHIN_NOISE
    if runner_up is not None:
        common = sorted(set(grid[best]) & set(grid[runner_up]))
        diffs = np.array([grid[best][s] - grid[runner_up][s] for s in common])
        seeds = len(common)
        with np.errstate(invalid="ignore"):
            difference = float(diffs.mean()) if seeds else math.nan
        if seeds > 1 and np.isfinite(diffs).all():
            half = float(stats.t.ppf(0.975, seeds - 1) * diffs.std(ddof=1) / math.sqrt(seeds))
            low, high = difference - half, difference + half
            verdict = DECIDED if low > 0 and difference >= TIE else WITHIN_NOISE
        elif seeds and math.isfinite(mean[best]) and not math.isfinite(mean[runner_up]):
            verdict = DECIDED  # the runner-up diverged or failed on a seed where the best finished
    curve = _curve(grid, best, values) if ordered else (None, None, None)
    return Margin(best, runner_up, difference, low, high, seeds, verdict, edge, *curve)


def bucket(score: float) -> float:
    """Scores equal to ``TIE`` share a bucket; a worst score (infinite) stays apart."""
    return round(score / TIE) if math.isfinite(score) else score


def _curve(grid: Grid, best: float, values: list[float]) -> tuple[float | None, float | None, float | None]:
    at = values.index(best)
    three = values[at - 1:at + 2]
    if at in (0, len(values) - 1) or not all(math.isfinite(s) for v in three for s in grid[v].values()):
        return None, None, None
    x = [math.log(v) for v in three]
    seeds = sorted(set.intersection(*(set(grid[v]) for v in three)))
    peak = vertex(x, [float(np.mean(list(grid[v].values()))) for v in three])
    low = high = peak  # one seed in common: nothing to resample
    if len(seeds) > 1:
        rng = np.random.default_rng(0)
        draws = [vertex(x, [float(np.mean([grid[v][s] for s in pick])) for v in three])
                 for pick in (rng.choice(seeds, size=len(seeds)) for _ in range(BOOTSTRAP))]
        low, high = np.quantile(draws, [0.05, 0.95])
    return _round(math.exp(peak)), _round(math.exp(low)), _round(math.exp(high))


def vertex(x: list[float], y: list[float]) -> float:
    """The maximum of the parabola through three points, kept between the outer two: a curve that is not concave
    there (a resample where the middle is not the highest) puts it at the best of the three."""
    (x0, x1, x2), (y0, y1, y2) = x, y
    a = ((y2 - y1) / (x2 - x1) - (y1 - y0) / (x1 - x0)) / (x2 - x0)
    if a >= 0:
        return x[int(np.argmax(y))]
    b = (y1 - y0) / (x1 - x0) - a * (x0 + x1)
    return min(max(-b / (2 * a), x0), x2)


def _round(value: float) -> float:
    return float(f"{value:.3g}")
