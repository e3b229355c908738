"""The run counts the hand-written readings state are the archive's: each "the N runs its plan registers" in
RESULTS/notes.md and "N runs in ..." beside a plan in README.md is counted from the records under RESULTS/records."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
PLAN_RECORDS = {"preregistration-2.md": ROOT / "RESULTS" / "records" / "confirm2",
                "preregistration-3.md": ROOT / "RESULTS" / "records" / "confirm3"}  # each plan's archived runs


def archived(folder: Path) -> int:
    """The plan's runs: every record under its folder but the selection stage's."""
    return sum("select" not in path.relative_to(folder).parts for path in folder.rglob("record.json"))


@pytest.mark.parametrize("plan, folder", PLAN_RECORDS.items())
def test_the_run_counts_in_the_prose_are_the_records(plan, folder):
    count = archived(folder)
    notes = (ROOT / "RESULTS" / "notes.md").read_text()
    stated = re.findall(rf"`RESULTS/{re.escape(plan)}`\) is complete: the ([\d,]+) runs its plan registers", notes)
    readme = re.findall(rf"`RESULTS/{re.escape(plan)}`: ([\d,]+) runs", (ROOT / "README.md").read_text())
    assert stated and readme, f"the notes and the README no longer state {plan}'s run count where this test reads it"
    assert {int(n.replace(",", "")) for n in stated + readme} == {count}


def records(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in folder.rglob("record.json")]


def paired(left: dict, right: dict) -> tuple[float, float, float, float]:
    """Mean, 95% interval and p of left − right over their common seeds (points: × 100)."""
    diff = np.array([left[s] - right[s] for s in sorted(set(left) & set(right))]) * 100
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    return diff.mean(), diff.mean() - half, diff.mean() + half, stats.ttest_1samp(diff, 0).pvalue


def test_the_segmentation_budget_the_prose_states_is_the_records():
    """'0.545 at 8, 0.723 at 16, 0.812 at 32': mean best validation mIoU of the budget runs, no plateau."""
    by_length = {}
    for record in records(ROOT / "RESULTS" / "records" / "budget" / "segmentation"):
        by_length.setdefault(record["config"]["trainer"]["max_epochs"], []).append(record["best_val"]["value"])
    stated = ", ".join(f"{np.mean(by_length[n]):.3f} at {n}" for n in (8, 16)) + f", {np.mean(by_length[32]):.3f} at 32"
    assert stated == "0.545 at 8, 0.723 at 16, 0.812 at 32"
    for text in ((ROOT / "README.md").read_text(), (ROOT / "RESULTS" / "notes.md").read_text()):
        assert stated in " ".join(text.split())


def test_the_vision_selection_gap_and_the_pgd_interval_the_prose_states_are_the_records():
    folder = ROOT / "RESULTS" / "records" / "confirm3" / "vision"
    chosen = {}
    pgd = {}
    for record in records(folder):
        if record["status"] != "ok":
            continue
        if record["seed"] < 500:  # the selection stage: validation accuracy at each rate
            chosen.setdefault((record["variant"], round(record["config"]["optim"]["lr"], 6)), {})[record["seed"]] = \
                record["best_val"]["value"]
        elif record["variant"] in ("quest", "standard") and record["seed"] <= 547:
            pgd.setdefault(record["variant"], {})[record["seed"]] = record["robustness"]["acc_pgd_eps0.02"]
    mean, low, high, p = paired(chosen[("quest", 0.009)], chosen[("standard", 0.009)])
    notes = " ".join((ROOT / "RESULTS" / "notes.md").read_text().split())
    assert f"at 0.009 QUEST − standard is {mean:+.2f} points (95% interval {low:.2f} to {high:+.2f}, p = {p:.2f})" \
        .replace("-", "−") in notes
    mean, low, high, _ = paired(pgd["quest"], pgd["standard"])
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"({mean:+.2g} ± {high - mean:.2f}, an interval of {low:.2f} to {high:+.2f} points".replace("-", "−") in readme


def stability_runs(sweep: str) -> pd.DataFrame:
    """Plan 4's runs of one sweep, a row each: the final validation loss, clipped to the initial training loss where
    the run diverged or ended above it, and the peak logit and query norm."""
    rows = []
    for record in records(ROOT / "RESULTS" / "records" / "stability4" / sweep):
        initial, final = record["losses"]["train_first"], record["losses"].get("val_final", np.nan)
        bad = record["status"] != "ok" or not np.isfinite(final) or final > initial
        rows.append({"variant": record["variant"], "seed": record["seed"], "dim": record["config"]["model"]["dim"],
                     "lr": record["config"]["optim"]["lr"], "status": record["status"], "loss": initial if bad else final,
                     "logit": record["probes"]["peak_max_logit"], "q_norm": record["probes"]["peak_q_norm_max"]})
    return pd.DataFrame(rows)


def test_the_stability_numbers_the_prose_states_are_the_records():
    """Plan 4's language readings in README.md and RESULTS/notes.md, recomputed from the raw records: Wortsman et al.'s
    LR sensitivity (per seed, the mean over the rates of the final validation loss, clipped to the initial training
    loss where a run diverged or ended above it, less the best of them; then the mean over seeds), the peak logits
    and query norms at lr 1 (median over seeds) and standard's divergences."""
    runs = stability_runs("language")
    assert len(runs) == 648
    per_seed = runs.groupby(["variant", "dim", "seed"])["loss"].agg(lambda loss: loss.mean() - loss.min())
    sensitivity = per_seed.groupby(["variant", "dim"]).mean()
    readme, notes = (" ".join(path.read_text().split()) for path in (ROOT / "README.md", ROOT / "RESULTS" / "notes.md"))

    def at(variant: str, digits: int) -> list[str]:
        return [f"{sensitivity[variant, dim]:.{digits}f}" for dim in (64, 128, 256)]

    quest, standard, layernorm = at("quest", 2), at("standard", 2), at("qk_layernorm", 2)
    assert ", ".join(f"{q} vs {s}" for q, s in zip(quest, standard)) in readme
    assert f"higher than QK-layernorm's at all three ({', '.join(layernorm)}" in readme
    quest, standard, layernorm = at("quest", 3), at("standard", 3), at("qk_layernorm", 3)
    assert (f"{quest[0]} against {standard[0]} at width 64, {quest[1]} against {standard[1]} at 128, {quest[2]} "
            f"against {standard[2]} at 256") in notes
    assert f"{', '.join(layernorm)} against QUEST's {', '.join(quest)}" in notes
    top = runs[runs["lr"] == 1.0].groupby(["variant", "dim"])[["logit", "q_norm"]].median()
    logits = ", ".join(f"{top.at[('quest', dim), 'logit']:.1e}" for dim in (64, 128, 256)).replace("e+0", "e")
    assert f"QUEST's {logits.rsplit(', ', 1)[0]} and {logits.rsplit(', ', 1)[1]}" in notes
    diverged = runs[runs["status"] == "diverged"]
    assert set(diverged["variant"]) == {"standard"} and set(diverged["dim"]) == {128} and set(diverged["lr"]) == {1.0}
    assert len(diverged) == 6 and "diverged (on the loss) in 6 of 9 seeds at lr 1, QUEST never" in notes


