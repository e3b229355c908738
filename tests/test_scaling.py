"""`quest scaling`: learning curves from tested snapshots, the paired difference to standard at each length and
width, its change with width, and the probes along training."""
import pandas as pd
import pytest
from conftest import make_record
from scipy.stats import t as t_dist
from scipy.stats import ttest_1samp

from common.records import write_record
from runners.cli import main as cli
from runners.results.learning_curves import _band, curve_points, delta_table, differences, probe_table, width_changes


def write_curves(root):
    """Two widths, two seeds; quest's accuracy is 0.1 above standard's at step 10 and equal at step 20."""
    for width in (8, 16):
        for variant in ("standard", "quest"):
            for seed in (0, 1, 2):
                curve = [{"fraction": f, "step": step, "metrics": {"test/acc": acc + 0.01 * seed * (variant == "quest")}}
                         for f, step, acc in ((0.5, 10, 0.5 + 0.1 * (variant == "quest")), (1.0, 20, 0.8))]
                trajectory = {"step": [0, 10], "layers": {"l0": {"max_logit": [1.0, 2.0], "q_norm_max": [1.0, 3.0],
                                                                 "k_norm_max": [1.0, 1.5]}}}
                write_record(root / f"{width}-{variant}-{seed}", make_record(
                    variant, seed, {"acc": 0.8}, domain="vision", config={"model": {"dim": width}},
                    primary_metric="acc", mode="max", curve=curve, trajectory=trajectory))


def test_differences_are_paired_by_seed_at_each_length_and_width(tmp_path):
    write_curves(tmp_path)
    table = differences(curve_points(tmp_path), "acc").set_index(["width", "step", "variant"])
    assert table.loc[(8, 10, "quest"), "diff"] == pytest.approx(0.11)
    assert table.loc[(16, 20, "quest"), "diff"] == pytest.approx(0.01)
    assert table.loc[(8, 10, "quest"), "n"] == 3


def test_the_report_has_curves_probes_and_the_delta_table(tmp_path):
    write_curves(tmp_path / "runs")
    out = tmp_path / "report" / "SCALING.md"
    assert cli(["scaling", str(tmp_path / "runs"), "-o", str(out)]) == 0
    text = out.read_text()
    assert "## Scaling: vision" in text and "![scaling vision](scaling_vision.png)" in text
    assert (out.parent / "scaling_vision.png").stat().st_size > 0
    assert "| 8       | 10     | +0.11 ± 0.025 (p=0.0027, MDE 0.031) |" in text  # diffs 0.10, 0.11, 0.12
    assert "max_logit peak" in text
    assert "| 8 → 16   | 10     | +0 ± 0 (p=1, MDE –) |" in text  # the same gain at both widths: no spread, no MDE


def test_the_width_interaction_is_the_change_of_each_seeds_paired_difference():
    """Standard's accuracy differs by seed and width; quest is 0.10, 0.12, 0.11 above it at width 8 and 0.20,
    0.15, 0.25 at width 16 (seeds 0, 1, 2): per seed its gain grows by 0.10, 0.03, 0.14, tested over the seeds."""
    gains = {8: [0.10, 0.12, 0.11], 16: [0.20, 0.15, 0.25]}
    standard = {8: [0.5, 0.55, 0.6], 16: [0.4, 0.42, 0.44]}
    rows = [{"domain": "vision", "width": width, "step": 10, "seed": seed, "variant": variant, "primary": "acc",
             "mode": "max", "acc": standard[width][seed] + (variant == "quest") * gains[width][seed]}
            for width in (8, 16) for seed in range(3) for variant in ("standard", "quest")]
    points = pd.DataFrame(rows)
    found = width_changes(points, "acc").set_index(["widths", "variant"]).loc[("8 → 16", "quest")]
    change = [0.10, 0.03, 0.14]
    half = t_dist.ppf(0.975, 2) * pd.Series(change).std() / 3 ** 0.5
    assert found["diff"] == pytest.approx(0.09) and found["half"] == pytest.approx(half) and found["n"] == 3
    assert found["p"] == pytest.approx(ttest_1samp(change, 0.0).pvalue)
    row = delta_table(points, "acc", by="widths").splitlines()[2]
    assert row.startswith("| 8 → 16 ") and f"+0.09 ± {half:.2g} (p={found['p']:.2g}" in row
    points["mode"] = "min"  # the same numbers as a loss, where lower is better: the sign turns
    assert width_changes(points, "acc")["diff"].iloc[0] == pytest.approx(-0.09)


def test_runs_without_curves_are_a_clear_error(tmp_path):
    write_record(tmp_path / "a", make_record("standard", 0, {"acc": 0.5}))
    with pytest.raises(FileNotFoundError, match="has a tested curve"):
        curve_points(tmp_path)


def test_probe_bands_span_the_seeds_and_accuracy_bands_stay_in_range():
    data = pd.DataFrame({"step": [1, 1, 1], "max_logit": [2.0, 5.0, 40.0], "acc": [0.5, 0.99, 0.98]})
    low, mean, high = _band(data.groupby("step")["max_logit"], "max_logit")
    assert (low[1], high[1]) == (2.0, 40.0) and mean[1] == pytest.approx(47 / 3)
    low, mean, high = _band(data.groupby("step")["acc"], "acc")
    assert 0 <= low[1] < mean[1] and high[1] == 1.0  # the t-interval over three seeds passes 1


def test_the_probe_table_gives_each_probe_peak_and_end_per_width_and_variant():
    rows = [{"domain": "vision", "width": 8, "variant": variant, "seed": seed, "step": step, "max_logit": logit,
             "q_norm_max": 1.0, "k_norm_max": 1.0}
            for variant in ("quest", "standard") for seed in (0, 1)
            for step, logit in ((0, 1.0), (10, 50.0 + seed), (20, 5.0 + seed))]
    header, _, first, second = probe_table(pd.DataFrame(rows), "vision").splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in (header, first, second)]
    assert cells[0][:4] == ["width", "variant", "max_logit peak", "max_logit end"]
    assert cells[1][:4] == ["8", "standard", "51", "6"]  # standard first, the peak over seeds and steps
    assert cells[2][1] == "quest"
