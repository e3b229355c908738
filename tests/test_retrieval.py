"""Retrieval domain: the generated answer and shortcut distributions (isotropic and anisotropic Sigma),
seeding and training order, the biased/unbiased accuracies and success, the answer-key-norm statistics (also
under vmap), the variants this one-layer model makes equivalent, the query norm that QUEST keeps and QKNorm
drops, and the reports."""
import hashlib
import math
import tempfile
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from common.attention import attention_layer
from common.errors import ConfigError
from common.records import BestValue, write_record
from common.registry import get_domain
from domains.retrieval import anisotropy, report
from domains.retrieval.config import Data
from domains.retrieval.data import (
    RetrievalDataModule,
    answer_shape,
    answer_spectrum,
    bias_vector,
    direction_oracles,
    generated,
    make_retrieval,
    shortcut_oracles,
)
from domains.retrieval.model import EQUIVALENT, RetrievalNet, equivalent_variant
from runners.config import compose, run_directory
from runners.runs.recording import new_record

SPEC = dict(num_tokens=12, key_dim=6, num_classes=5, answer_std=2.5, p_bias=0.5, bias_std=0.316)


def sample(n=4000, seed=0):
    bias = bias_vector(SPEC["key_dim"], 4.0, seed=7)
    return bias, make_retrieval(n, bias=bias, generator=torch.Generator().manual_seed(seed), **SPEC)


def build(*overrides: str):
    cfg = compose(["domain=retrieval", "preset=smoke", *overrides])
    return cfg, get_domain("retrieval").build(cfg)


def test_answer_tokens_follow_their_distributions():
    bias, (x, y, biased, answer) = sample()
    rows = torch.arange(len(x))
    keys = x[..., :SPEC["key_dim"]]
    labels = x[..., SPEC["key_dim"]:].argmax(-1)
    assert torch.equal(y, labels[rows, answer])  # the target is the answer token's label
    assert abs(biased.float().mean().item() - 0.5) < 0.03
    unbiased_answers, biased_answers = keys[rows, answer][~biased], keys[rows, answer][biased]
    assert abs(unbiased_answers.std().item() - 2.5) < 0.1
    assert (biased_answers.mean(0) - bias).abs().max() < 0.05 and abs(biased_answers.std(0).mean() - 0.316) < 0.03
    others = torch.ones_like(keys[..., 0], dtype=torch.bool)
    others[rows, answer] = False
    assert abs(keys[others].std().item() - 1.0) < 0.02
    assert torch.allclose(bias.norm(), torch.tensor(4.0))


def test_generation_is_deterministic_per_seed():
    assert all(torch.equal(a, b) for a, b in zip(sample(seed=3)[1], sample(seed=3)[1]))
    assert not torch.equal(sample(seed=3)[1][0], sample(seed=4)[1][0])


def order(seed: int) -> list[list[int]]:
    cfg = compose(["domain=retrieval", "preset=smoke", f"seed={seed}"])
    module = RetrievalDataModule(cfg.data, seed)
    module.setup("fit")
    loader = module.train_dataloader()
    return [batch for _ in range(2) for batch in iter(loader.batch_sampler)]  # two epochs


def test_the_training_order_is_a_function_of_the_seed_alone():
    first = order(5)
    torch.rand(100)  # the global generator moves on: the order does not
    assert order(5) == first and order(6) != first
    assert first[:4] != first[4:]  # each epoch is shuffled anew


def test_accuracy_counts_unbiased_samples_acc_biased_the_biased_ones_and_success_thresholds_acc():
    _, (_, task) = build("task.success_threshold=0.6")
    preds = torch.tensor([0, 1, 2, 3, 4, 0])
    labels = torch.tensor([0, 1, 0, 3, 4, 0])  # the unbiased samples 0..2 get one wrong, the biased 3..5 none
    biased = torch.tensor([0, 0, 0, 1, 1, 1])
    task.test_metrics.update(preds, torch.stack([labels, biased], dim=1))
    scores = task.test_metrics.compute()
    assert scores["test/acc"].item() == pytest.approx(2 / 3) and scores["test/acc_biased"].item() == 1.0
    assert scores["test/success"].item() == 1.0  # 2/3 >= 0.6
    task.val_metrics.update(preds, torch.stack([labels, torch.zeros_like(biased)], dim=1))
    assert task.val_metrics.compute()["val/acc_biased"].isnan()  # no biased sample: no score, not 0


