import torch

from domains.retrieval.data import bias_vector, make_retrieval
from runners.train import train

SPEC = dict(num_tokens=12, key_dim=6, num_classes=5, answer_std=2.5, p_bias=0.5, bias_std=0.316)


def sample(n=4000, seed=0):
    bias = bias_vector(SPEC["key_dim"], 4.0, seed=7)
    return bias, make_retrieval(n, bias=bias, generator=torch.Generator().manual_seed(seed), **SPEC)


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


def test_smoke_run_records_success_and_answer_key_norms(run_args):
    record = train(["domain=retrieval", "preset=smoke", "attention=quest", "probes.every_n_steps=1", *run_args])
    assert record["status"] == "ok"
    assert record["metrics"]["test/success"] in (0.0, 1.0)
    assert 0.0 <= record["metrics"]["test/acc"] <= 1.0 and "test/acc_biased" in record["metrics"]
    import pandas as pd
    from pathlib import Path

    log = pd.read_csv(Path(record["config"]["output_dir"]).rglob("metrics.csv").__next__())
    assert log["probe/answer_key_norm_biased"].notna().any() and log["probe/max_logit"].notna().any()
