"""The anisotropic mechanism study (``configs/sweep/retrieval_aniso.yaml``): the paper's retrieval task at its
size with the answer's covariance Sigma of condition number κ (``data.answer_kappa``, ``data.py``), with and
without the shortcut, per attention variant. Everything here reads the records or the task, never a choice
made after the runs: the power computation that sized the seeds, the shortcut rule at this size, what each κ
lets a norm or a direction reader do, and the success rates with the QUEST-vs-QKNorm and QUEST-vs-standard
contrasts per cell (Fisher's exact test, Holm over every contrast of the study).

``quest retrieval-aniso RESULTS/records/mechanism-aniso -o RESULTS/mechanism-aniso`` writes
``report.md`` and ``success_by_kappa.png``; ``quest retrieval-aniso --plan`` prints the design
(seeds, headline κ, shortcut norm) from the task alone, as fixed before the runs.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import fisher_exact  # noqa: E402
from statsmodels.stats.multitest import multipletests  # noqa: E402
from statsmodels.stats.power import NormalIndPower  # noqa: E402
from statsmodels.stats.proportion import proportion_effectsize  # noqa: E402

from common.figures import save_figure  # noqa: E402
from common.files import write_atomic  # noqa: E402
from domains.retrieval import report as study  # noqa: E402
from domains.retrieval.config import Data, Task  # noqa: E402
from domains.retrieval.data import answer_spectrum, direction_oracles  # noqa: E402

SIZE = {"num_tokens": 64, "key_dim": 16, "num_classes": 16}  # the paper's size: the headline cell's
KAPPAS = (1.0, 10.0, 100.0, 1000.0)  # decades from the isotropic task to where direction alone finds ~all answers
P_BIAS = (0.5, 0.0)  # the paper's task (shortcut on half the samples) | the control without it
VARIANTS = ("standard", "quest", "qknorm", "qknorm_ds", "qnorm")
CONTRASTS = (("quest", "qknorm"), ("quest", "standard"))
DESIGN_CONTRASTS = len(CONTRASTS) * len(KAPPAS) * len(P_BIAS)  # Holm's family once every cell is run
GRID_CELLS = 16  # the 4 learning rates x 4 weight decays of retrieval_faithful.yaml
DIFFERENCE, ALPHA, POWER = 0.2, 0.05, 0.8  # the smallest difference in success rate the seeds must detect


def runs_needed(difference: float = DIFFERENCE, alpha: float = ALPHA, power: float = POWER) -> int:
    """Runs per variant and cell for a two-sided test of two success rates to detect ``difference`` with
    ``power`` at level ``alpha`` (statsmodels' normal approximation on Cohen's h), at the hardest place: rates
    0.5 ± difference/2, where a proportion varies most."""
    effect = proportion_effectsize(0.5 + difference / 2, 0.5 - difference / 2)
    return math.ceil(NormalIndPower().solve_power(effect, alpha=alpha, power=power, alternative="two-sided"))


def seeds_needed(alpha: float = ALPHA) -> int:
    """Seeds per learning-rate x weight-decay point: each variant's cell pools its grid's runs."""
    return math.ceil(runs_needed(alpha=alpha) / GRID_CELLS)


RUNS_PER_CELL = seeds_needed() * GRID_CELLS  # a variant's runs in one (κ, p_bias) cell of the design


def success_threshold() -> float:
    """The domain's ``task.success_threshold``: the bar the oracles are held to (the runs record their own)."""
    return Task().success_threshold


def headline_data(kappa: float = 1.0) -> Data:
    """The domain's ``data`` at the paper's size with condition number ``kappa``."""
    return Data(**SIZE, answer_kappa=kappa)


def task_table(threshold: float) -> pd.DataFrame:
    """Per κ: Sigma's extreme eigenvalues, the chance level, and the accuracies of the largest-norm oracle and
    of the direction-only oracle on unbiased samples (``direction_oracles``), and whether direction alone
    can reach the success threshold."""
    rows = []
    for kappa in KAPPAS:
        data = headline_data(kappa)
        spectrum = data.answer_std ** 2 * answer_spectrum(data.key_dim, kappa)
        rows.append({**direction_oracles(data), "lambda_max": spectrum.max().item(), "lambda_min": spectrum.min().item()})
    table = pd.DataFrame(rows).set_index("answer_kappa")
    table["direction_suffices"] = table["direction_acc"] >= threshold
    return table