def test_answer_key_norms_are_the_answer_tokens_and_run_under_vmap():
    _, (datamodule, task) = build()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    x, _, biased, answer = batch
    norms = task.net.keys(x)[torch.arange(len(x)), answer].norm(dim=-1)
    stats = task.train_stats(batch)
    assert stats["probe/answer_key_norm_biased"] == pytest.approx(norms[biased].mean().item(), rel=1e-6)
    assert stats["probe/answer_key_norm_unbiased"] == pytest.approx(norms[~biased].mean().item(), rel=1e-6)
    unbiased_only = (x, batch[1], torch.zeros_like(biased), answer)
    assert task.train_stats(unbiased_only)["probe/answer_key_norm_biased"].isnan()  # none of that kind
    twice = torch.func.vmap(task.train_stats)(tuple(torch.stack([t, t]) for t in batch))
    assert torch.equal(twice["probe/answer_key_norm_biased"], stats["probe/answer_key_norm_biased"].expand(2))


def test_success_and_answer_key_norms_are_logged_by_a_lightning_run(tmp_path):
    cfg, (datamodule, task) = build("task.success_threshold=0.0")
    trainer = pl.Trainer(**dict(cfg.trainer), logger=False, enable_checkpointing=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(task, datamodule)
    for name in ("biased", "unbiased"):
        assert trainer.callback_metrics[f"probe/answer_key_norm_{name}"] > 0, name
    trainer.test(task, datamodule, verbose=False)
    metrics = trainer.callback_metrics
    assert metrics["test/success"] == 1.0  # any accuracy reaches a threshold of 0
    assert 0.0 <= metrics["test/acc"] <= 1.0 and 0.0 <= metrics["test/acc_biased"] <= 1.0


def nets(variants: tuple[str, ...], heads: int = 1) -> list[RetrievalNet]:
    built = []
    for variant in variants:
        torch.manual_seed(0)
        built.append(RetrievalNet(16, 8, seq_len=8, heads=heads, hidden=16, attn_layer=attention_layer(variant=variant)))
    return built


@pytest.mark.parametrize("variant", list(EQUIVALENT))
def test_the_variants_it_drops_compute_what_their_base_computes(variant):
    net, base = nets((variant, EQUIVALENT[variant]))
    base.load_state_dict(net.state_dict())  # qknorm_hs keeps one gain per head: with one head, qknorm's shape
    x = torch.randn(4, 8, 16)
    assert torch.equal(net(x), base(x))
    assert equivalent_variant(variant, heads=1) == EQUIVALENT[variant]
    assert equivalent_variant("qknorm_hs", heads=2) == "qknorm_hs"


def test_each_token_brings_its_own_query_norm_under_quest_but_not_under_qknorm():
    """A larger token (its features scaled up) attends more sharply under QUEST, since its own query norm
    scales its logits; under QKNorm every row keeps one sharpness. With a constant query, as a learned
    readout query would be, the two would be the same function class."""
    x = torch.randn(2, 8, 16)
    scaled = x.clone()
    scaled[:, 3] *= 4.0
    for variant, changes in (("quest", True), ("qknorm", False)):
        (net,) = nets((variant,))
        torch.nn.init.zeros_(net.attn.in_proj_bias)  # no bias: scaling a token scales its query and key
        rows = [net.attn(t, need_weights=True)[1][:, 3] for t in (x, scaled)]
        assert torch.allclose(rows[0], rows[1], atol=1e-5) != changes, variant


def fake_run(root, variant: str, seed: int, lr: float, success: bool, status: str = "ok", extra=(),
             best_at: int | None = None, best_val: float = 0.5) -> None:
    """A run directory as a finished retrieval run leaves it: record and metrics.csv with key norms."""
    cfg = compose(["domain=retrieval", "preset=smoke", f"attention={variant}", f"seed={seed}", f"optim.lr={lr}",
                   f"output_dir={root}", *extra])
    record = new_record(cfg, get_domain("retrieval"), None)
    record.status = status
    if best_at is not None:
        record.best_val = BestValue(value=best_val, epoch=best_at - 1, evaluation=best_at, evaluations=32)
    if status == "ok":
        record.metrics = {"test/acc": 0.95 if success else 0.3, "test/acc_biased": 1.0, "test/success": float(success)}
    run_dir = run_directory(cfg)
    write_record(run_dir, record)
    rows = ["step,probe/answer_key_norm_biased,probe/answer_key_norm_unbiased,val/acc"]
    rows += [f"{step},{2.0 + step * (seed + 1)},3.0," for step in (9, 19)] + ["20,,,0.5"]  # a validation row
    (run_dir / "metrics.csv").write_text("\n".join(rows))


def test_the_report_counts_successes_with_wilson_intervals_and_draws_its_figures(tmp_path):
    low, high = report.wilson(5, 20)
    assert low == pytest.approx(0.1119, abs=1e-4) and high == pytest.approx(0.4687, abs=1e-4)
    assert report.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and math.isnan(report.wilson(0, 0)[0])
    for seed in range(3):
        fake_run(tmp_path, "standard", seed, 1e-2, success=seed == 0)
        fake_run(tmp_path, "quest", seed, 1e-2, success=True, status="diverged" if seed == 2 else "ok")
    fake_run(tmp_path, "quest", 0, 3e-2, success=False)
    table = report.rates(report.load(tmp_path), "variant")
    assert table.loc["standard", ["successes", "runs"]].tolist() == [1, 3]
    assert table.loc["quest", ["successes", "runs", "diverged"]].tolist() == [2, 4, 1]  # diverged: a failure
    curves = report.key_norm_curves(report.load(tmp_path), 1e-2, 0.01)
    assert curves["standard"]["probe/answer_key_norm_biased"][0.5].tolist() == [20.0, 40.0]  # median over seeds
    text = report.study(tmp_path, tmp_path / "report", 1e-2, 0.01)
    assert "| standard | 33.3% [" in text and "≡ standard (not run)" in text
    figures = ("success_heatmaps.png", "success_rates.png", "key_norms.png")
    assert all((tmp_path / "report" / f).exists() for f in figures)


def test_a_grid_with_its_control_is_reported_per_shortcut_share_never_pooled(tmp_path):
    """Plan 4's mechanism grid runs the task (p_bias 0.5) and its control (p_bias 0): a section and figures each."""
    for seed in range(2):
        fake_run(tmp_path, "standard", seed, 1e-2, success=False, extra=("data.p_bias=0.5",))
        fake_run(tmp_path, "standard", seed, 1e-2, success=True, extra=("data.p_bias=0.0",))
    text = report.study(tmp_path, tmp_path / "report", 1e-2, 0.01)
    shortcut, control = text.split("## With the shortcut (p_bias = 0.5)")[1].split("## Control without the shortcut (p_bias = 0)")
    assert "| standard | 0.0% [" in shortcut and "0/2" in shortcut and "| standard | 100.0% [" in control
    for share in ("0.5", "0"):
        assert all((tmp_path / "report" / f"{name}_p_bias{share}.png").exists()
                   for name in ("success_heatmaps", "success_rates", "key_norms"))


def test_an_earlier_reading_stands_beside_the_grid_at_its_own_shortcut_share(tmp_path):
    """Plan 3 read each variant at its own rate and best checkpoint; plan 4's grid reads the final one: a row each,
    with where validation peaked, and the grid's p_bias = 0 control left out of the comparison."""
    earlier, grid = tmp_path / "plan3", tmp_path / "plan4"
    for seed in range(2):
        fake_run(earlier, "standard", seed, 4e-4, success=False, best_at=2 + seed, best_val=0.4 + 0.1 * seed)
        for lr in (1e-2, 3e-2):
            for share, success in (("0.5", lr == 1e-2), ("0.0", True)):
                fake_run(grid, "standard", seed, lr, success=success, best_at=30,
                         extra=(f"data.p_bias={share}", "test_checkpoint=last"))
    text = report.study(grid, tmp_path / "report", 1e-2, 0.01, earlier=earlier)
    rows = text.split("Beside an earlier reading")[1]
    assert "| standard | earlier | 0.0004 | 0.01 | 1 | best | 0.0% [0.0%, " in rows and "| 2.5 of 32 | 0.450 |" in rows
    assert "| standard | this grid | 0.01–0.03 (2 values) | 0.01 | 1 | last | 50.0% [" in rows
    assert "| 30 of 32 | 0.500 |" in rows
    assert "beside this grid's 4 at the same shortcut share (p_bias 0.5)" in rows
    with pytest.raises(FileNotFoundError, match="no retrieval run records"):
        report.study(grid, tmp_path / "report", 1e-2, 0.01, earlier=tmp_path / "none")


@pytest.mark.parametrize("variant", ["standard", "quest", "qnorm", "qknorm", "qknorm_ds"])
def test_the_faithful_model_reads_labels_only_through_where_attention_goes(variant):
    """q and k come from x^k alone (no bias), the values are the one-hot labels, the prediction is the tokens'
    mean attention output: a distribution over labels, so its exponent sums to 1. With the answer's key far
    out and q = k along it, standard attention (whose logit grows with both norms) reads the answer."""
    cfg, (datamodule, task) = build("model.form=faithful", f"attention={variant}")
    net = task.net
    assert not any("bias" in name for name, _ in net.named_parameters())
    assert net.q_proj.in_features == cfg.data.key_dim == net.k_proj.in_features
    datamodule.setup("fit")
    x, labels, _, answer = next(iter(datamodule.train_dataloader()))
    scores = net(x)
    assert scores.shape == (len(x), cfg.data.num_classes)
    assert torch.allclose(scores.exp().sum(1), torch.ones(len(x)), atol=1e-4)
    # the labels reach the output only through the values: permuting the one-hot part permutes the scores
    perm = torch.randperm(cfg.data.num_classes, generator=torch.Generator().manual_seed(0))
    moved = torch.cat([x[..., :cfg.data.key_dim], x[..., cfg.data.key_dim:][..., perm]], dim=-1)
    assert torch.allclose(net(moved), scores[:, perm], atol=1e-5)
    keys = net.keys(x)
    assert torch.allclose(keys, x[..., :cfg.data.key_dim] @ net.k_proj.weight.T)


def test_faithful_ablations_project_the_whole_token_or_add_biases_and_reject_unknown_inputs():
    _, (_, task) = build("model.form=faithful", "model.qk_input=token", "model.qk_bias=true")
    assert task.net.q_proj.in_features == 8 + 8 and task.net.k_proj.bias is not None
    with pytest.raises(ConfigError, match=r"^unknown model.qk_input='values'; choose from key, token$"):
        build("model.form=faithful", "model.qk_input=values")
    with pytest.raises(ConfigError, match=r"^unknown model.form='paper'; choose from full_token, faithful$"):
        build("model.form=paper")


def test_standard_attention_finds_a_far_out_answer_in_the_faithful_model():
    """A hand-set model: q = k = x^k. The answer's key is 10x the others', so its self-logit ‖k‖²/√d wins
    every row under standard attention, and every token's output is the answer's label."""
    _, (_, task) = build("model.form=faithful", "attention=standard")
    net = task.net
    with torch.no_grad():
        net.q_proj.weight.copy_(torch.eye(8))
        net.k_proj.weight.copy_(torch.eye(8))
    x = torch.zeros(1, 8, 16)
    x[0, :, :8] = 0.3 * torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    x[0, 3, :8] = torch.full((8,), 3.0)
    x[0, torch.arange(8), 8 + torch.arange(8)] = 1.0  # token i carries label i
    assert net(x).argmax(1).item() == 3


def test_the_shortcut_oracles_conflict_for_a_weak_bias_and_agree_for_a_strong_one():
    data = Data(**SPEC, bias_seed=7, answer_kappa=1.0, answer_basis_seed=0)
    weak, strong = (shortcut_oracles(data, norm, n=4000) for norm in (1.0, 8.0))
    assert weak["nearest_b_acc"] > 0.95 and strong["nearest_b_acc"] > 0.95  # the shortcut always finds a biased answer
    assert weak["largest_norm_acc"] < 0.05 and weak["disagree"] > 0.95  # a weak b: the norm rule misses it
    assert strong["largest_norm_acc"] > 0.95 and strong["disagree"] < 0.05  # a strong b: the two rules agree
    text = report.shortcut(Path(tempfile.mkdtemp()))
    assert "Chosen: data.bias_norm = 3.5." in text and "| 4 | 0.75" in text


def test_the_ablation_report_gives_each_variant_a_row_per_factor_cell(tmp_path):
    faithful = ["model.form=faithful"]
    for seed in range(2):
        fake_run(tmp_path, "qknorm", seed, 1e-2, success=seed == 0, extra=[*faithful, "model.qk_bias=true"])
        fake_run(tmp_path, "qknorm", seed, 1e-2, success=False, extra=faithful)
    text = report.ablations(tmp_path, tmp_path / "report")
    assert "| qknorm | q, k from x^k, no bias | 0.0% [" in text and "| 0/2 |" in text
    assert "| qknorm | q, k from x^k, with bias | 50.0% [" in text
    assert (tmp_path / "report" / "ablations.md").exists()


def aniso_data(kappa: float, **changes) -> Data:
    return Data(**{**SPEC, "p_bias": 0.0, "bias_norm": 4.0, "bias_seed": 7, "answer_kappa": kappa,
                   "answer_basis_seed": 3, "train_size": 30000, "val_size": 1, "test_size": 1, **changes})


def test_the_anisotropic_answer_has_the_covariance_it_claims():
    p, std = SPEC["key_dim"], SPEC["answer_std"]
    spectrum = answer_spectrum(p, 50.0)
    assert spectrum.mean().item() == pytest.approx(1.0) and (spectrum[0] / spectrum[-1]).item() == pytest.approx(50.0)
    assert torch.all(spectrum[1:] / spectrum[:-1] - spectrum[1] / spectrum[0] < 1e-5)  # geometric
    shape = answer_shape(p, 50.0, seed=3)
    sigma = std ** 2 * shape @ shape.T
    assert torch.linalg.eigvalsh(sigma).flip(0) == pytest.approx(std ** 2 * spectrum, rel=1e-4)
    assert torch.trace(sigma).item() == pytest.approx(p * std ** 2, rel=1e-4)  # the isotropic design's trace
    x, _, _, answer = generated(aniso_data(50.0), seed=0)["train"].tensors
    answers = x[torch.arange(len(x)), answer, :p]
    empirical = answers.T @ answers / len(answers)  # mean zero by design
    assert (empirical - sigma).abs().max().item() < 0.06 * sigma.diagonal().max().item()
    assert not torch.allclose(sigma, sigma.diagonal().diag(), atol=0.5)  # rotated off the coordinate axes
    assert torch.equal(answer_shape(p, 50.0, seed=3), shape) and not torch.equal(answer_shape(p, 50.0, seed=4), shape)


def test_kappa_one_draws_exactly_what_the_isotropic_task_drew():
    """The draws of the sampler as it was before Sigma could be anisotropic, pinned by their digest: runs with
    answer_kappa 1 (every preset and sweep before the option) see the same data."""
    assert answer_shape(SPEC["key_dim"], 1.0, seed=3) is None
    out = make_retrieval(500, bias=bias_vector(6, 4.0, 7), generator=torch.Generator().manual_seed(11), **SPEC)
    digest = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in out)).hexdigest()
    assert digest == "258292e0376effcd24ac6103f7b85044b5e9e92d567e95f550c8d9a713084eff"
    split = generated(aniso_data(1.0, train_size=50), seed=2)["train"].tensors
    again = make_retrieval(50, p_bias=0.0, bias=bias_vector(6, 4.0, 7), generator=torch.Generator().manual_seed(2), **{
        k: v for k, v in SPEC.items() if k != "p_bias"})
    assert all(torch.equal(a, b) for a, b in zip(split, again))


