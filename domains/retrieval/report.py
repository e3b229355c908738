"""Figures and tables of the retrieval study, from its run records (``quest ensemble`` or ``quest sweep``
wrote them; ``quest aggregate`` gives the generic tables beside these).

``quest retrieval-report study runs/retrieval_study`` writes into ``runs/retrieval_study/report/``:
``success_heatmaps.png`` (per variant, the success rate in every learning rate × weight decay cell, with its
counts), ``success_rates.png`` (per variant, the success rate over the whole grid with a 95% Wilson interval,
beside the paper's figures), ``key_norms.png`` (the answer token's key norm over training on biased and on
unbiased samples, in one cell of the grid: median over seeds and interquartile band, never pooled over
cells) and ``report.md`` with the numbers; a grid run at several shortcut shares (``data.p_bias``, a task and its
control) gets a section and figures (``*_p_bias<share>.png``) for each; ``--beside RECORDS`` sets another reading's
runs (each variant at its own rate, best checkpoint) beside the grid's, with where each run's validation peaked. A
diverged run counts as a failure; a failed run (an error) is left out and counted. Variants that compute what another
does in this model (``EQUIVALENT``) are listed as such rather than run.

``quest retrieval-report design runs/retrieval_design`` applies the design rule of
``configs/sweep/retrieval_design.yaml``: for each candidate width, the success rate of standard attention
without the shortcut, and the smallest candidate reaching ``RULE_RATE``.

``quest retrieval-report ablations runs/retrieval_ablations`` tabulates the faithful task's factors
(``configs/sweep/retrieval_ablations.yaml``) per variant.

``quest retrieval-report shortcut`` applies the rule for the shortcut's strength (``SHORTCUT_RULE``),
which reads no run: for each candidate ‖b‖, how often the robust rule's oracle and the shortcut's disagree.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from common.attention import VARIANTS  # noqa: E402
from common.figures import save_figure  # noqa: E402
from common.files import MAX_TRAINING_LOG_BYTES, read_table, write_atomic  # noqa: E402
from common.records import RecordError, find_records, read_record  # noqa: E402
from domains.retrieval.config import Data, RetrievalConfig  # noqa: E402
from domains.retrieval.data import shortcut_oracles  # noqa: E402
from domains.retrieval.model import EQUIVALENT  # noqa: E402

RULE_RATE = 0.9  # the design rule: standard attention succeeds in at least this share of runs at p_bias = 0
# The paper's success rates over its learning-rate x weight-decay range (its QKNorm: about 0).
PAPER = {"standard": 0.25, "qnorm": 0.49, "qknorm": 0.0, "quest": 0.58}
NORMS = ("probe/answer_key_norm_biased", "probe/answer_key_norm_unbiased")
# The shortcut-strength rule (``shortcut``): candidate norms of b, and the share of biased samples on which the
# robust rule's oracle and the shortcut's must disagree.
SHORTCUT_NORMS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)
SHORTCUT_RULE = 0.5


def load(root: str | Path) -> pd.DataFrame:
    """One row per retrieval run record under ``root``: variant, seed, grid cell, width, status, scores."""
    rows = []
    for path in find_records(root):
        try:
            record = read_record(path)
        except RecordError:
            continue  # quest aggregate lists broken records; here they are simply not counted
        if record.domain != "retrieval":
            continue
        setting, metrics = record.setting, record.metrics
        rows.append({"variant": record.variant, "seed": record.seed, "status": record.status,
                     "lr": setting("optim.lr"), "wd": setting("optim.weight_decay"), "hidden": setting("model.hidden"),
                     **{key: setting(f"data.{key}") for key in ("p_bias", "bias_norm", "num_tokens", "key_dim")},
                     "kappa": setting("data.answer_kappa", 1.0),  # records from before the key: the isotropic task
                     **{key: setting(f"model.{key}") for key in ("form", "qk_input", "qk_bias")},
                     "acc": metrics.get("test/acc", math.nan), "acc_biased": metrics.get("test/acc_biased", math.nan),
                     "success": metrics.get("test/success", 0.0) == 1.0, "run_dir": str(path.parent),
                     # records from before test_checkpoint were tested at their best checkpoint
                     "epochs": setting("trainer.max_epochs"), "checkpoint": setting("test_checkpoint", "best"),
                     "best_at": record.best_val.evaluation, "evaluations": record.best_val.evaluations,
                     "best_val": math.nan if record.best_val.value is None else record.best_val.value})
    if not rows:
        raise FileNotFoundError(f"no retrieval run records under {root}")
    return pd.DataFrame(rows)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate (NaN without runs)."""
    if n == 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)  # rounding would print 0 as -0.0%


