"""`quest aggregate` from hand-written records (no training): schema checks of metric values, skipping and
listing bad records, one table and one set of plots per (domain, dataset, preset), bold only where a column
has a best."""
import json
import logging
import math
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import make_record as record
from conftest import record_json
from pydantic import ValidationError
from scipy.stats import t as t_dist
from scipy.stats import ttest_rel

from common.records import RecordError, read_record, write_record
from runners.cli import main as cli
from runners.commands import aggregate
from runners.results import frame as results_runs
from runners.results import stats, tables


def write_runs(root, runs):
    """``runs``: (variant, seed, metrics, extra record fields); one run directory each under ``root``."""
    for variant, seed, metrics, fields in runs:
        name = f"{fields.get('domain', 'a')}-{fields.get('dataset', 'd')}-{variant}-{seed}"
        write_record(root / name, record(variant, seed, metrics, **fields))


def ablation(seeds, value=10.0, **fields):
    """`uniform` runs far from every variant on each seed: attention matters, so the table can be ranked (a table
    without its own ablation cannot show that, and is not)."""
    metric = "acc" if fields.get("mode") == "max" else "mse"
    return [("uniform", seed, {metric: value + 0.01 * seed}, fields) for seed in seeds]


def sections(text):
    """Markdown section title -> its body."""
    return {part.split("\n", 1)[0]: part for part in text.split("\n## ")[1:]}


@pytest.mark.parametrize("field", ["metrics", "probes", "robustness"])
@pytest.mark.parametrize("bad", ["0.5", True, None])
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the bad value is written out before it is refused
def test_schema_rejects_a_non_number_naming_file_field_and_key(tmp_path, field, bad):
    rec = record("quest", 0, {"mse": 1.0}, robustness={"acc_pgd_eps0.1": 0.5})
    with pytest.raises(ValidationError, match=rf"{field}\.x/y"):  # refused when set
        setattr(rec, field, {**getattr(rec, field), "x/y": bad})
    getattr(rec, field)["x/y"] = bad  # or set in place: refused when written
    with pytest.raises(RecordError, match=rf"record\.json: field '{field}' key 'x/y' is {re.escape(repr(bad))} "):
        write_record(tmp_path, rec)
    data = record_json("quest", 0, {"mse": 1.0}, robustness={"acc_pgd_eps0.1": 0.5})
    data[field] = {**data[field], "x/y": bad}
    (tmp_path / "record.json").write_text(json.dumps(data))  # one written by other means is rejected on reading
    with pytest.raises(RecordError) as err:
        read_record(tmp_path)
    assert err.value.path == str(tmp_path / "record.json") and f"'{field}' key 'x/y'" in err.value.reason


def test_schema_accepts_nan_inf_and_numpy_numbers(tmp_path):
    rec = record("quest", 0, {"mse": math.nan, "mae": -math.inf, "n": 3, "acc": np.float32(0.25)},
                 robustness={"acc_clean": math.nan})
    back = read_record(write_record(tmp_path, rec))
    assert math.isnan(back.metrics["test/mse"]) and back.metrics["test/mae"] == -math.inf
    assert back.metrics["test/acc"] == 0.25 and math.isnan(back.robustness["acc_clean"]) and back.metrics["test/n"] == 3


def test_a_non_numeric_metric_is_skipped_listed_and_the_rest_aggregated(tmp_path, caplog):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {}),
                      ("quest", 1, {"mse": 3.0}, {})])
    bad = runs / "a-d-quest-1" / "record.json"
    bad.write_text(bad.read_text().replace('"test/mse": 3.0', '"test/mse": "0.5"'))
    (runs / "empty").mkdir()
    (runs / "empty" / "record.json").write_text("[]")
    with caplog.at_level(logging.WARNING, logger="common.records"):
        assert aggregate.main([str(runs), "-o", str(out), "--no-plots"]) == 0
    reason = "field 'metrics' key 'test/mse' is '0.5' (str), not a number"
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2 and reason in caplog.text
    text = out.read_text()
    assert "2 run records aggregated, 2 skipped (listed at the end)" in text
    assert f"- `{bad}`: {reason}" in text and f"- `{runs / 'empty' / 'record.json'}`: not a JSON object" in text
    table = sections(text)["a / d / study"]
    assert re.search(r"\| quest +\| \*\*1\*\* +\|", table)  # quest's one readable run, the better of two
    assert len((tmp_path / "R" / "runs.csv").read_text().splitlines()) == 1 + 2


def test_a_record_that_is_not_utf8_is_skipped_and_listed(tmp_path, caplog):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {})])
    bad = runs / "utf16" / "record.json"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff\xfe" + json.dumps(record_json("quest", 1, {"mse": 3.0})).encode("utf-16-le"))
    reason = "not UTF-8 text (byte 0xff at offset 0)"
    with pytest.raises(RecordError, match=re.escape(f"{bad}: {reason}")):
        read_record(bad)
    with caplog.at_level(logging.WARNING, logger="common.records"):
        assert aggregate.main([str(runs), "-o", str(out), "--no-plots"]) == 0
    assert f"skipping {bad}: {reason}" in caplog.text
    text = out.read_text()
    assert "2 run records aggregated, 1 skipped (listed at the end)" in text and f"- `{bad}`: {reason}" in text