def test_the_vision_stability_numbers_the_notes_state_are_the_records():
    """Plan 4's vision readings in RESULTS/notes.md: LR sensitivity as above, recomputed from the raw records."""
    runs = stability_runs("vision")
    assert len(runs) == 320
    per_seed = runs.groupby(["variant", "seed"])["loss"].agg(lambda loss: loss.mean() - loss.min())
    sensitivity = {variant: f"{value:.3f}" for variant, value in per_seed.groupby("variant").mean().items()}
    notes = " ".join((ROOT / "RESULTS" / "notes.md").read_text().split())
    assert f"QUEST's LR sensitivity {sensitivity['quest']} against standard's {sensitivity['standard']}" in notes
    assert f"against QK-layernorm's {sensitivity['qk_layernorm']}" in notes
    assert f"least sensitive ({sensitivity['qknorm']})" in notes


def test_the_mechanism_numbers_the_notes_state_are_the_records():
    """Plan 4's mechanism readings in RESULTS/notes.md, from the raw records: successes (unbiased test accuracy at
    the task's threshold) per variant with the shortcut and without, QUEST's accuracy against standard's over the
    grid with the shortcut (the mean over its cells per seed, paired by seed), and how far the validation peak
    stands above the last checkpoint's test accuracy."""
    rows = [{"variant": r["variant"], "seed": r["seed"], "p_bias": r["config"]["data"]["p_bias"], "status": r["status"],
             "acc": r["metrics"]["test/acc"], "peak": r["best_val"]["value"],
             "success": r["metrics"]["test/acc"] >= r["config"]["task"]["success_threshold"]}
            for r in records(ROOT / "RESULTS" / "records" / "stability4" / "retrieval")]
    runs = pd.DataFrame(rows)
    assert len(runs) == 512 and set(runs["status"]) == {"ok"}
    notes = " ".join((ROOT / "RESULTS" / "notes.md").read_text().split())
    shortcut, control = runs[runs["p_bias"] == 0.5], runs[runs["p_bias"] == 0.0]
    assert not shortcut["success"].any() and (shortcut["peak"] < 0.9).all()
    assert set(shortcut.groupby("variant").size()) == {64} and "no variant succeeded in any of its 64 runs" in notes
    won = control.groupby("variant")["success"].sum()
    assert (f"standard succeeded in {won['standard']} of 64 runs, QUEST in {won['quest']}, QKNorm in {won['qknorm']} "
            f"and QK-layernorm in {won['qk_layernorm']}") in notes
    per_seed = shortcut.groupby(["variant", "seed"])["acc"].mean().unstack(0)
    mean, low, _, _ = paired(per_seed["quest"].to_dict(), per_seed["standard"].to_dict())
    assert f"+{mean:.1f} ± {mean - low:.1f} points above standard's" in notes
    above = (shortcut.groupby("variant")["peak"].mean() - shortcut.groupby("variant")["acc"].mean()).max()
    assert f"at most {above:.3f} above its test accuracy" in notes
