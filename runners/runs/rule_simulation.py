"""What a selection rule costs at a number of selection seeds, simulated from a grid's own runs (``quest select
--simulate``): the expected regret, in validation score, of the best grid value (rule ``best``) and of the curve's
vertex (rule ``curve``, ``runners.runs.margins``).

Each simulated truth is a parabola in log(value) with the grid's own curvature (a least-squares fit over its mean
scores) and the grid's own noise (the pooled spread of a value's runs over seeds), made asymmetric (the curvature on
one side up to 3 times the other's, drawn log-uniformly) and peaking somewhere within a grid step of the middle of a
five-value grid: ``anywhere`` draws the peak uniformly within half a step of a grid value, ``on a value`` puts it on
one, the case most favourable to the best grid value. A rule's regret is the truth's peak minus the truth at its
choice. Fixed seeds, so a table is the same every time.
"""
from __future__ import annotations

import math

import numpy as np

from runners.runs.margins import Grid, vertex

SCENARIOS = ("anywhere", "on a value")
DRAWS = 4000


def shape(grid: Grid) -> tuple[float, float] | None:
    """(curvature per log-step squared, noise sd of one run) of a one-key grid of three or more values whose runs all
    finished, None where it has fewer or its mean scores are not concave."""
    values = sorted(grid)
    if len(values) < 3 or not all(math.isfinite(s) for v in values for s in grid[v].values()):
        return None
    step = float(np.median(np.diff(np.log(values))))
    x = np.log(values) / step
    curvature = -np.polyfit(x, [np.mean(list(grid[v].values())) for v in values], 2)[0]
    spread = [np.var(list(grid[v].values()), ddof=1) for v in values if len(grid[v]) > 1]
    if curvature <= 0 or not spread:
        return None
    return float(curvature), float(math.sqrt(np.mean(spread)))


def regrets(curvature: float, sd: float, seeds: int, scenario: str, rng: np.random.Generator) -> tuple[float, float]:
    """The mean regret of rules best and curve over ``DRAWS`` simulated grids (module doc)."""
    xs = np.arange(-2.0, 3.0)
    best, curve = [], []
    for _ in range(DRAWS):
        peak = rng.uniform(-0.5, 0.5) if scenario == "anywhere" else 0.0
        skew = math.exp(rng.uniform(-math.log(3), math.log(3)))
        left, right = curvature * math.sqrt(skew), curvature / math.sqrt(skew)
        means = _truth(xs, peak, left, right) + rng.normal(0, sd / math.sqrt(seeds), len(xs))
        at = int(np.argmax(means))
        best.append(-_truth(xs[at], peak, left, right))
        chosen = xs[at] if at in (0, len(xs) - 1) else vertex(list(xs[at - 1:at + 2]), list(means[at - 1:at + 2]))
        curve.append(-_truth(chosen, peak, left, right))
    return float(np.mean(best)), float(np.mean(curve))


def _truth(x, peak: float, left: float, right: float):
    """The simulated validation score at log-position ``x``: 0 at the peak, falling with each side's curvature."""
    return -np.where(x < peak, left, right) * (np.asarray(x) - peak) ** 2


def table(grids: dict[tuple, Grid], seed_counts: list[int]) -> list[str]:
    """Markdown: per group whose grid has a shape, each rule's mean regret at each seed count, in both scenarios."""
    lines = ["", "**Simulated regret of the two rules** (mean loss of validation score against the curve's peak; "
             "best grid value / curve vertex; `runners.runs.rule_simulation`)", "",
             "| group | curvature | run sd | scenario | " + " | ".join(f"{n} seeds" for n in seed_counts) + " |",
             "|---|---|---|---|" + "---|" * len(seed_counts)]
    for group, grid in grids.items():
        if (found := shape(grid)) is None:
            continue
        curvature, sd = found
        for scenario in SCENARIOS:
            rng = np.random.default_rng(0)
            cells = [regrets(curvature, sd, n, scenario, rng) for n in seed_counts]
            lines.append(f"| {' / '.join(map(str, group))} | {curvature:.4f} | {sd:.4f} | {scenario} | "
                         + " | ".join(f"{b:.4f} / {c:.4f}" for b, c in cells) + " |")
    return lines