def test_a_record_under_two_of_the_roots_is_read_and_warned_about_once(tmp_path, caplog):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {})])
    (runs / "bad").mkdir()
    (runs / "bad" / "record.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="common.records"):
        assert aggregate.main([str(runs), str(runs / "bad"), str(runs / "a-d-quest-0"), "-o", str(out), "--no-plots"]) == 0
    assert caplog.text.count("skipping") == 1
    assert "2 run records aggregated, 1 skipped" in out.read_text()


def test_a_warning_of_the_tables_is_shown_once(tmp_path, recwarn):
    runs = tmp_path / "runs"
    # A trivial baseline that is already perfect leaves no gap to close: learns() divides by zero, for every table
    # that asks (the cross-domain ranks, the verdicts, the table's own section).
    write_runs(runs, [(variant, seed, {"mse": 1.0 + seed, "mse_baseline": 0.0}, {})
                      for variant in ("standard", "quest") for seed in (0, 1)])
    assert aggregate.main([str(runs), "-o", str(tmp_path / "R.md"), "--no-plots"]) == 0
    divisions = [str(w.message) for w in recwarn if "divide by zero" in str(w.message)]
    assert len(divisions) == 1, divisions


def test_only_bad_records_is_a_user_error(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "record.json").write_text("{")
    assert cli(["aggregate", str(tmp_path), "-o", str(tmp_path / "R.md")]) == 2
    assert "no readable run records" in capsys.readouterr().err and not (tmp_path / "R.md").exists()


def test_two_datasets_of_a_domain_get_their_own_table_and_plots(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    values = {"d1": {"standard": 1.0, "quest": 2.0}, "d2": {"standard": 8.0, "quest": 4.0}}
    write_runs(runs, [(v, seed, {"mse": x}, {"dataset": d}) for d, by_variant in values.items()
                      for v, x in by_variant.items() for seed in (0, 1)])
    write_runs(runs, [row for d in values for row in ablation((0, 1), dataset=d)])
    for d, by_variant in values.items():  # probe logs, so each group gets its probe figure too
        for v, x in by_variant.items():
            (runs / f"a-{d}-{v}-0" / "metrics.csv").write_text(f"step,probe/max_logit\n0,{x}\n10,{2 * x}\n")
    assert aggregate.main([str(runs), "-o", str(out)]) == 0
    text, found = out.read_text(), sections(out.read_text())
    images = {d: [f"R/a_{d}_study_mse.png", f"R/a_{d}_study_probes.png"] for d in values}
    for d, other in (("d1", "d2"), ("d2", "d1")):
        body = found[f"a / {d} / study"]
        assert all(f"({image})" in body and text.count(f"({image})") == 1 for image in images[d])
        assert not any(image in body for image in images[other])
    pngs = [(tmp_path / image).read_bytes() for d in values for image in images[d]]
    assert len(set(pngs)) == 4  # distinct figures, not one drawn from both datasets' runs
    summary = tables.summary_table(results_runs.load_runs(runs))
    assert summary.loc["quest", "rank a/d1 (study)"] == "2" and summary.loc["quest", "rank a/d2 (study)"] == "1"
    assert summary.loc["quest", "mean rank"] == "1.50"


def test_bold_marks_the_best_unless_every_variant_ties(tmp_path):
    # success: all 0; acc: equal means (0.4, 0.6 vs 0.5, 0.5); mae: two share the best; mse: one best.
    per_variant = {"standard": [(0, 0.4, 1.0, 3.0), (0, 0.6, 1.0, 3.0)],
                   "quest": [(0, 0.5, 1.0, 1.0), (0, 0.5, 1.0, 2.0)],
                   "qknorm": [(0, 0.5, 2.0, 5.0), (0, 0.5, 2.0, 6.0)]}
    write_runs(tmp_path, [(v, seed, dict(zip(("success", "acc", "mae", "mse"), vals)), {})
                          for v, rows in per_variant.items() for seed, vals in enumerate(rows)])
    table = tables.domain_table(results_runs.load_runs(tmp_path))
    assert not table["success ↑"].str.contains(r"\*\*").any() and not table["acc ↑"].str.contains(r"\*\*").any()
    assert table["mae ↓"].tolist() == ["**1 ± 0**", "**1 ± 0**", "2 ± 0"]
    assert table["mse ↓"].tolist() == ["3 ± 0", "**1.5 ± 6.4**", "5.5 ± 6.4"]  # n = 2: t = 12.7


def test_a_metric_no_record_gives_a_direction_for_gets_no_arrow_and_no_best(tmp_path):
    """Which way is better comes from the records (the task's metrics say), never from the metric's name: a
    record written before records said so leaves its secondary metrics unranked."""
    write_runs(tmp_path, [(v, 0, {"mse": x, "wer": x}, {"directions": {}}) for v, x in (("standard", 1.0), ("quest", 2.0))])
    table = tables.domain_table(results_runs.load_runs(tmp_path))
    assert "wer" in table and not table["wer"].str.contains(r"\*\*").any()
    assert table["mse ↓"].tolist() == ["**1**", "2"]  # the primary metric's direction is the record's mode


def test_tables_counts_paired_test_and_ranks(tmp_path):
    values = {"standard": [1.0, 2.0, 3.0], "quest": [0.5, 1.0, 2.0]}
    write_runs(tmp_path, [(v, seed, {"mse": x}, {}) for v, xs in values.items() for seed, x in enumerate(xs)])
    write_runs(tmp_path, [("quest", 3, {}, {"status": "diverged"}), *ablation(range(3)), *ablation((0, 1), domain="b"),
                          *[(v, seed, {"mse": x}, {"domain": "b"}) for v, x in (("standard", 1.0), ("quest", 2.0))
                            for seed in (0, 1)]])
    runs = results_runs.load_runs(tmp_path)
    table = tables.domain_table(runs[runs["domain"] == "a"])
    t = t_dist.ppf(0.975, 2)  # means carry the half-width of their 95% t-interval
    assert table.loc["quest", "mse ↓"] == f"**1.167 ± {t * np.std(values['quest'], ddof=1) / 3 ** 0.5:.2g}**"
    assert table.loc["standard", "mse ↓"] == f"2 ± {t / 3 ** 0.5:.2g}"
    assert table.loc["quest", "diverged"] == 1 and table.loc["quest", "runs"] == 3
    assert "stopped" not in table  # shown only where a run was stopped
    write_runs(tmp_path, [("standard", 4, {}, {"status": "stopped", "stopped": {"signal": "SIGTERM", "step": 3}})])
    again = tables.domain_table(results_runs.load_runs(tmp_path).query("domain == 'a'"))
    assert again.loc["standard", "stopped"] == 1 and again.loc["standard", "runs"] == 3
    p = ttest_rel(values["quest"], values["standard"]).pvalue
    sd = np.std([-0.5, -1.0, -1.0], ddof=1)
    half, mde = t * sd / 3 ** 0.5, (t + t_dist.ppf(0.8, 2)) * sd / 3 ** 0.5  # 80% power, α = 0.05
    assert table.loc["quest", "Δmse vs standard ± 95% (p, Holm, n, MDE)"] == (
        f"{-0.8333:+.3g} ± {half:.2g} (p={p:.2g}, Holm {p:.2g}, n=3, MDE {mde:.2g})")
    summary = tables.summary_table(runs)
    assert summary.loc["quest", "rank a/d (study)"] == "1" and summary.loc["quest", "rank b/d (study)"] == "2"
    assert summary.loc["quest", "mean rank"] == "1.50"


def test_holm_adjusts_step_down_and_keeps_the_order():
    p = pd.Series({"a": 0.01, "b": 0.04, "c": 0.03})
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 -> 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    assert stats.holm(p).to_dict() == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})


def test_equivalent_variants_are_marked_not_ranked_and_verdicts_counted(tmp_path):
    """elliptical computes standard's function here (same metrics on every seed): marked ≡, not ranked twice.
    quest is better on every seed by a clear margin, qnorm is noise."""
    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.1, 6)
    runs = {"standard": base, "elliptical": base, "quest": base - 0.5 + rng.normal(0, 0.01, 6),
            "qnorm": base + np.array([0.1, -0.1, 0.05, -0.05, 0.02, -0.03])}
    write_runs(tmp_path, [(v, seed, {"mse": float(x)}, {}) for v, xs in runs.items() for seed, x in enumerate(xs)])
    write_runs(tmp_path, ablation(range(6)))
    loaded = results_runs.load_runs(tmp_path)
    table = tables.domain_table(loaded)
    assert table.loc["elliptical", "Δmse vs standard ± 95% (p, Holm, n, MDE)"] == "≡ standard"
    summary = tables.summary_table(loaded)
    assert summary.loc["elliptical", "rank a/d (study)"] == "≡ standard"
    assert summary.loc["quest", "rank a/d (study)"] == "1" and summary.loc["standard", "rank a/d (study)"] != "≡ standard"
    assert stats.verdicts(loaded) == {"elliptical": "≡ standard", "quest": "better", "qnorm": "not different"}
    assert tables.significance_line(loaded) == ("Significant after Holm's correction (α = 0.05) on mse: "
                                                   "quest better.")
    counts = tables.verdict_table(loaded)
    assert counts.loc["quest", "better"] == 1 and counts.loc["qnorm", "not different"] == 1
    assert counts.loc["elliptical", "≡ another variant"] == 1