def test_the_answer_direction_is_a_distractors_at_kappa_one_and_not_above():
    """The direction-only oracle (unit keys, the likelihood-ratio choice) finds the answer at chance when Sigma is
    isotropic, where the norm oracle finds it, and well above chance when it is not."""
    chance = 1 / SPEC["num_tokens"]
    flat, tilted = (direction_oracles(aniso_data(kappa), n=8000) for kappa in (1.0, 100.0))
    assert abs(flat["direction_acc"] - chance) < 4 * math.sqrt(chance * (1 - chance) / 8000)
    assert tilted["direction_acc"] > 5 * chance
    assert flat["largest_norm_acc"] > 0.8


def test_seeds_are_sized_for_a_twenty_point_difference():
    """statsmodels' answer against the closed form per group n = 2 ((z_0.975 + z_0.8) / h)², Cohen's h of 40% vs 60%."""
    h = 2 * math.asin(math.sqrt(0.6)) - 2 * math.asin(math.sqrt(0.4))
    assert anisotropy.runs_needed() == math.ceil(2 * ((1.959964 + 0.841621) / h) ** 2) == 97
    assert anisotropy.seeds_needed() * anisotropy.GRID_CELLS >= anisotropy.runs_needed()
    assert anisotropy.runs_needed(alpha=0.0125) > anisotropy.runs_needed()


