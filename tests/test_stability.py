"""`quest stability` from hand-written records: learning-rate sensitivity as Wortsman et al. define it
(clipped at the initial loss), divergence counts per learning rate, and its report with both figures."""
import math

import pytest
from conftest import make_record

from common.records import write_record
from runners.cli import main as cli
from runners.results import lr_sensitivity as stability

LRS = (1e-3, 1e-2, 1e-1)


def lr_record(variant, seed, lr, final, status="ok"):
    trajectory = {"step": [1, 6], "layers": {"encoder.layers.0.attn": {"max_logit": [2.0, 3.0 * lr * 100]}}}
    return make_record(variant, seed, {"loss": final}, status=status, config={"optim": {"lr": lr}},
                       losses={"train_first": 2.0, "val_final": final}, trajectory=trajectory)


def write_sweep(root, finals):
    """finals: {(variant, seed): [final loss per lr in LRS]}; NaN marks a diverged run."""
    for (variant, seed), values in finals.items():
        for lr, final in zip(LRS, values):
            status = "diverged" if math.isnan(final) else "ok"
            write_record(root / f"{variant}-{seed}-{lr}", lr_record(variant, seed, lr, final, status))


def test_lr_sensitivity_clips_at_the_initial_loss_and_counts_divergence(tmp_path):
    write_sweep(tmp_path, {
        ("standard", 0): [1.0, 0.5, math.nan],  # diverged at the top: counts as the initial loss, 2.0
        ("standard", 1): [1.0, 0.5, 3.0],       # ended above its initial loss: clipped to 2.0
        ("quest", 0): [0.9, 0.6, 0.7],
        ("quest", 1): [0.8, 0.6, 0.7],
    })
    runs = stability.load_lr_runs(tmp_path)
    table = stability.lr_sensitivity(runs)
    # standard: mean(1.0, 0.5, 2.0) - 0.5 = 0.6667 for both seeds; quest: 0.7333 - 0.6 and 0.7 - 0.6.
    assert table.loc["standard", "lr_sensitivity"] == pytest.approx(3.5 / 3 - 0.5)
    assert table.loc["standard", "spread"] == pytest.approx(0.0)
    assert table.loc["quest", "lr_sensitivity"] == pytest.approx(((2.2 / 3 - 0.6) + (2.1 / 3 - 0.6)) / 2)
    divergence = stability.divergence_summary(runs)
    assert divergence["standard"] == "1/6 (0.1: 1/2)" and divergence["quest"] == "0/6"


def test_a_seed_counts_only_with_a_finished_run_at_every_rate(tmp_path):
    """As the confirmatory endpoint counts it: a seed still short of a rate, or with a failed run, would be read
    over the other rates (here, without the one where standard broke)."""
    write_sweep(tmp_path, {("standard", 0): [1.0, 0.5, math.nan], ("quest", 0): [0.9, 0.6, 0.7],
                           ("quest", 1): [0.8, 0.6, 0.7]})
    write_record(tmp_path / "standard-1-0.001", lr_record("standard", 1, 1e-3, 1.0))  # seed 1 still running
    write_record(tmp_path / "standard-1-0.01", lr_record("standard", 1, 1e-2, 0.5))
    for lr, status in zip(LRS, ("ok", "ok", "failed")):
        write_record(tmp_path / f"qk_layernorm-0-{lr}", lr_record("qk_layernorm", 0, lr, 0.5, status))
    table = stability.lr_sensitivity(stability.load_lr_runs(tmp_path))
    assert table.loc["standard", ["lr_sensitivity", "seeds"]].tolist() == [pytest.approx(3.5 / 3 - 0.5), 1]
    assert table.loc["quest", "seeds"] == 2 and table.loc["qk_layernorm", "seeds"] == 0
    assert math.isnan(table.loc["qk_layernorm", "lr_sensitivity"])


def test_report_has_a_table_and_both_figures(tmp_path):
    write_sweep(tmp_path / "runs", {("standard", 0): [1.0, 0.5, math.nan], ("quest", 0): [0.9, 0.6, 0.7]})
    out = tmp_path / "report" / "STABILITY.md"
    out.parent.mkdir()
    assert cli(["stability", str(tmp_path / "runs"), "-o", str(out)]) == 0
    text = out.read_text()
    assert "| standard | 0.6667 | – | 1 | 1/3 (0.1: 1/1) | 0.1 (best 0.01) |" in text and "| quest | 0.1333 | – | 1 | 0/3 |" in text
    assert text.index("| standard |") < text.index("| quest |")  # the project's variant order
    # peak logit at every learning rate: max over steps of [2, 300 x lr]
    assert text.count("| variant | lr 0.001 | lr 0.01 | lr 0.1 |") == 3 and "| quest | 2 | 3 | 30 |" in text
    assert "| standard | 1 | 0.5 | 2 |" in text  # median final losses; the diverged run counts as its initial 2.0
    for name in ("final_loss", "max_logit"):
        image = f"STABILITY_figures/stability_a_d_study_{name}.png"
        assert f"]({image})" in text and (out.parent / image).stat().st_size > 1000


def test_a_sweep_over_widths_gets_a_section_and_a_panel_per_width_and_the_records_peaks(tmp_path):
    standard = {64: [1.0, 0.5, 3.0], 128: [0.5, 0.9, 3.0]}  # the wider one breaks at a lower rate
    for dim in (64, 128):
        for variant, finals in (("standard", standard[dim]), ("quest", [0.9, 0.6, 0.65])):
            for seed in (0, 1):
                for lr, final in zip(LRS, finals):
                    record = lr_record(variant, seed, lr, final + 0.01 * seed)
                    record.config = {"optim": {"lr": lr}, "model": {"dim": dim}}
                    record.probes = {"peak_max_logit": 1000.0 * lr, "peak_q_norm_max": dim * lr}  # beyond the trajectory's
                    write_record(tmp_path / "runs" / f"{variant}-{seed}-{lr}-{dim}", record)
    runs = stability.load_lr_runs(tmp_path / "runs")
    assert set(runs["setting"]) == {"model.dim=64", "model.dim=128"}
    assert runs.loc[(runs["lr"] == 0.1), "peak_logit"].tolist() == pytest.approx([100.0] * 8)
    out = tmp_path / "STABILITY.md"
    assert cli(["stability", str(tmp_path / "runs"), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.index("### model.dim=64") < text.index("### model.dim=128")
    # standard's sensitivity: mean(1, 0.5, 2) - 0.5 at seed 0 (3.0 clipped to the initial 2.0), 0.01 less at seed 1
    assert "| standard | 0.665 ± 0.021 | 0.0024 | 2 | 0/6 |" in text
    assert "| quest | 0.064 | 0.64 | 6.4 |" in text  # the peak query norm the record keeps, width 64
    # where each breaks (first rate more than 0.1 above its best, median over seeds), across the widths
    assert "| variant | model.dim=64 | model.dim=128 |" in text
    assert "| standard | 0.1 (best 0.01) | 0.01 (best 0.001) |" in text and "| quest | – (best 0.01) | – (best 0.01) |" in text
    for name in ("final_loss", "peak_logit", "peak_q_norm", "max_logit"):
        assert (tmp_path / "STABILITY_figures" / f"stability_a_d_study_{name}.png").stat().st_size > 1000