def test_study_reports_and_hand_written_notes_join_the_results(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [("standard", 0, {"mse": 2.0}, {}), ("quest", 0, {"mse": 1.0}, {})])
    study = tmp_path / "study" / "report"
    study.mkdir(parents=True)
    (study / "rates.png").write_bytes(b"\x89PNG figure")
    (study / "report.md").write_text("# Mechanism study\n\nquest 97%\n\n## Design\n\nrule\n\n![rates](rates.png)\n")
    notes = tmp_path / "notes.md"
    notes.write_text("## Mechanism study\n\nQUEST succeeds more often than standard.\n\n"
                     "## a / d / study\n\nOne seed: nothing to read.\n")
    assert aggregate.main([str(runs), "--report", str(study / "report.md"), "--notes", str(notes), "-o", str(out),
                           "--no-plots"]) == 0
    text, found = out.read_text(), sections(out.read_text())
    # the report's headings sit one level down, its figure is copied beside the results and linked from there
    assert "\n## Mechanism study\n" in text and "\n### Design\n" in text and "\n# Mechanism study" not in text
    assert "![rates](R/mechanism-study/rates.png)" in text
    assert (tmp_path / "R" / "mechanism-study" / "rates.png").read_bytes() == b"\x89PNG figure"
    # each note sits right under the heading it names, marked as hand-written, and the tables stay
    reading = f"*Reading (written by hand from these numbers, `{notes}`):*"
    assert found["Mechanism study"].startswith(f"Mechanism study\n\n{reading} QUEST succeeds more often")
    assert found["a / d / study"].startswith(f"a / d / study\n\n{reading} One seed: nothing to read.\n\n2 runs.")
    # a note for a section that does not exist would be lost: a user error, and nothing is written
    notes.write_text("## Mechanism sutdy\n\ntypo\n")
    out.unlink()
    assert cli(["aggregate", str(runs), "--notes", str(notes), "-o", str(out), "--no-plots"]) == 2
    assert "no section of the results is headed 'Mechanism sutdy'" in capsys.readouterr().err
    assert not out.exists()


def test_a_table_that_does_not_beat_its_trivial_baseline_is_not_ranked(tmp_path):
    """Domain a's standard closes 80% of the gap between its constant predictor (acc 0.5) and 1; domain b's
    closes 2%: b is said not to learn and stays out of the ranks and verdict counts."""
    for domain, accs in (("a", (0.9, 0.91)), ("b", (0.51, 0.52))):
        write_runs(tmp_path, [(v, seed, {"acc": acc + 0.001 * seed * (1 + (v == "quest")), "acc_baseline": 0.5},
                               {"domain": domain, "primary_metric": "acc", "mode": "max"})
                              for v, acc in zip(("standard", "quest"), accs) for seed in range(3)])
        write_runs(tmp_path, ablation(range(3), 0.0, domain=domain, primary_metric="acc", mode="max"))
    runs = results_runs.load_runs(tmp_path)
    learned_a, sentence_a = stats.learns(runs[runs["domain"] == "a"])
    learned_b, sentence_b = stats.learns(runs[runs["domain"] == "b"])
    assert learned_a and "standard closes 80% of the gap" in sentence_a and "learns at this size" in sentence_a
    assert not learned_b and "does not learn at this size" in sentence_b
    summary = tables.summary_table(runs)
    assert "rank a/d (study)" in summary and not any("b/d" in column for column in summary.columns)
    assert tables.verdict_table(runs).loc["quest"].sum() == 1  # domain a only


def test_an_ablation_is_reported_beside_standard_but_never_ranked_or_bolded(tmp_path):
    runs = {"standard": [0.9, 0.92, 0.91], "quest": [0.91, 0.93, 0.92], "uniform": [0.99, 0.98, 0.99]}
    write_runs(tmp_path, [(v, seed, {"acc": x}, {"primary_metric": "acc", "mode": "max"})
                          for v, xs in runs.items() for seed, x in enumerate(xs)])
    loaded = results_runs.load_runs(tmp_path)
    table = tables.domain_table(loaded)
    assert not table.loc["uniform", "acc ↑"].startswith("**") and table.loc["quest", "acc ↑"].startswith("**")
    assert table.loc["uniform", "Δacc vs standard ± 95% (p, Holm, n, MDE)"].startswith("+0.0767")
    assert "uniform" not in tables.summary_table(loaded).index
    assert "uniform" not in stats.verdicts(loaded) and "uniform" not in tables.verdict_table(loaded).index
    (line,) = tables.ablation_lines(loaded)
    assert line.startswith("Attention ablation `uniform`") and "Δacc +0.0767" in line and "better than standard" in line


def test_an_ablation_that_changes_nothing_is_said_to(tmp_path):
    runs = {"standard": [0.9, 0.92, 0.91], "uniform": [0.91, 0.90, 0.915]}
    write_runs(tmp_path, [(v, seed, {"mse": x}, {}) for v, xs in runs.items() for seed, x in enumerate(xs)])
    (line,) = tables.ablation_lines(results_runs.load_runs(tmp_path))
    assert "not different from standard: removing attention changes nothing measurable at this size" in line


def test_paper_anchors_put_measured_cells_beside_the_papers_numbers(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "R.md"
    write_runs(runs, [(v, seed, {"mse": x + seed, "mae": 1.0}, {}) for v, x in (("standard", 2.0), ("quest", 1.0))
                      for seed in range(2)])
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text(
        "- {experiment: big run, paper: 'quest 1.0', nearest: the a table, agreement: same order,\n"
        "   measured: {table: a/d/study, metrics: [mse, mae], variants: [quest, standard]}}\n"
        "- {experiment: toy study, paper: '58%', nearest: ours, agreement: higher here, see: Mechanism study}\n")
    assert aggregate.main([str(runs), "--anchors", str(anchors), "-o", str(out), "--no-plots"]) == 0
    section = re.sub(r" {2,}", " ", sections(out.read_text())["Paper anchors"])  # without the tables' padding
    # mean ± 95% half-width over the two seeds, computed from the runs: (1, 2) for quest, (2, 3) for standard
    half = t_dist.ppf(0.975, 1) * np.std([1.0, 2.0], ddof=1) / math.sqrt(2)
    assert f"quest: mse 1.5 ± {half:.2g}, mae 1 ± 0<br>standard: mse 2.5 ± {half:.2g}, mae 1 ± 0" in section
    assert "| toy study | 58% | ours | see “Mechanism study” | higher here |" in section
    # a table or metric the runs lack is a user error that writes nothing
    out.unlink()
    anchors.write_text("- {experiment: e, paper: p, nearest: n, agreement: a, measured: {table: a/d/study, "
                       "metrics: [acc]}}\n")
    assert cli(["aggregate", str(runs), "--anchors", str(anchors), "-o", str(out), "--no-plots"]) == 2
    assert "table 'a/d/study' has no metric acc" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("domain", ["language", "timeseries", "vision"])
def test_each_task_says_which_way_its_test_metrics_go(domain):
    """The directions a record carries come from the task's torchmetrics metrics: the language model's bits
    and perplexity go down, accuracies up, each trivial baseline with the metric it stands for."""
    from common.registry import get_domain
    from runners.config import compose

    _, task = get_domain(domain).build(compose([f"domain={domain}", "preset=smoke"]))
    expected = {"language": {"loss": "min", "bpb": "min", "ppl": "min", "loss_baseline": "min"},
                "timeseries": {"mse": "min", "mae": "min", "mse_baseline": "min", "mae_baseline": "min"},
                "vision": {"acc": "max", "macc": "max", "acc_baseline": "max"}}[domain]
    assert expected.items() <= task.directions().items()
    assert all(name in task.directions() and said for name, said in task.baselines().items())


def test_power_and_untestable_differences():
    """The minimum detectable effect is the paired t-test's at 80% power; a difference equal on every seed is
    untestable (it used to read as p = 0, 'better' on two seeds); all zero is no difference, and its zero spread
    estimates no detectable effect (it used to read as an MDE of 0: any effect detected)."""
    from runners.results.stats import detectable, paired_p

    assert detectable(1.0, 5) == pytest.approx((t_dist.ppf(0.975, 4) + t_dist.ppf(0.8, 4)) / 5 ** 0.5)
    assert math.isnan(detectable(1.0, 1)) and math.isnan(detectable(0.0, 4))
    assert math.isnan(paired_p(pd.Series([0.02, 0.02]))) and paired_p(pd.Series([0.0, 0.0])) == 1.0
    assert paired_p(pd.Series([0.1, 0.3, 0.2])) == pytest.approx(ttest_rel([0.1, 0.3, 0.2], [0, 0, 0]).pvalue)


def test_a_table_where_removing_attention_is_undetectable_is_not_ranked(tmp_path):
    """Domain a's uniform ablation costs 0.3 on every seed, give or take 0.01: attention matters; domain b's
    moves mse by 0.001 against a seed spread of 0.1: its variants cannot be ranked, and drop out of the counts."""
    jitter = [0.0, 0.1, -0.1, 0.05]
    for domain, cost, noise in (("a", 0.3, 0.01), ("b", 0.001, 0.1)):
        write_runs(tmp_path, [(v, seed, {"mse": 1.0 + {"standard": 0, "quest": -0.2, "uniform": cost}[v]
                                         + noise * jitter[seed] * (v != "standard")}, {"domain": domain})
                              for v in ("standard", "quest", "uniform") for seed in range(4)])
    runs = results_runs.load_runs(tmp_path)
    matters_a, sentence_a = stats.attention_matters(runs[runs["domain"] == "a"])
    matters_b, sentence_b = stats.attention_matters(runs[runs["domain"] == "b"])
    assert matters_a and "variants can be ranked here" in sentence_a
    assert not matters_b and "cannot rank variants here" in sentence_b
    assert not any("b/d" in column for column in tables.summary_table(runs).columns)
    assert tables.verdict_table(runs).loc["quest"].tolist() == [1, 0, 0, 0]  # a only


def test_a_table_without_its_attention_ablation_is_not_ranked(tmp_path, capsys):
    """Domains a and b hold the same clear quest gain; only a ran the `uniform` ablation. b cannot show that
    attention matters there, so it is neither ranked nor counted, and the counts' caption says why."""
    for domain in "ab":
        write_runs(tmp_path / "runs", [(v, seed, {"mse": 1.0 - 0.3 * (v == "quest") + 0.01 * seed * (v == "quest")},
                                        {"domain": domain}) for v in ("standard", "quest") for seed in range(3)])
    write_runs(tmp_path / "runs", ablation(range(3)))
    runs = results_runs.load_runs(tmp_path / "runs")
    assert stats.attention_matters(runs[runs["domain"] == "b"]) is None
    assert stats.rankable(runs[runs["domain"] == "a"]) and not stats.rankable(runs[runs["domain"] == "b"])
    assert [c for c in tables.summary_table(runs).columns if c.startswith("rank")] == ["rank a/d (study)"]
    assert tables.verdict_table(runs).loc["quest"].tolist() == [1, 0, 0, 0]  # a only
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "-o", str(out), "--no-plots"]) == 0
    assert "a table without its own attention ablation cannot show that attention matters there" in out.read_text()