def test_the_aniso_report_tests_contrasts_per_cell_with_holm_and_names_each_reading(tmp_path):
    for kappa, quest_wins in ((1.0, 0), (1000.0, 12)):
        extra = [f"data.answer_kappa={kappa}", "model.form=faithful"]
        for seed in range(12):
            fake_run(tmp_path, "quest", seed, 1e-2, success=seed < quest_wins, extra=extra)
            fake_run(tmp_path, "qknorm", seed, 1e-2, success=False, extra=extra)
    tests = anisotropy.contrasts(report.load(tmp_path))
    assert len(tests) == 2 and set(tests["kappa"]) == {1.0, 1000.0}  # standard not run: no quest-standard contrast
    top = tests.set_index("kappa").loc[1000.0]
    assert top["a_counts"] == "12/12" and top["b_counts"] == "0/12" and top["difference"] == 1.0
    assert top["p"] == pytest.approx(2 / math.comb(24, 12))  # Fisher: only the two extreme tables are as unlikely
    assert top["p_holm"] == pytest.approx(2 * top["p"]) and tests.set_index("kappa").loc[1.0, "p_holm"] == 1.0
    assert "direction carries no signal" in anisotropy.reading(1.0, 0.5, 1 / 64)
    assert "control without the shortcut" in anisotropy.reading(100.0, 0.0, 0.87)
    text = anisotropy.write_report(tmp_path, tmp_path / "report")
    assert "| 1000 | 0.5 | quest − qknorm | 12/12 vs 0/12 | +100.0% |" in text
    assert ("### κ = 1, p_bias = 0.5 — run in part (the design: 112 runs per variant)\n\n"
            "Reading: the paper's task (shortcut on half the samples); Sigma read as a scaled") in text
    assert "### κ = 1000, p_bias = 0.5 (the headline cell) — run in part (the design: 112 runs per variant)" in text
    assert "- κ = 10, p_bias = 0: standard, quest, qknorm, qknorm_ds, qnorm not run" in text
    assert "Holm's family is the 2 contrasts run so far, of the design's 16" in text
    assert "- κ = 1000, p_bias = 0.5: standard, qknorm_ds, qnorm not run; in part: quest 12 of 112 runs, qknorm 12 of 112 runs" in text
    assert (tmp_path / "report" / "success_by_kappa.png").exists()