def rates(runs: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of ``by``: finished runs (ok or diverged), successes, rate and its interval, failed runs,
    and the mean test accuracies of the ok runs."""
    table = []
    for key, group in runs.groupby(by, sort=False):
        done = group[group["status"] != "failed"]
        k, n = int(done["success"].sum()), len(done)
        low, high = wilson(k, n)
        table.append({by: key, "runs": n, "successes": k, "rate": k / n if n else math.nan, "low": low, "high": high,
                      "diverged": int((group["status"] == "diverged").sum()),
                      "failed": int((group["status"] == "failed").sum()),
                      "acc": done["acc"].mean(), "acc_biased": done["acc_biased"].mean()})
    return pd.DataFrame(table).set_index(by)


def _variants(runs: pd.DataFrame) -> list[str]:
    """The variants present, in the order ``VARIANTS`` lists them; ablations after them."""
    present = set(runs["variant"])
    return [v for v in VARIANTS if v in present] + sorted(present - set(VARIANTS))


def heatmaps(runs: pd.DataFrame, path: Path) -> Path:
    variants, lrs, wds = _variants(runs), sorted(runs["lr"].unique()), sorted(runs["wd"].unique())
    fig, axes = plt.subplots(1, len(variants), figsize=(3.1 * len(variants), 3.3), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        cells = runs[(runs["variant"] == variant) & (runs["status"] != "failed")]
        counts = cells.groupby(["lr", "wd"])["success"].agg(["sum", "count"])
        rate = np.full((len(lrs), len(wds)), np.nan)
        for (lr, wd), (k, n) in counts.iterrows():
            i, j = lrs.index(lr), wds.index(wd)
            rate[i, j] = k / n
            ax.text(j, i, f"{int(k)}/{int(n)}", ha="center", va="center", fontsize=8,
                    color="white" if k / n < 0.5 else "black")
        ax.imshow(rate, vmin=0, vmax=1, cmap="viridis", origin="lower")
        ax.set_xticks(range(len(wds)), [f"{w:g}" for w in wds], fontsize=7)
        ax.set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.set_xlabel("weight decay")
        ax.set_title(variant, fontsize=10)
    axes[0][0].set_ylabel("learning rate")
    fig.suptitle("success (unbiased test accuracy ≥ threshold): successes/runs per cell", fontsize=10)
    return save_figure(fig, path)


def success_bars(table: pd.DataFrame, paper: dict[str, float], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.3))
    x = np.arange(len(table))
    ax.bar(x, table["rate"], color="tab:blue", label="measured")
    ax.errorbar(x, table["rate"], yerr=[table["rate"] - table["low"], table["high"] - table["rate"]],
                fmt="none", ecolor="black", capsize=4, label="95% Wilson interval")
    if paper:
        ax.scatter(x, [paper.get(v, math.nan) for v in table.index], marker="D", facecolors="none",
                   edgecolors="tab:red", zorder=3, label="paper")
    ax.set_xticks(x, [f"{v}\n(n={n})" for v, n in zip(table.index, table["runs"])], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("success rate over the grid")
    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def key_norm_curves(runs: pd.DataFrame, lr: float, wd: float) -> dict[str, pd.DataFrame]:
    """variant -> per step, the median and quartiles over seeds of both answer key norms in one cell."""
    curves = {}
    cell = runs[np.isclose(runs["lr"], lr) & np.isclose(runs["wd"], wd)]
    for variant, group in cell.groupby("variant"):
        logs = [_read_norms(Path(run_dir) / "metrics.csv").assign(seed=seed)
                for run_dir, seed in zip(group["run_dir"], group["seed"])]
        logs = [log for log in logs if not log.empty]
        if logs:
            data = pd.concat(logs)
            curves[variant] = data.groupby("step")[list(NORMS)].quantile([0.25, 0.5, 0.75]).unstack()
    return curves


def _read_norms(path: Path) -> pd.DataFrame:
    """The answer token's key norms a run's training log holds, a row per step that logged one."""
    if not path.exists():
        return pd.DataFrame()
    log = read_table(path, "training log", MAX_TRAINING_LOG_BYTES)
    if not {"step", *NORMS} <= set(log.columns):
        return pd.DataFrame(columns=["step", *NORMS])
    return log.loc[log[list(NORMS)].notna().any(axis=1), ["step", *NORMS]].astype(float).reset_index(drop=True)


def key_norm_plot(curves: dict[str, pd.DataFrame], lr: float, wd: float, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, stat, kind in zip(axes, NORMS, ("biased", "unbiased")):
        for variant in (v for v in _variants(pd.DataFrame({"variant": list(curves)})) if v in curves):
            table = curves[variant][stat]
            line, = ax.plot(table.index, table[0.5], label=variant, lw=1.3)
            ax.fill_between(table.index, table[0.25], table[0.75], color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(f"answer token, {kind} samples", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_yscale("log")
    axes[0].set_ylabel("key norm ‖W_k x_a + b_k‖")
    if curves:  # archived records keep no training log
        axes[1].legend(fontsize=7)
    fig.suptitle(f"one cell (lr {lr:g}, weight decay {wd:g}): median over seeds, interquartile band", fontsize=10)
    return save_figure(fig, path)


def _fmt(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def _fmt_rate(row) -> str:
    return f"{row['rate']:.1%} [{row['low']:.1%}, {row['high']:.1%}]"


def study(root: Path, out: Path, lr: float, wd: float, earlier: Path | None = None) -> str:
    """The report of a study's grid; a grid run at several shortcut shares (``data.p_bias``: plan 4's task and its
    control) gets a section and figures for each, the shortcut first, never pooled. With ``earlier`` (another
    reading's records), that reading beside this one (``beside``)."""
    runs, earlier_runs = load(root), load(earlier) if earlier is not None else None
    runs = runs.set_index("variant", drop=False).loc[_variants(runs)].reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    shares = sorted(runs["p_bias"].unique(), reverse=True)
    if len(shares) == 1:
        text = "\n".join(_study_lines(runs, root, out, lr, wd, "#", ""))
    else:
        text = "\n".join(["# Mechanism study", "", *(line for share in shares for line in _study_lines(
            runs[runs["p_bias"] == share], root, out, lr, wd, "##", f"_p_bias{share:g}"))])
    if earlier_runs is not None:
        text += "\n" + "\n".join(beside(runs, earlier_runs, earlier, "#" if len(shares) == 1 else "##"))
    write_atomic(out / "report.md", text)
    return text


def _study_lines(runs: pd.DataFrame, root: Path, out: Path, lr: float, wd: float, level: str, tag: str) -> list[str]:
    """One shortcut share's table and figures (``tag`` in their file names where the grid has several)."""
    table = rates(runs, "variant")
    paper = PAPER if (runs["p_bias"] > 0).all() else {}  # the paper's figures are for the task with its shortcut
    figures = {name: f"{name}{tag}.png" for name in ("success_heatmaps", "success_rates", "key_norms")}
    heatmaps(runs, out / figures["success_heatmaps"])
    success_bars(table, paper, out / figures["success_rates"])
    key_norm_plot(key_norm_curves(runs, lr, wd), lr, wd, out / figures["key_norms"])
    if tag:
        title = f"With the shortcut (p_bias = {runs['p_bias'].iloc[0]:g})" if paper else "Control without the shortcut (p_bias = 0)"
    else:
        title = "Mechanism study" if paper else "Mechanism study: control without the shortcut (p_bias = 0)"
    lines = [f"{level} {title}", "", f"{len(runs)} runs from `{root}`: a run succeeds when its unbiased test accuracy "
             "reaches the threshold; diverged runs count as failures, failed runs are left out.", "",
             "| variant | success rate [95% interval] | successes/runs | paper | diverged | failed | "
             "mean acc (unbiased) | mean acc (biased) |", "|---|---|---|---|---|---|---|---|"]
    for variant, row in table.iterrows():
        theirs = f"{paper[variant]:.0%}" if variant in paper else "–"
        lines.append(f"| {variant} | {_fmt_rate(row)} | {int(row['successes'])}/{int(row['runs'])} | {theirs} | "
                     f"{int(row['diverged'])} | {int(row['failed'])} | {_fmt(row['acc'])} | "
                     f"{_fmt(row['acc_biased'])} |")
    lines += [f"| {v} | ≡ {base} (not run) | | | | | | |" for v, base in EQUIVALENT.items()]
    lines += ["", f"![success heatmaps]({figures['success_heatmaps']})", "",
              f"![success rates]({figures['success_rates']})", "", f"![key norms]({figures['key_norms']})", ""]
    return lines


def beside(runs: pd.DataFrame, earlier: pd.DataFrame, earlier_root: Path, level: str) -> list[str]:
    """An earlier reading of the task (plan 3's: each variant at its own tuned rate, tested at its best-validation
    checkpoint) beside this grid's at the same shortcut share, a row per variant and reading: its rates, epochs and
    checkpoint, its success rate and unbiased accuracy, at which of its validations the best came and the unbiased
    validation accuracy there. Those last two are where a best-checkpoint reading tests a run: a run whose validation
    peaks early is read before the shortcut takes over, and the grid's runs, read at their last checkpoint, show by
    how much that peak stands above where they end."""
    runs = runs[runs["p_bias"].isin(earlier["p_bias"].unique())]
    shares = ", ".join(f"{share:g}" for share in sorted(earlier["p_bias"].unique()))
    lines = [f"{level} Beside an earlier reading", "",
             f"The earlier reading's {len(earlier)} runs (`{earlier_root}`) beside this grid's {len(runs)} at the same "
             f"shortcut share (p_bias {shares}). *Best at*: the validation at which the primary metric peaked, median "
             "over runs, of how many each ran; a run tested at its best checkpoint is read there. *Val acc there*: the "
             "unbiased validation accuracy at that peak, mean over runs (a maximum over the run's validations, so a "
             "little optimistic); beside the mean test accuracy of runs read at their last checkpoint, it is what "
             "stopping at the best checkpoint would have read instead.", "",
             "| variant | reading | learning rate | weight decay | epochs | checkpoint | success rate [95% interval] | "
             "mean acc (unbiased) | best at | val acc there |", "|---|---|---|---|---|---|---|---|---|---|"]
    for variant in _variants(pd.concat([earlier, runs])):
        for name, group in (("earlier", earlier), ("this grid", runs)):
            group = group[group["variant"] == variant]
            if group.empty:
                continue
            row = rates(group, "variant").iloc[0]
            done = group[group["status"] != "failed"]
            checkpoints = ", ".join(sorted(set(group["checkpoint"])))
            lines.append(f"| {variant} | {name} | {_span(group['lr'])} | {_span(group['wd'])} | {_span(group['epochs'])} "
                         f"| {checkpoints} | {_fmt_rate(row)} | {_fmt(row['acc'])} | {_evaluation(done)} "
                         f"| {_fmt(done['best_val'].mean())} |")
    return [*lines, ""]


def _span(values: pd.Series) -> str:
    values = sorted(values.unique())
    return f"{values[0]:g}" if len(values) == 1 else f"{values[0]:g}–{values[-1]:g} ({len(values)} values)"


def _evaluation(runs: pd.DataFrame) -> str:
    known = runs.dropna(subset=["best_at", "evaluations"])
    if known.empty:
        return "–"
    return f"{known['best_at'].median():g} of {known['evaluations'].median():g}"


def design(root: Path, out: Path) -> str:
    table = rates(load(root).sort_values("hidden"), "hidden")
    chosen = next((hidden for hidden, row in table.iterrows() if row["rate"] >= RULE_RATE), None)
    lines = ["# Mechanism study: the design rule", "",
             f"Standard attention without the shortcut (p_bias = 0); rule: the smallest readout-MLP width whose runs "
             f"succeed in at least {RULE_RATE:.0%} of the grid.", "",
             "| model.hidden | success rate [95% interval] | successes/runs | mean acc | passes |",
             "|---|---|---|---|---|"]
    lines += [f"| {hidden} | {_fmt_rate(row)} | {int(row['successes'])}/{int(row['runs'])} | {row['acc']:.3f} | "
              f"{'yes' if row['rate'] >= RULE_RATE else 'no'} |" for hidden, row in table.iterrows()]
    lines += ["", f"Chosen: model.hidden = {chosen}." if chosen is not None else "No candidate passes.", ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "design.md", text)
    return text


def shortcut_rule(data: Data) -> tuple[list[dict], float | None]:
    """The rule for the shortcut's strength (``SHORTCUT_RULE``) applied to the task ``data``: for each
    candidate ‖b‖, the two oracles of ``shortcut_oracles`` on biased samples, and the norm chosen (None if
    no candidate passes)."""
    table = [shortcut_oracles(data, norm) for norm in SHORTCUT_NORMS]
    conflicting = [row["bias_norm"] for row in table if row["disagree"] >= SHORTCUT_RULE]
    return table, max(conflicting) if conflicting else None


def shortcut_lines(table: list[dict]) -> list[str]:
    lines = ["| ‖b‖ | largest-norm oracle acc | nearest-to-b oracle acc | oracles disagree |", "|---|---|---|---|"]
    return lines + [f"| {row['bias_norm']:g} | {row['largest_norm_acc']:.3f} | {row['nearest_b_acc']:.3f} | "
                    f"{row['disagree']:.3f} |" for row in table]


def shortcut(out: Path) -> str:
    """The shortcut rule applied to the task as configured by default, as ``shortcut.md``."""
    data = Data()
    table, chosen = shortcut_rule(data)
    lines = ["# Mechanism study: the shortcut's strength", "",
             f"Rule, fixed before any variant is compared: the largest ‖b‖ among {', '.join(map(str, SHORTCUT_NORMS))} "
             f"at which the largest-norm-token oracle and the nearest-to-b oracle pick different tokens on at least "
             f"{SHORTCUT_RULE:.0%} of biased samples (the strongest shortcut that still conflicts with the robust rule "
             f"on most of them). {data.num_tokens} tokens, {data.key_dim} key dimensions, answer std "
             f"{data.answer_std}, bias std {data.bias_std}; 20,000 biased samples per row.", "",
             *shortcut_lines(table)]
    lines += ["", f"Chosen: data.bias_norm = {chosen:g}." if chosen is not None else "No candidate passes.", ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "shortcut.md", text)
    return text


def ablations(root: Path, out: Path) -> str:
    """The faithful task's factors (``configs/sweep/retrieval_ablations.yaml``): per variant and each
    combination of the q/k projections' input and biases, the success rate over the grid with its Wilson
    interval and the mean test accuracies, unbiased and biased."""
    runs = load(root)
    runs["cell"] = [f"q, k from {'x^k' if i == 'key' else 'the whole token'}, {'with' if b else 'no'} bias"
                    for i, b in zip(runs["qk_input"], runs["qk_bias"])]
    lines = ["# Mechanism study: what the faithful task's factors do", "",
             f"{len(runs)} runs from `{root}`, each variant and cell over the study's grid (4 learning rates × 4 weight "
             "decays × 13 seeds).", "",
             "| variant | q and k | success rate [95% interval] | successes/runs | mean acc (unbiased) | mean acc (biased) |",
             "|---|---|---|---|---|---|"]
    for variant in _variants(runs):
        table = rates(runs[runs["variant"] == variant], "cell")
        lines += [f"| {variant} | {cell} | {_fmt_rate(row)} | {int(row['successes'])}/{int(row['runs'])} | "
                  f"{_fmt(row['acc'])} | {_fmt(row['acc_biased'])} |" for cell, row in table.sort_index().iterrows()]
    text = "\n".join([*lines, ""])
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "ablations.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    defaults = RetrievalConfig(domain="retrieval").optim
    parser = argparse.ArgumentParser(prog="quest retrieval-report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("study", "design", "ablations", "shortcut"))
    parser.add_argument("runs", type=Path, nargs="?", help="the sweep's output directory (study, design)")
    parser.add_argument("-o", "--output", type=Path, help="where the report goes (default <runs>/report)")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="the cell of the key-norm curves")
    parser.add_argument("--wd", type=float, default=defaults.weight_decay, help="the cell of the key-norm curves")
    parser.add_argument("--beside", type=Path, metavar="RECORDS",
                        help="study: another reading's run records (plan 3's confirmation) to set beside this grid")
    args = parser.parse_args(argv)
    if args.what == "shortcut":
        print(shortcut(args.output or Path("runs/retrieval_shortcut")))
        return 0
    if args.runs is None:
        parser.error(f"{args.what} needs the sweep's output directory")
    out = args.output or args.runs / "report"
    report = {"study": lambda: study(args.runs, out, args.lr, args.wd, args.beside), "design": lambda: design(args.runs, out),
              "ablations": lambda: ablations(args.runs, out)}[args.what]
    print(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