def test_the_verdict_table_corrects_over_every_test_it_counts(tmp_path):
    """Three domains where quest beats standard at p ≈ 0.03 each: significant in each table alone, not once
    Holm's correction runs over the three tests the verdict table counts (3 x 0.03 > 0.05)."""
    for domain in "abc":
        write_runs(tmp_path, [(v, seed, {"mse": 1.0 - (v == "quest") * (0.1 + 0.03 * [1, -1, 0.5][seed])},
                               {"domain": domain}) for v in ("standard", "quest") for seed in range(3)])
        write_runs(tmp_path, ablation(range(3), domain=domain))
    runs = results_runs.load_runs(tmp_path)
    p = ttest_rel([0.87, 0.93, 0.885], [1, 1, 1]).pvalue
    assert 0.0167 < p < 0.05
    assert all(stats.verdicts(runs[runs["domain"] == d])["quest"] == "better" for d in "abc")
    assert tables.verdict_table(runs).loc["quest", "not different"] == 3


PLAN = """# Plan

```yaml
protocol: tuned
seeds: [0, 1, 2]
recipe_seeds: [0, 1, 2]
alpha: 0.05
hypotheses:
  - {id: H1, claim: quest beats standard, domain: a, metric: mse, variant: quest, against: standard}
  - {id: H2, claim: quest beats standard, domain: b, metric: mse, variant: quest, against: standard}
```
"""


def write_tuned_sweep(root, commit=None, gain=0.3, label=None, seeds=(0, 1, 2)):
    """A sweep with a tuned protocol: in domain a, quest at its chosen lr 3e-3 is better than standard by about
    ``gain`` mse and uniform is far worse (variants rank); in domain b nothing differs (they cannot). ``label``:
    the sweep's own setting (another init)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "selection.json").write_text(json.dumps({
        "keys": ["optim.lr"], "seeds": [100], "recipe_seeds": list(seeds), "confirm_seeds": list(seeds),
        "recipe": {d: {"optim.lr": 1e-3} for d in "ab"}, "label": label, "variants": ["standard", "quest"],
        "chosen": {d: {"standard": {"optim.lr": 1e-3}, "quest": {"optim.lr": 3e-3}} for d in "ab"}}))
    for domain, domain_gain, cost in (("a", gain, 0.5), ("b", 0.0, 0.0)):
        for variant, lr, shift in (("standard", 1e-3, 0), ("quest", 1e-3, 0), ("quest", 3e-3, -domain_gain),
                                   ("uniform", 1e-3, cost)):
            for seed in seeds:
                noise = 0.01 * [1, -1, 0.5][seed % 3] * (variant != "standard") + 0.003 * seed
                write_record(root / f"{domain}-{variant}-{lr}-{seed}", record(
                    variant, seed, {"mse": 1.0 + shift + noise}, domain=domain, config={"optim": {"lr": lr}},
                    git_commit=commit))


def test_a_tuned_sweep_has_both_protocols_its_choices_and_the_confirmatory_tests(tmp_path):
    root = tmp_path / "runs"
    write_tuned_sweep(root)
    plan = tmp_path / "preregistration.md"
    plan.write_text(PLAN)
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(root), "--confirm", str(plan), "-o", str(out), "--no-plots"]) == 0
    text = out.read_text()
    found = sections(text)
    assert {"a / d / study / same recipe", "a / d / study / tuned", "b / d / study / same recipe"} <= set(found)
    assert "| a        |    0.001 | 0.001 (×1) | 0.003 (×3) |" in found[f"Tuned protocol: the choices ({root})"]
    confirm = found["Confirmatory tests"]
    assert "is not committed" in confirm
    rows = {line.split("|")[1].strip(): line for line in confirm.splitlines() if line.startswith("| H")}
    assert rows["H1"].rstrip(" |").endswith("supported") and "+0.298 ± 0.026" in rows["H1"]
    assert rows["H2"].rstrip(" |").endswith("cannot rank variants here")
    assert "Holm's correction over the 1 hypotheses whose domain can rank variants;" in confirm


TUNED_A, RECIPE_A, TUNED_B = ("a", "d", "study", "tuned"), ("a", "d", "study", "same recipe"), ("b", "d", "study", "tuned")


def tuned_groups(root):
    runs = results_runs.load_runs(root)
    return runs, dict(iter(runs.groupby(results_runs.GROUP, sort=True)))


def test_a_tuned_table_without_its_own_ablation_is_judged_by_its_same_recipe_tables(tmp_path):
    """As in the fair study, the ablation ran at the recipe's rate only, so no tuned table holds one. Domain a's
    same-recipe ablation costs 0.5 on every seed: its tuned table, quest clearly better there, is ranked and
    counted on it. Domain b's moves mse by less than three seeds detect: its tuned table is not. The text names
    the tuned tables and where their evidence comes from."""
    root = tmp_path / "runs"
    write_tuned_sweep(root)
    runs, groups = tuned_groups(root)
    assert stats.attention_matters(groups[TUNED_A]) is None and not stats.rankable(groups[TUNED_A])
    assert tables.ablation_sources(groups)[TUNED_A] == RECIPE_A
    assert stats.rankable(groups[TUNED_A], groups[RECIPE_A])
    assert [key for key, _ in tables.counted_groups(runs)] == [RECIPE_A, TUNED_A]
    ranked = [c for c in tables.summary_table(runs).columns if c.startswith("rank")]
    assert ranked == ["rank a/d (study, same recipe)", "rank a/d (study, tuned)"]
    assert tables.verdict_table(runs).loc["quest"].tolist() == [1, 1, 0, 0]  # tuned a better, same-recipe a not
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(root), "-o", str(out), "--no-plots"]) == 0
    assert ("Tuned tables without an ablation of their own, judged by their same-recipe table's: ranked a/d (study, "
            "tuned); not ranked b/d (study, tuned).") in sections(out.read_text())["Across domains"]


def test_a_tuned_table_whose_same_recipe_ablation_is_undetectable_is_not_ranked(tmp_path):
    """Domain b's same-recipe ablation moves mse by less than three seeds detect: its tuned table, judged by it,
    is not counted."""
    write_tuned_sweep(tmp_path)
    runs, groups = tuned_groups(tmp_path)
    assert not stats.attention_matters(groups[("b", "d", "study", "same recipe")])[0]
    assert tables.ablation_sources(groups)[TUNED_B] == ("b", "d", "study", "same recipe")
    assert TUNED_B not in dict(tables.counted_groups(runs))


def test_a_tuned_table_with_no_ablation_in_its_sweep_is_not_ranked(tmp_path):
    """Domain a without its `uniform` runs: neither of its tables can show that attention matters, so the clear
    tuned gain of quest is neither ranked nor counted."""
    write_tuned_sweep(tmp_path)
    for seed in range(3):
        shutil.rmtree(tmp_path / f"a-uniform-0.001-{seed}")
    runs, groups = tuned_groups(tmp_path)
    assert tables.ablation_sources(groups)[TUNED_A] == RECIPE_A
    assert stats.attention_matters(groups[RECIPE_A]) is None and not stats.rankable(groups[TUNED_A], groups[RECIPE_A])
    assert list(tables.counted_groups(runs)) == []


def test_a_tuned_table_with_its_own_ablation_is_judged_by_it(tmp_path):
    """Domain a's tuned protocol also ran `uniform` at its own chosen rate, where removing attention changes
    nothing the seeds detect: that, not the same-recipe ablation's 0.5, decides, and the tuned table is not ranked."""
    write_tuned_sweep(tmp_path)
    selection = json.loads((tmp_path / "selection.json").read_text())
    selection["chosen"]["a"]["uniform"] = {"optim.lr": 3e-3}
    (tmp_path / "selection.json").write_text(json.dumps(selection))
    standard = {seed: read_record(tmp_path / f"a-standard-0.001-{seed}").metrics["test/mse"] for seed in range(3)}
    for seed in range(3):
        mse = standard[seed] + 0.01 * [1, -1, 0.5][seed]
        write_record(tmp_path / f"a-uniform-0.003-{seed}", record("uniform", seed, {"mse": mse}, domain="a",
                                                                  config={"optim": {"lr": 3e-3}}))
    runs, groups = tuned_groups(tmp_path)
    assert not stats.attention_matters(groups[TUNED_A])[0]
    assert tables.ablation_sources(groups)[TUNED_A] == TUNED_A
    assert [key for key, _ in tables.counted_groups(runs)] == [RECIPE_A]