def headline_kappa(table: pd.DataFrame) -> float:
    """The headline cell's κ: the smallest level at which the direction-only oracle reaches the success
    threshold (the least anisotropy at which a reader of directions alone can succeed)."""
    return float(table.index[table["direction_suffices"]].min())


def reading(kappa: float, p_bias: float, direction_acc: float) -> str:
    """Which reading of the paper's task ("Sigma ≠ I", shortcut on half the samples) a cell is."""
    task = "the paper's task (shortcut on half the samples)" if p_bias > 0 else "control without the shortcut (p_bias 0)"
    if kappa == 1:
        return (f"{task}; Sigma read as a scaled identity (κ = 1): the answer's key direction carries no signal, so "
                "QUEST, QKNorm and QKNorm-DS cannot see the unbiased answer by design")
    return (f"{task}; Sigma read as anisotropic (κ = {kappa:g}): the answer's key direction carries signal "
            f"(the direction-only oracle finds {direction_acc:.1%} of answers)")


def contrasts(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell (κ, p_bias) and pair of ``CONTRASTS`` both run: successes over finished runs, the difference in
    rate, Fisher's exact two-sided p and Holm's adjusted p over every contrast of the study."""
    rows = []
    for (kappa, p_bias), cell in runs.groupby(["kappa", "p_bias"]):
        table = study.rates(cell, "variant")
        for a, b in CONTRASTS:
            if a in table.index and b in table.index:
                (ka, na), (kb, nb) = (table.loc[v, ["successes", "runs"]].astype(int) for v in (a, b))
                rows.append({"kappa": kappa, "p_bias": p_bias, "a": a, "b": b, "a_rate": ka / na, "b_rate": kb / nb,
                             "a_counts": f"{ka}/{na}", "b_counts": f"{kb}/{nb}", "difference": ka / na - kb / nb,
                             "p": fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue})
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["p_holm"] = multipletests(frame["p"], alpha=ALPHA, method="holm")[1]
    return frame


def success_plot(runs: pd.DataFrame, threshold: float, path: Path) -> Path:
    """Per shortcut cell, against κ: each variant's success rate (95% Wilson), and the unbiased test accuracy of
    its runs (median and interquartile range over the grid's runs), beside the success threshold. Variants are
    spread a little along κ so that equal points stay visible."""
    cells, variants = sorted(runs["p_bias"].unique(), reverse=True), study._variants(runs)
    fig, axes = plt.subplots(2, len(cells), figsize=(5.2 * len(cells), 6.2), squeeze=False, sharex=True)
    for column, p_bias in enumerate(cells):
        top, bottom = axes[0][column], axes[1][column]
        for i, variant in enumerate(variants):
            group = runs[(runs["p_bias"] == p_bias) & (runs["variant"] == variant)]
            if group.empty:
                continue
            table = study.rates(group, "kappa").sort_index()
            x = table.index * 1.12 ** (i - (len(variants) - 1) / 2)
            top.errorbar(x, table["rate"], yerr=[table["rate"] - table["low"], table["high"] - table["rate"]],
                         marker="o", capsize=3, label=variant)
            acc = group[group["status"] != "failed"].groupby("kappa")["acc"].quantile([0.25, 0.5, 0.75]).unstack()
            bottom.errorbar(x, acc[0.5], yerr=[acc[0.5] - acc[0.25], acc[0.75] - acc[0.5]], marker="o", capsize=3)
        bottom.axhline(threshold, color="grey", ls="--", lw=1)
        top.set_title("with the shortcut (p_bias 0.5)" if p_bias > 0 else "control (p_bias 0)", fontsize=10)
        top.set_ylim(-0.02, 1.02)
        bottom.set_ylim(0, 1)
        bottom.set_xscale("log")
        bottom.set_xticks(KAPPAS, [f"{kappa:g}" for kappa in KAPPAS])
        bottom.set_xlim(KAPPAS[0] / 2, KAPPAS[-1] * 2)
        bottom.set_xlabel("condition number κ of Sigma (1: isotropic)")
    axes[0][0].set_ylabel("success rate over the grid\n(95% Wilson interval)")
    axes[1][0].set_ylabel(f"unbiased test accuracy\n(median, IQR; dashed: threshold {threshold:g})")
    axes[0][-1].legend(fontsize=7)
    return save_figure(fig, path)


def unfinished(runs: pd.DataFrame) -> list[str]:
    """Per cell of the design short of runs, its variants not run and those run in part (with their counts)."""
    counts = runs.groupby(["kappa", "p_bias", "variant"]).size()
    lines = []
    for p_bias in P_BIAS:
        for kappa in KAPPAS:
            have = {v: int(counts.get((kappa, p_bias, v), 0)) for v in VARIANTS}
            absent = [v for v, n in have.items() if n == 0]
            short = [f"{v} {n} of {RUNS_PER_CELL} runs" for v, n in have.items() if 0 < n < RUNS_PER_CELL]
            if absent or short:
                lines.append(f"κ = {kappa:g}, p_bias = {p_bias:g}: " + "; ".join(
                    ([f"{', '.join(absent)} not run"] if absent else []) + ([f"in part: {', '.join(short)}"] if short else [])))
    return lines


def plan_lines(threshold: float, tasks: pd.DataFrame) -> list[str]:
    """The design as fixed before the runs, computed from the task and the power target alone."""
    shortcut_table, bias_norm = study.shortcut_rule(headline_data())
    return [
        "## The design, fixed before the runs", "",
        f"Size: {SIZE['num_tokens']} tokens, {SIZE['key_dim']} key dimensions, {SIZE['num_classes']} classes (the "
        f"paper's); q and k of {SIZE['key_dim']} channels, linear maps of x^k without biases; the values are the "
        "one-hot x^v; the prediction is the tokens' mean attention output (`FaithfulRetrievalNet`). The readout "
        "does not use the answer's position: reading the answer token's own row would turn the task into "
        "\"attend to yourself\" (with W_q = W_k every token's self-cosine is 1), solvable without finding the "
        "out-of-distribution key.", "",
        "Sigma = answer_std² U diag(λ) Uᵀ with λ geometric over the key dimensions from λ_max to λ_max/κ, scaled to "
        f"mean 1, so that tr Sigma = p·answer_std² = {SIZE['key_dim'] * Data().answer_std ** 2:g} at every κ "
        "(the isotropic design's trace: the scale rule); U a Haar-random rotation from `data.answer_basis_seed`. "
        "Per κ, on 20,000 unbiased samples:", "",
        "| κ | λ_max of Sigma | λ_min of Sigma | chance | largest-norm oracle | direction-only oracle | "
        f"direction reaches {threshold:g} |", "|---|---|---|---|---|---|---|",
        *[f"| {kappa:g} | {row['lambda_max']:.2f} | {row['lambda_min']:.4f} | {row['chance']:.3f} | "
          f"{row['largest_norm_acc']:.3f} | {row['direction_acc']:.3f} | {'yes' if row['direction_suffices'] else 'no'} |"
          for kappa, row in tasks.iterrows()], "",
        f"Headline κ (the smallest level at which the direction-only oracle reaches the success threshold): "
        f"{headline_kappa(tasks):g}.", "",
        f"Shortcut strength: the rule of `shortcut.md` (‖b‖: the largest candidate at which the largest-norm and the "
        f"nearest-to-b oracles disagree on at least half the biased samples) at this size: ‖b‖ = {bias_norm:g}.", "",
        *study.shortcut_lines(shortcut_table), "",
        f"Seeds: to detect a difference of {DIFFERENCE:.0%} in success rate between two variants (rates "
        f"{0.5 - DIFFERENCE / 2:.0%} vs {0.5 + DIFFERENCE / 2:.0%}, the hardest place) with a two-sided test at "
        f"α = {ALPHA:g} and {POWER:.0%} power, each variant's cell needs {runs_needed()} runs (statsmodels, normal "
        f"approximation on Cohen's h): {seeds_needed()} seeds on each of the grid's {GRID_CELLS} learning-rate × weight-decay "
        f"points, {seeds_needed() * GRID_CELLS} runs. Holm's first step over m contrasts tests at α/m, which needs "
        f"more (the headline cell's m = {len(CONTRASTS)}: {runs_needed(alpha=ALPHA / len(CONTRASTS))} runs; the full "
        f"design's m = {DESIGN_CONTRASTS}: {runs_needed(alpha=ALPHA / DESIGN_CONTRASTS)}), so a 20-point difference can be "
        "missed after correction.", ""]


def write_report(root: Path, out: Path) -> str:
    runs = study.load(root)
    threshold = success_threshold()
    tasks = task_table(threshold)
    out.mkdir(parents=True, exist_ok=True)
    success_plot(runs, threshold, out / "success_by_kappa.png")
    lines = ["# Mechanism study with an anisotropic Sigma", "",
             f"{len(runs)} run records from `{root}`. A run succeeds when its unbiased test accuracy reaches "
             f"{threshold:g}; diverged runs count as failures, failed runs are left out. The paper says only "
             "\"Sigma ≠ I\"; each cell below says which reading of that it is.", "", *plan_lines(threshold, tasks),
             "## Success rates per cell", ""]
    for (kappa, p_bias), cell in sorted(runs.groupby(["kappa", "p_bias"]), key=lambda item: (-item[0][1], item[0][0])):
        table = study.rates(cell.set_index("variant", drop=False).loc[study._variants(cell)].reset_index(drop=True), "variant")
        sizes = "; ".join(f"{row.num_tokens} tokens, {row.key_dim} key dims, ‖b‖ = {row.bias_norm:g}"
                          for row in cell[["num_tokens", "key_dim", "bias_norm"]].drop_duplicates().itertuples())
        direction = tasks.loc[kappa, "direction_acc"] if kappa in tasks.index else math.nan
        headline = " (the headline cell)" if kappa == headline_kappa(tasks) and p_bias == P_BIAS[0] else ""
        part = "" if set(VARIANTS) <= set(cell["variant"]) and cell.groupby("variant").size().min() >= RUNS_PER_CELL \
            else f" — run in part (the design: {RUNS_PER_CELL} runs per variant)"
        lines += [f"### κ = {kappa:g}, p_bias = {p_bias:g}{headline}{part}", "",
                  f"Reading: {reading(kappa, p_bias, direction)}. Task: {sizes}.", "",
                  "| variant | success rate [95% interval] | successes/runs | paper | diverged | failed | mean acc (unbiased) | "
                  "mean acc (biased) |", "|---|---|---|---|---|---|---|---|"]
        for variant, row in table.iterrows():
            theirs = f"{study.PAPER[variant]:.0%}" if p_bias > 0 and variant in study.PAPER else "–"
            lines.append(f"| {variant} | {study._fmt_rate(row)} | {int(row['successes'])}/{int(row['runs'])} | {theirs} | "
                         f"{int(row['diverged'])} | {int(row['failed'])} | {study._fmt(row['acc'])} | {study._fmt(row['acc_biased'])} |")
        lines.append("")
    tests = contrasts(runs)
    family = ([f"Holm's family is the {len(tests)} contrasts run so far, of the design's {DESIGN_CONTRASTS}: a "
               "verdict here can change as the other cells are run (their contrasts join the family).", ""]
              if len(tests) < DESIGN_CONTRASTS else [])
    lines += ["## Contrasts (Fisher's exact test, two-sided; Holm over all contrasts below)", "", *family,
              "| κ | p_bias | contrast | successes | difference | p | Holm p | at α = 0.05 |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {row['kappa']:g} | {row['p_bias']:g} | {row['a']} − {row['b']} | {row['a_counts']} vs {row['b_counts']} | "
              f"{row['difference']:+.1%} | {row['p']:.3g} | {row['p_holm']:.3g} | "
              f"{'differ' if row['p_holm'] < ALPHA else 'cannot tell'} |" for _, row in tests.iterrows()]
    lines += ["", "## Cells of the design (`configs/sweep/retrieval_aniso.yaml`) not run in full", "",
              f"Each variant's cell is {RUNS_PER_CELL} runs ({seeds_needed()} seeds × {GRID_CELLS} grid points); a cell "
              "run in part is tested on the runs it has, with less power than the design's.", ""]
    lines += [f"- {line}" for line in unfinished(runs)] or ["None."]
    lines += ["", "![success by kappa](success_by_kappa.png)", ""]
    text = "\n".join(lines)
    write_atomic(out / "report.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quest retrieval-aniso", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="?", help="the sweep's output directory or its archived records")
    parser.add_argument("-o", "--output", type=Path, help="where the report goes (default <runs>/report)")
    parser.add_argument("--plan", action="store_true", help="print the design fixed before the runs and exit")
    args = parser.parse_args(argv)
    if args.plan:
        threshold = success_threshold()
        print("\n".join(plan_lines(threshold, task_table(threshold))))
        return 0
    if args.runs is None:
        parser.error("give the sweep's output directory (or --plan)")
    print(write_report(args.runs, args.output or args.runs / "report"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
