"""A figure per tuned domain: each variant's mean validation score against the scaled setting (a learning rate), with
its 95% interval over the selection seeds, the choice starred and the curve's vertex dotted (``runners.runs.margins``)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from runners.results.stats import half_width  # noqa: E402
from runners.runs.margins import Grid, Margin  # noqa: E402


def plot_selection(grids: dict[str, Grid], margins: dict[str, Margin], chosen: dict[str, float], *, key: str,
                   metric: str, sign: int, title: str, path: Path) -> Path:
    """``grids`` and ``margins`` per variant (scores signed higher-better; ``sign`` turns them back into the
    metric's units), ``chosen`` the value each variant was given; writes ``path`` and returns it."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for variant, grid in grids.items():
        values = sorted(grid)
        scores = [np.array([s for s in grid[v].values() if math.isfinite(s)]) * sign for v in values]
        mean = np.array([s.mean() if len(s) else np.nan for s in scores])
        half = np.nan_to_num([half_width(pd.Series(s)) for s in scores])  # no bar below two finished runs
        line = ax.errorbar(values, mean, yerr=half, marker="o", capsize=3, label=variant)
        colour = line[0].get_color()
        best = margins[variant].best
        ax.plot([best], [mean[values.index(best)]], marker="*", markersize=14, color=colour)
        if chosen.get(variant) is not None and chosen[variant] != best:
            ax.axvline(chosen[variant], color=colour, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel(f"validation {metric} (mean, 95% CI over seeds)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