def test_the_confirmatory_section_checks_the_plan_came_first(tmp_path):
    import subprocess

    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    plan = tmp_path / "preregistration.md"
    plan.write_text(PLAN)
    subprocess.run([*git, "add", plan.name], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "plan"], cwd=tmp_path, check=True)
    planned = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    write_tuned_sweep(tmp_path / "runs", commit=planned + "+dirty")
    from runners.results import confirmatory

    runs = results_runs.load_runs(tmp_path / "runs")
    assert "every run's commit descends from it" in confirmatory.provenance(plan, runs)
    with pytest.raises(confirmatory.ConfigError, match="lacks alpha"):
        plan.write_text(PLAN.replace("alpha: 0.05\n", ""))
        confirmatory.read_plan(plan)


def test_a_table_says_how_many_runs_were_still_improving(tmp_path):
    """Two of three runs kept their last validation: the table says they were still improving."""
    write_runs(tmp_path, [("standard", seed, {"mse": 1.0 + seed}, {"best_val": {
        "value": 1.0, "epoch": 3, "evaluation": 4 if seed else 2, "evaluations": 4}}) for seed in range(3)])
    from runners.results.document import budget_line

    line = budget_line(results_runs.load_runs(tmp_path))
    assert line.startswith("Training length: 2 of 3 finished runs scored their best validation at their last")
    assert "longer training could change this table" in line


@pytest.mark.parametrize("plan, problem", [
    ("```yaml\nprotocol: [unclosed\n```\n", "the plan is not valid YAML"),
    ("```yaml\n- a\n```\n", "the plan is a mapping of"),
    ("no block here\n", "no ```yaml block holds the analysis plan"),
    (PLAN.replace("  - {id: H2", "  - 3\n  - {id: H2"), "hypotheses must be a list of mappings"),
    (PLAN.split("hypotheses:")[0] + "hypotheses: []\n```\n", "the plan lists no hypotheses"),
    (PLAN.replace("alpha: 0.05", "alpha: 0.05\nnotes: x"), "the plan has unknown key(s) notes"),
    (PLAN.replace("domain: b,", "domain: b, targt: 0.1,"), "hypothesis H2 has unknown key(s) targt"),
])
def test_a_broken_plan_is_one_line_and_writes_nothing(tmp_path, capsys, plan, problem):
    write_tuned_sweep(tmp_path / "runs")
    (tmp_path / "plan.md").write_text(plan)
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(tmp_path / "plan.md"), "-o", str(out)]) == 2
    assert problem in capsys.readouterr().err and not out.exists() and not (tmp_path / "RESULTS").exists()


def write_second_setting(tmp_path):
    """The fair study's second init: a sweep with `label:` whose tables sit beside the first sweep's, taking its
    choices (every one the recipe's, so each sweep's two protocols hold the same runs). quest beats standard
    clearly in both; qknorm beats it under the first setting only; the first sweep's ablation shows attention matters."""
    for root, label, qknorm_gain in ((tmp_path / "main", None, 0.2), (tmp_path / "init", "PyTorch init", 0.0)):
        root.mkdir()
        (root / "selection.json").write_text(json.dumps({
            "keys": ["optim.lr"], "seeds": [100], "recipe_seeds": [0, 1, 2], "confirm_seeds": [0, 1, 2],
            "label": label, "recipe": {"a": {"optim.lr": 1e-3}}, "variants": ["standard", "quest", "qknorm", "uniform"],
            "chosen": {"a": {v: {"optim.lr": 1e-3} for v in ("standard", "quest", "qknorm", "uniform")}},
            **({"from": "runs/main/selection.json"} if label else {})}))
        for variant, gain in (("standard", 0.0), ("quest", 0.3), ("qknorm", qknorm_gain), *(() if label else [("uniform", -9.0)])):
            for seed in range(3):
                noise = 0.01 * [1, -1, 0.5][seed] * (variant != "standard") + 0.003 * seed
                write_record(root / f"{variant}-{seed}", record(variant, seed, {"mse": 1.0 - gain + noise}, domain="a",
                                                                config={"optim": {"lr": 1e-3}}))


def test_each_verdict_says_whether_it_holds_under_a_second_setting(tmp_path):
    write_second_setting(tmp_path)
    runs = results_runs.load_runs(tmp_path / "main", tmp_path / "init")
    table = tables.setting_agreement_table(runs)
    same_recipe = table.loc["a/d (study, same recipe)"].set_index("variant")
    assert list(same_recipe["setting"].unique()) == ["PyTorch init"]
    assert same_recipe.loc["quest", "same verdict"] == "yes"
    assert same_recipe.loc["qknorm", "Δ vs standard (verdict)"].endswith("(better)")
    assert same_recipe.loc["qknorm", "under the setting"].endswith("(not different)")
    assert same_recipe.loc["qknorm", "same verdict"] == "no"
    assert tables.setting_agreement_table(results_runs.load_runs(tmp_path / "main")) is None


