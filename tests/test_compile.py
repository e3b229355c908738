"""``compile.enabled``: every variant's attention compiles whole, a compiled training step equals the eager one to
float tolerance, and ``quest bench --model ... --compile`` reports both."""

import pytest
import torch

from common.attention import ABLATIONS, VARIANTS, EdgeMultiheadAttention, MultiheadAttention
from common.attention.state import AttentionState
from common.records import read_record
from runners.cli import main as cli
from runners.config import compose, config_hash
from runners.runs.compilebench import measure_compiled, planned_steps
from runners.runs.stepbench import bare_loop, build, train_batches


def _graph_breaks(fn, *args) -> list[str]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args)
    return [str(reason.reason) for reason in explained.break_reasons]


@pytest.mark.parametrize("variant", [*VARIANTS, *ABLATIONS])
def test_attention_core_compiles_without_a_graph_break(variant):
    torch.manual_seed(0)
    mha = MultiheadAttention(16, 2, variant, seq_len=6)
    x = torch.randn(3, 6, 16)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[1, 4:] = True
    padding[2] = True  # a sample with no key at all: its output is zeroed
    bias = torch.randn(3, 2, 6, 6)

    def two_layers(x):  # the second layer reads the first's values (elliptical variants)
        state = AttentionState()
        y = mha(x, key_padding_mask=padding, attn_bias=bias, state=state)[0]
        return mha(y, is_causal=True, state=state)[0].sum()

    assert _graph_breaks(two_layers, x) == []


@pytest.mark.parametrize("variant", [*VARIANTS, *ABLATIONS])
def test_edge_attention_compiles_without_a_graph_break(variant):
    torch.manual_seed(0)
    attn = EdgeMultiheadAttention(16, 2, variant)
    x, batch = torch.randn(7, 16), torch.tensor([0, 0, 0, 0, 1, 1, 1])
    edge_index = torch.tensor([[0, 1, 2, 3, 1, 4, 5, 6, 5], [1, 0, 3, 2, 2, 5, 6, 4, 4]])

    def two_layers(x):
        state = AttentionState()
        y = attn(x, edge_index, batch=batch, state=state)
        return attn(y, edge_index, batch=batch, state=state).sum()

    assert _graph_breaks(two_layers, x) == []


def _parameters_after(args, steps: int, compiled: bool) -> dict[str, torch.Tensor]:
    cfg, datamodule, task = build(args)
    if compiled:
        torch._dynamo.reset()
        task.compile_training()
    bare_loop(cfg, task, train_batches(datamodule, steps))()
    return {name: p.detach().clone() for name, p in task.named_parameters()}


@pytest.mark.slow
def test_a_compiled_training_step_equals_the_eager_one_to_float_tolerance(tmp_path):
    """Same seed, same batches, five AdamW steps: inductor's code reorders float sums and QUEST's key normalisation
    runs as the formula instead of the fused kernels, so the weights agree to rounding, not to the bit."""
    args = ["domain=vision", "preset=smoke", "attention=quest", f"cache_dir={tmp_path}"]
    eager, compiled = (_parameters_after(args, 5, flag) for flag in (False, True))
    moved = max((compiled[name] - p).abs().max().item() for name, p in _parameters_after(args, 0, False).items())
    assert moved > 1e-3  # the steps changed the weights, so agreeing below says something
    for name, p in eager.items():
        torch.testing.assert_close(compiled[name], p, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_quest_train_compiles_into_the_same_run(run_args, tmp_path):
    """compile.enabled is a speed setting: the run keeps the eager run's directory (hash), the record says it was
    compiled, and the test metrics agree with the eager run's."""
    args = ["train", "domain=vision", "preset=smoke", "attention=quest", "probes.every_n_steps=2", *run_args]
    assert cli([*args, "compile.enabled=true", "output_dir=" + str(tmp_path / "compiled")]) == 0
    assert cli(args) == 0
    (compiled,) = (tmp_path / "compiled").rglob("record.json")
    (eager,) = (tmp_path / "runs").rglob("record.json")
    assert compiled.parent.name == eager.parent.name
    compiled, eager = map(read_record, (compiled, eager))
    assert compiled.setting("compile") == {"enabled": True, "mode": "default"}
    assert compiled.probes and compiled.probes.keys() == eager.probes.keys()  # probe steps ran (eagerly)
    for name, value in eager.metrics.items():
        assert compiled.metrics[name] == pytest.approx(value, rel=1e-3, abs=1e-4), name


def test_compile_is_out_of_the_hash_and_its_mode_is_checked(tmp_path, capsys):
    base = ["domain=vision", "preset=smoke"]
    assert config_hash(compose(base)) == config_hash(compose([*base, "compile.enabled=true", "compile.mode=max-autotune"]))
    assert cli(["train", *base, "compile.mode=fastest", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "compile.mode='fastest'" in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_planned_steps_follows_the_trainer_settings(tmp_path):
    def planned(*overrides):
        cfg, datamodule, _ = build(["domain=vision", "preset=smoke", f"cache_dir={tmp_path}", *overrides])
        return planned_steps(cfg, datamodule), len(datamodule.train_dataloader())

    assert planned()[0] == 3  # the smoke preset: one epoch of limit_train_batches=3
    assert planned("trainer.max_epochs=3", "trainer.limit_train_batches=2", "trainer.accumulate_grad_batches=2")[0] == 3
    steps, batches = planned("trainer.max_epochs=2", "trainer.limit_train_batches=0.5")
    assert steps == 2 * -(-batches // 2)
    assert planned("trainer.max_steps=7")[0] == 7


@pytest.mark.slow
def test_bench_reports_eager_and_compiled_per_variant(tmp_path):
    # a batch of 64: at the smoke preset's 16 a compiled step's buffers are too small to show in resident memory
    result = measure_compiled(["domain=vision", "preset=smoke", "data.batch_size=64", f"cache_dir={tmp_path}"],
                              ["quest"], steps=2, rounds=1)
    assert list(result["variants"]) == ["quest"]
    for row in result["variants"].values():
        assert row["eager_steps_per_s"] > 0 and row["compiled_steps_per_s"] > 0
        assert row["speedup"] == pytest.approx(row["compiled_steps_per_s"] / row["eager_steps_per_s"])
        assert row["compile_cold_s"] >= 0 and row["compile_warm_s"] >= 0  # which is faster is the bench's to say
        assert row["peak_mb_eager"] > 0 and row["peak_mb_compiled"] > 0


def test_bench_refuses_an_unknown_compile_mode(capsys):
    assert cli(["bench", "--model", "domain=vision", "preset=smoke", "--compile", "fastest"]) == 2
    assert "not a torch.compile mode" in capsys.readouterr().err