def test_a_second_setting_is_not_counted_twice_nor_a_table_shown_twice(tmp_path):
    """A protocol holding the very runs of another is counted once and says so instead of repeating the table; the
    labelled sweep's tables stay out of the cross-domain ranks and counts (they would weigh domain a twice); a sweep
    that took another's choices names it instead of repeating them."""
    write_second_setting(tmp_path)
    runs = results_runs.load_runs(tmp_path / "main", tmp_path / "init")
    assert [c for c in tables.summary_table(runs).columns if c.startswith("rank")] == ["rank a/d (study, same recipe)"]
    assert tables.verdict_table(runs).loc["qknorm"].to_dict() == {  # one table: the init's "not different" is not counted
        "better": 1, "not different": 0, "worse": 0, "≡ another variant": 0}
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "main"), str(tmp_path / "init"), "-o", str(out), "--no-plots"]) == 0
    found = sections(out.read_text())
    assert found["a / d / study / tuned, PyTorch init"].split("\n", 1)[1].strip() == (
        "The same 9 runs as “a / d / study / same recipe, PyTorch init”: every variant's chosen settings are the "
        "recipe's, at the same seeds.")
    assert "| quest " in found["a / d / study / same recipe, PyTorch init"]
    from runners.results.plots import write_plots

    plotted = write_plots(runs, tmp_path / "plots", tmp_path)
    assert ("a", "d", "study", "same recipe, PyTorch init") in plotted
    assert ("a", "d", "study", "tuned, PyTorch init") not in plotted and ("a", "d", "study", "tuned") not in plotted
    assert found[f"Tuned protocol: the choices ({tmp_path / 'init'})"].split("\n", 1)[1].strip() == (
        "The tuned runs here (PyTorch init) take the choices of `runs/main/selection.json` as they are (not chosen "
        "again); confirmation seeds [0, 1, 2].")


def test_each_accuracy_claim_is_retested_under_a_second_setting(tmp_path):
    """The plan's second init: quest's gain in domain a is there under the first setting and gone (reversed) under
    the second; domain b cannot rank, so its claim is not re-tested."""
    write_tuned_sweep(tmp_path / "main")
    write_tuned_sweep(tmp_path / "init", gain=-0.05, label="PyTorch init")
    from runners.results import confirmatory

    runs = results_runs.load_runs(tmp_path / "main", tmp_path / "init")
    (tmp_path / "plan.md").write_text(PLAN)
    plan = confirmatory.read_plan(tmp_path / "plan.md")
    found = confirmatory.under_second_settings(runs, plan, confirmatory.tests(runs, plan)).set_index("id")
    assert list(found.index) == ["H1"] and found.loc["H1", "setting"] == "PyTorch init"
    assert found.loc["H1", "diff"] == pytest.approx(-0.05 - 0.01 * (1 - 1 + 0.5) / 3)
    assert (found.loc["H1", "verdict"], found.loc["H1", "confirmed"]) == ("contradicted", "supported")
    text = "\n".join(confirmatory.section(runs, confirmatory.confirm(runs, [tmp_path / "plan.md"])))
    row = next(line for line in text.splitlines() if line.startswith("| H1 ") and "PyTorch init" in line)
    assert "|contradicted|supported|no|no|" in row.replace(" ", "")


def test_whether_a_second_setting_changes_a_claim_is_a_paired_test_of_the_two_differences(tmp_path):
    """quest's gain over standard in domain a is 0.3 under the first setting and -0.05 under the second, and
    seed 0's quest run under the second is 0.03 worse still: per seed the claim's difference moves by -0.38, -0.35,
    -0.35, tested against no change over those seeds."""
    write_tuned_sweep(tmp_path / "main")
    write_tuned_sweep(tmp_path / "init", gain=-0.05, label="PyTorch init")
    worse = read_record(tmp_path / "init" / "a-quest-0.003-0")
    worse.metrics["test/mse"] += 0.03
    write_record(tmp_path / "init" / "a-quest-0.003-0", worse)
    from runners.results import confirmatory

    runs = results_runs.load_runs(tmp_path / "main", tmp_path / "init")
    (tmp_path / "plan.md").write_text(PLAN)
    plan = confirmatory.read_plan(tmp_path / "plan.md")
    change = confirmatory.setting_change(runs, plan.hypotheses[0], "tuned", "tuned, PyTorch init", [0, 1, 2])
    assert change.to_dict() == pytest.approx({0: -0.38, 1: -0.35, 2: -0.35})
    found = confirmatory.under_second_settings(runs, plan, confirmatory.tests(runs, plan)).set_index("id")
    moved = [-0.38, -0.35, -0.35]
    half = t_dist.ppf(0.975, 2) * np.std(moved, ddof=1) / 3 ** 0.5
    p = ttest_rel(moved, [0, 0, 0]).pvalue
    assert found.loc["H1", "change"] == pytest.approx(-0.36) and found.loc["H1", "change_half"] == pytest.approx(half)
    assert found.loc["H1", "change_p"] == pytest.approx(p) and found.loc["H1", "change_n"] == 3
    text = "\n".join(confirmatory.section(runs, confirmatory.confirm(runs, [tmp_path / "plan.md"])))
    row = next(line for line in text.splitlines() if line.startswith("| H1 ") and "PyTorch init" in line)
    assert row.rstrip(" |").endswith(f"-0.36 ± {half:.2g} (n=3, p={p:.2g})")


@pytest.mark.parametrize("variants, warned", [(("standard", "quest"), False), (("standard", "elliptical"), True)])
def test_the_gradient_masking_caveat_stands_where_an_elliptical_variant_was_attacked(tmp_path, variants, warned):
    write_runs(tmp_path / "runs", [(v, seed, {"mse": 1.0 + seed}, {"robustness": {"acc_pgd_eps0.1": 0.5}})
                                   for v in variants for seed in range(2)])
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "-o", str(out), "--no-plots"]) == 0
    assert ("possible gradient masking" in out.read_text()) == warned


def markdown_rows(text):
    """The rows of the first markdown table in ``text``: its first cell -> {column: cell}."""
    table = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    header, rows = table[0], table[2:]
    return {row[0]: dict(zip(header, row)) for row in rows}


def paired_mde(diffs, alpha=0.05):
    """The pre-registered minimum detectable effect, (t₁₋α/₂ + t₀.₈) · sd / √n on n − 1 degrees of freedom: at α for
    a plan without targets, at Holm's first step α/m for one with them (m hypotheses), the level it is sized at."""
    n = len(diffs)
    return (t_dist.ppf(1 - alpha / 2, n - 1) + t_dist.ppf(0.8, n - 1)) * np.std(diffs, ddof=1) / n ** 0.5


# The section PLAN's tests on write_tuned_sweep's runs gave before plans could stand side by side.
ONE_PLAN = "\n".join([
    "## Confirmatory tests", "",
    "Pre-registered in `{plan}`: tuned protocol, seeds [0, 1, 2] only, two-sided paired t-tests by seed, α = 0.05, "
    "Holm's correction over the 1 hypotheses whose domain can rank variants; MDEs at 80% power and α = 0.05. `{plan}` is not committed: "
    "nothing shows the plan came before the runs.", "",
    "| hypothesis   | claim                | metric   | contrast         | n (dropped)   | difference ± 95% (+ favours "
    "the claim)   |       p | Holm p   |   MDE (80%) | verdict                   |",
    "|:-------------|:---------------------|:---------|:-----------------|:--------------|:------------------------"
    "-----------------|--------:|:---------|------------:|:--------------------------|",
    "| H1           | quest beats standard | mse      | quest − standard | 3 (0)         | +0.298 ± 0.026          "
    "                 | 0.00041 | 0.00041  |       0.032 | supported                 |",
    "| H2           | quest beats standard | mse      | quest − standard | 3 (0)         | -0.00167 ± 0.026        "
    "                 | 0.81    | –        |       0.032 | cannot rank variants here |", "",
    "Verdicts: 1 supported, 1 cannot rank variants here.", ""])


def test_one_plan_keeps_its_section_and_shows_power_only_where_it_sets_targets(tmp_path):
    from runners.results import confirmatory

    write_tuned_sweep(tmp_path / "runs")
    runs = results_runs.load_runs(tmp_path / "runs")
    plan = tmp_path / "plan.md"
    plan.write_text(PLAN)
    assert "\n".join(confirmatory.section(runs, confirmatory.confirm(runs, [plan]))) == ONE_PLAN.format(plan=plan)
    plan.write_text(PLAN.replace("against: standard}\n  - {id: H2", "against: standard, target: 0.05}\n  - {id: H2"))
    rows = markdown_rows("\n".join(confirmatory.section(runs, confirmatory.confirm(runs, [plan]))))
    before = markdown_rows(ONE_PLAN.format(plan=plan))
    # a plan with a target is judged at Holm's first step over its 2 hypotheses, α/2, the level it is sized at
    mde = paired_mde([0.29, 0.31, 0.295], alpha=0.025)  # domain a: quest's gain 0.3 less its noise 0.01 · (1, −1, 0.5)
    assert paired_mde([0.29, 0.31, 0.295]) < mde <= 0.05
    assert (rows["H1"]["target"], rows["H1"]["power"], rows["H1"]["MDE (80%)"]) == ("0.05", "powered", f"{mde:.2g}")
    assert (rows["H2"]["target"], rows["H2"]["power"]) == ("–", "no target")
    same = [k for k in before["H1"] if k != "MDE (80%)"]
    assert all({k: rows[h][k] for k in same} == {k: before[h][k] for k in same} for h in before)


PLAN_2 = """# A replication

```yaml
protocol: tuned
seeds: [3, 4, 5]
recipe_seeds: [3, 4, 5]
alpha: 0.05
hypotheses:
  - {id: H1, claim: quest beats standard, domain: a, metric: mse, variant: quest, against: standard, target: 0.06}
  - {id: H2, claim: quest beats standard, domain: b, metric: mse, variant: quest, against: standard, target: 0.02}
  - {id: H3, claim: standard beats quest, domain: a, metric: mse, variant: standard, against: quest}
```
"""


def test_two_plans_stand_side_by_side_each_on_its_own_runs_and_holm_family(tmp_path):
    """The first plan at seeds 0–2 (quest's gain 0.3), a replication at seeds 3–5 (gain 0.2) with targets: each plan's
    columns hold the tests on its own seeds, Holm over its own family, and whether its MDE reaches its target."""
    write_tuned_sweep(tmp_path / "main")
    write_tuned_sweep(tmp_path / "replication", gain=0.2, seeds=(3, 4, 5))
    first, second = tmp_path / "preregistration.md", tmp_path / "replication.md"
    first.write_text(PLAN)
    second.write_text(PLAN_2)
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "main"), str(tmp_path / "replication"), "--confirm", str(first),
                "--confirm", str(second), "-o", str(out), "--no-plots"]) == 0
    text = out.read_text()
    rows = markdown_rows(sections(text)["Confirmatory tests"])
    assert list(rows) == ["H1", "H2", "H3"]
    # the first plan: as alone (seeds 0–2), no targets
    assert {k.removeprefix("preregistration: "): v for k, v in rows["H1"].items() if k.startswith("preregistration: ")} == {
        "difference ± 95% (n)": "+0.298 ± 0.026 (n=3)", "Holm p": "0.00041", "MDE (80%)": "0.032", "target": "–",
        "power": "no target", "verdict": "supported"}
    assert {v for k, v in rows["H3"].items() if k.startswith("preregistration: ")} == {"—"}  # not in that plan
    # the replication, by hand: per seed 3, 4, 5 (noise 0.01 · (1, −1, 0.5) on all but standard)
    h1, h2 = [0.19, 0.21, 0.195], [-0.01, 0.01, -0.005]  # H3 is H1 the other way round
    mde1, mde2 = paired_mde(h1, alpha=0.05 / 3), paired_mde(h2, alpha=0.05 / 3)  # at α/3: 3 hypotheses
    assert mde1 <= 0.06 and mde2 > 0.02
    p = ttest_rel(h1, [0, 0, 0]).pvalue  # Holm over H1 and H3, of equal p (H2's domain b cannot rank): 2p each
    replication = {h: {k.removeprefix("replication: "): v for k, v in rows[h].items() if k.startswith("replication: ")}
                   for h in rows}
    assert replication["H1"]["Holm p"] == replication["H3"]["Holm p"] == f"{2 * p:.2g}"
    assert replication["H1"]["difference ± 95% (n)"].startswith(f"{np.mean(h1):+.3g} ± ")
    assert replication["H1"]["MDE (80%)"] == f"{mde1:.2g}" and replication["H1"]["power"] == "powered"
    assert replication["H2"]["power"] == f"not powered (MDE {mde2:.3g} > target 0.02)"
    assert (replication["H3"]["target"], replication["H3"]["power"]) == ("–", "no target")
    assert [replication[h]["verdict"] for h in rows] == ["supported", "cannot rank variants here", "contradicted"]
    # what each found and what its sizes cannot show, at the top
    top = text.split("\n## ")[0]
    assert (f"- `{first}`: of its 2 claims, 1 supported (H1), 0 contradicted, 0 cannot tell, 1 cannot rank variants "
            "here. It sets no target, so no claim is labelled powered or not; each claim's MDE (80% power) is in the "
            "table.") in top
    assert (f"- `{second}`: of its 3 claims, 1 supported (H1), 1 contradicted (H3), 0 cannot tell, 1 cannot rank "
            f"variants here. Its sizes cannot show an effect of the target's size for H2 (MDE {mde2:.3g} > target "
            "0.02).") in top


def test_the_headline_parts_a_claim_decided_below_its_power_from_one_that_may_have_missed_its_target():
    """Below 80% power for its target, a supported or contradicted claim found its difference all the same; only a
    claim left undecided is one whose sizes cannot show an effect of the target's size."""
    from pathlib import Path

    from runners.results.confirmatory import Confirmation, Plan, headline

    table = pd.DataFrame({"id": ["A", "B", "C", "D"], "target": [0.01] * 4, "mde": [0.02, 0.03, 0.005, 0.04],
                          "verdict": ["supported", "cannot tell", "cannot tell", "contradicted"],
                          "seeds": [9] * 4, "planned": [9] * 4})
    plan = Confirmation(Path("plan.md"), Plan.model_construct(seeds=list(range(9))), table, pd.DataFrame(), pd.DataFrame())
    assert headline([plan])[2] == (
        "- `plan.md`: of its 4 claims, 1 supported (A), 1 contradicted (D), 2 cannot tell. Its sizes cannot show an "
        "effect of the target's size for B (MDE 0.03 > target 0.01). Decided although not powered for its target: "
        "A (supported; MDE 0.02 > target 0.01), D (contradicted; MDE 0.04 > target 0.01).")


def test_a_plan_without_all_its_runs_is_tested_on_the_seeds_present_and_says_so(tmp_path):
    """A plan of five seeds whose runs reach seed 2 (domain b's only seed 1), and one none of whose seeds has run:
    the aggregate goes on, the first tested on the seeds present and labelled as not the registered analysis."""
    write_tuned_sweep(tmp_path / "runs")
    for run in (tmp_path / "runs").glob("b-*-2"):
        shutil.rmtree(run)
    partial, none = tmp_path / "partial.md", tmp_path / "none.md"
    partial.write_text(PLAN.replace("seeds: [0, 1, 2]\nrecipe", "seeds: [0, 1, 2, 3, 4]\nrecipe"))
    none.write_text(PLAN.replace("seeds: [0, 1, 2]\nrecipe", "seeds: [7, 8]\nrecipe")
                    .replace("against: standard}\n  - {id: H2", "against: standard, target: 0.05}\n  - {id: H2"))
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(partial), "--confirm", str(none), "-o", str(out),
                "--no-plots"]) == 0
    text = out.read_text()
    confirm = sections(text)["Confirmatory tests"]
    rows = markdown_rows(confirm)
    assert rows["H1"]["partial: difference ± 95% (n)"] == "+0.298 ± 0.026 (n=3)"  # the numbers of seeds 0–2
    assert rows["H1"]["partial: verdict"] == "supported (3 of 5 seeds; not the registered analysis)"
    assert rows["H2"]["partial: verdict"].endswith(" (2 of 5 seeds; not the registered analysis)")
    assert "Runs so far: 2–3 of 5 seeds, by claim; the tests use the seeds present and are not the registered " \
           "analysis until all 5 are in." in confirm
    assert [rows[h]["none: verdict"] for h in rows] == ["runs not yet made (0 of 2 seeds)"] * 2
    assert rows["H1"]["none: power"] == "unknown (fewer than 2 pairs, or no spread)" and rows["H1"]["none: MDE (80%)"] == "–"
    assert "Runs not yet made (0 of 2 seeds)." in confirm and "Verdicts, none: 2 runs not yet made." in confirm
    top = text.split("\n## ")[0]
    assert f"- `{partial}` (runs so far: 2–3 of 5 seeds, by claim; not the registered analysis): of its 2 claims, " \
           "1 supported (H1)" in top
    assert (f"- `{none}`: runs not yet made (0 of 2 seeds); nothing is found yet. Whether its sizes reach the target "
            "of H1 is unknown until 2 seeds are paired.") in top


def test_a_claim_may_have_seeds_of_its_own_among_the_plans(tmp_path, capsys):
    """Claims needing fewer seeds than others (the second confirmation's QKNorm contrasts): H1 on seeds 0–1 of the
    plan's 0–11 (written as a run), H2 on all twelve; each counted against its own seeds."""
    write_tuned_sweep(tmp_path / "runs")
    plan = tmp_path / "plan.md"
    plan.write_text(PLAN.replace("seeds: [0, 1, 2]\nrecipe", "seeds: {first: 0, count: 12}\nrecipe")
                    .replace("against: standard}\n  - {id: H2", "against: standard, seeds: [0, 1]}\n  - {id: H2"))
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(plan), "-o", str(out), "--no-plots"]) == 0
    confirm = sections(out.read_text())["Confirmatory tests"]
    rows = markdown_rows(confirm)
    assert rows["H1"]["n (dropped)"] == "2 (0)" and "(" not in rows["H1"]["verdict"]  # its own two seeds: all in
    assert rows["H2"]["verdict"].endswith("(3 of 12 seeds; not the registered analysis)")
    assert "seeds 0–11 only (some claims on a part of them, as the plan says)" in confirm
    assert "Runs so far: by claim, H2 3 of 12 seeds;" in confirm
    plan.write_text(PLAN.replace("against: standard}\n  - {id: H2", "against: standard, seeds: [0, 9]}\n  - {id: H2"))
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(plan), "-o", str(out), "--no-plots"]) == 2
    assert "hypothesis H1: seeds [9] are not among the plan's seeds" in capsys.readouterr().err


@pytest.mark.parametrize("second, problem", [
    (PLAN.replace("domain: a,", "domain: c,"), "hypothesis H1 tests quest − standard on c's mse, but quest − standard "
                                               "on a's mse in"),
    (PLAN.replace("id: H2,", "id: H1,"), "hypothesis id H1 is used more than once"),
])
def test_plans_that_cannot_stand_side_by_side_are_one_line_and_write_nothing(tmp_path, capsys, second, problem):
    write_tuned_sweep(tmp_path / "runs")
    (tmp_path / "first.md").write_text(PLAN)
    (tmp_path / "second.md").write_text(second)
    out = tmp_path / "RESULTS.md"
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(tmp_path / "first.md"), "--confirm",
                str(tmp_path / "second.md"), "-o", str(out)]) == 2
    assert problem in capsys.readouterr().err and not out.exists()
    assert cli(["aggregate", str(tmp_path / "runs"), "--confirm", str(tmp_path / "first.md"), "--confirm",
                str(tmp_path / "first.md"), "-o", str(out)]) == 2
    assert "the same plan given twice" in capsys.readouterr().err and not out.exists()


def test_a_replication_labelled_as_a_setting_of_the_protocol_is_its_own_plans_runs(tmp_path):
    """The second plan's runs come from a sweep labelled "confirmation 2" at seeds of their own: its protocol reads
    "tuned, confirmation 2", which the first plan would otherwise re-test as a second setting (such as another init)
    at its own seeds, where those runs have none."""
    write_tuned_sweep(tmp_path / "main")
    write_tuned_sweep(tmp_path / "replication", gain=0.2, seeds=(3, 4, 5), label="confirmation 2")
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    first.write_text(PLAN)
    second.write_text(PLAN_2.replace("protocol: tuned", "protocol: tuned, confirmation 2"))
    from runners.results import confirmatory

    runs = results_runs.load_runs(tmp_path / "main", tmp_path / "replication")
    confirmations = confirmatory.confirm(runs, [first, second])
    assert all(c.second.empty for c in confirmations)
    text = "\n".join(confirmatory.section(runs, confirmations))
    assert "Exploratory" not in text
    rows = markdown_rows(text)
    assert rows["H1"]["second: difference ± 95% (n)"].startswith(f"{np.mean([0.19, 0.21, 0.195]):+.3g} ± ")
    assert rows["H1"]["second: verdict"] == "supported" and rows["H1"]["first: verdict"] == "supported"


def test_a_table_that_pools_a_variants_settings_says_so(tmp_path):
    """A learning-rate grid aggregated as one table: each variant's mean runs over its rates, and the table says
    which settings it pools, and that a grid is not ranked (nor judged against its trivial baseline: a mean over
    runaway rates is no one setting's score, nor tested against `standard`, nor given a best in bold); a table whose
    runs differ only in the seed says nothing."""
    grid, seeds_only, out = tmp_path / "grid", tmp_path / "seeds", tmp_path / "R.md"
    for root, rates in ((grid, (0.01, 0.1)), (seeds_only, (0.01,))):
        for variant in ("standard", "quest"):
            for seed in (0, 1):
                for lr in rates:
                    write_record(root / f"{variant}-{seed}-{lr}", record(variant, seed, {"mse": lr + seed, "mse_baseline": 1.0},
                                                                         config={"optim": {"lr": lr}, "seed": seed}))
    assert aggregate.main([str(grid), "-o", str(out)]) == 0
    text = out.read_text()
    assert "8 runs. A variant's runs here differ in `optim.lr` besides the seed" in text
    assert "A learning-rate grid, so this table is not ranked" in text and "learn at this size" not in text
    assert "Not tested against `standard` on mse" in text and "Holm" not in text.split("8 runs.")[1] and "**" not in text
    assert set(results_runs.load_runs(grid)["pooled"]) == {"optim.lr"}
    assert not stats.rankable(results_runs.load_runs(grid))
    newer = record("quest", 2, {"mse": 0.01}, config={"optim": {"lr": 0.01, "z_loss": 0.0}, "seed": 2})
    write_record(seeds_only / "quest-2-newer", newer)  # a key the older runs lack is no setting they differ in
    assert aggregate.main([str(seeds_only), "-o", str(out)]) == 0
    assert "besides the seed" not in out.read_text() and set(results_runs.load_runs(seeds_only)["pooled"]) == {""}
