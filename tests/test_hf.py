"""The variants inside Hugging Face transformers models (common.hf), on tiny models built from configs: logits and
attention weights equal a hand-written eager reference for every registered variant on four causal-LM architectures,
`standard` equals the library's own SDPA on seven, cached generation equals uncached, training steps reach every
weight and scale, probes, bf16 autocast, the language domain's transformers architectures (training, sampling, the
bench), and the one-line error without the extra. What the backends honour and refuse, and saving and reloading:
tests/test_hf_backend.py."""
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from common import hf, probes  # noqa: E402  (registers the backends)
from common.errors import ConfigError  # noqa: E402
from common.patch import replace_attention  # noqa: E402
from common.schema import Attention  # noqa: E402

VOCAB = 64
# Tiny configs in each library config's own names: Llama and Qwen3 with grouped-query attention (4 query heads on 2
# key/value heads; Qwen3 also RMS-normalises q and k per head before its rotation), GPT-NeoX with rotary positions on
# a quarter of each head, GPT-2 with learned positions and a fused q/k/v projection.
CAUSAL = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 32},
    "qwen3": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 32},
    "gpt_neox": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                 "max_position_embeddings": 32},
    "gpt2": {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 32},
}
ENCODERS = {
    "bert": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    "vit": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
            "image_size": 16, "patch_size": 8},
    "t5": {"d_model": 32, "d_kv": 8, "num_heads": 4, "num_layers": 2, "d_ff": 64},  # relative position bias
}


def causal_lm(arch: str, attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(arch, vocab_size=VOCAB, **{**CAUSAL[arch], **overrides})
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def with_variant(model, variant: str):
    """``model`` running ``variant``; learnable scales moved off their initial values, so a stale fold shows."""
    replace_attention(model, variant)
    for name, p in model.named_parameters():
        if ".qk." in name:
            p.data.uniform_(0.5, 2.0)
    return model


def batch():
    """Two sequences of 7 tokens, the first left-padded by 2."""
    ids = torch.randint(VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :2] = 0
    return ids, mask


# --- the hand-written reference: every variant's logits written out, eager softmax over transformers' float mask ---

def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def _reference(variant: str, values: dict):
    spec = hf.get_variant(variant)

    def forward(module, q, k, v, mask, dropout=0.0, scaling=None, **kwargs):
        groups = getattr(module, "num_key_value_groups", 1)
        layer, fold = module.layer_idx, getattr(module, "qk", None)
        prev, values[layer] = values.get(layer - 1) if layer else None, v
        if spec.elliptical and prev is not None:  # m: mean |v^l - v^(l-1)| over the keys each query sees, / its max
            visible = (mask > torch.finfo(mask.dtype).min).float()  # the eager mask is always written out
            m = visible @ (v - prev).abs() / visible.sum(-1, keepdim=True).clamp_min(1)
            peak = m.amax(-1, keepdim=True)
            q = q * torch.where(peak > 1e-6, m / peak.clamp_min(1e-6), 1.0).repeat_interleave(groups, 1)
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        logits = {
            "standard": lambda: q @ k.mT * scaling,
            "quest": lambda: q @ _unit(k).mT,
            "qnorm": lambda: _unit(q) @ k.mT,
            "qknorm": lambda: fold.gain * (_unit(q) @ _unit(k).mT),
            "qknorm_hs": lambda: fold.gain[:, None, None] * (_unit(q) @ _unit(k).mT),
            "qknorm_ds": lambda: (fold.q_scale * _unit(q)) @ (fold.k_scale * _unit(k)).mT,
            "elliptical": lambda: q @ k.mT * scaling,
            "elliptical_quest": lambda: q @ _unit(k).mT,
            "qk_layernorm": lambda: fold.reference_logits(q, k) * scaling,  # the fold's LayerNorms written out
            "uniform": lambda: torch.zeros(*q.shape[:-1], k.shape[2]),
        }[variant]()
        if mask is not None:
            logits = logits + mask
        weights = logits.softmax(-1)
        return (weights @ v).transpose(1, 2), weights

    return forward


@pytest.mark.parametrize("variant", hf.BACKENDS)
@pytest.mark.parametrize("arch", CAUSAL)
def test_logits_equal_a_hand_written_reference(arch, variant):
    values = {}
    name = f"reference_{variant}"
    transformers.AttentionInterface.register(name, _reference(variant, values))
    transformers.masking_utils.AttentionMaskInterface.register(name, transformers.masking_utils.eager_mask)
    model = with_variant(causal_lm(arch), variant)
    ids, mask = batch()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, output_attentions=True)
        model.config._attn_implementation = name
        reference = model(ids, attention_mask=mask, output_attentions=True)
    seen = mask.bool()  # a padding query sees no key: SDPA returns zeros there, the eager softmax a plain mean
    torch.testing.assert_close(ours.logits[seen], reference.logits[seen], atol=1e-5, rtol=1e-5)
    if arch != "gpt2":  # output_attentions, per layer (GPT-2 returns them from its eager implementation only)
        for weights, expected in zip(ours.attentions, reference.attentions, strict=True):
            torch.testing.assert_close(weights.transpose(1, 2)[seen], expected.transpose(1, 2)[seen], atol=1e-5, rtol=1e-5)
    ours = ours.logits
    # the variant ran, not the library's attention; but Qwen3 RMS-normalises q and k per head (weights start at 1), so
    # until those weights move, QUEST's ‖q‖·cos and qnorm's ‖k‖·cos equal its q·k/√d
    if variant != "standard" and not (arch == "qwen3" and variant in ("quest", "qnorm")):
        assert not torch.allclose(ours, causal_lm(arch)(ids, attention_mask=mask).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", [*CAUSAL, *ENCODERS])
def test_standard_computes_what_the_librarys_sdpa_does(arch):
    config = transformers.AutoConfig.for_model(arch, **({} if arch == "vit" else {"vocab_size": VOCAB}),
                                               **{**CAUSAL, **ENCODERS}[arch])
    ids, mask = batch()
    inputs = ({"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))} if arch == "vit"
              else {"input_ids": ids, "attention_mask": mask} | ({"decoder_input_ids": ids} if arch == "t5" else {}))
    outputs = []
    for implementation in ("sdpa", "standard"):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(config, attn_implementation=implementation).eval()
        with torch.no_grad():
            outputs.append(model(**inputs).last_hidden_state)
    torch.testing.assert_close(*outputs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", hf.BACKENDS)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cached_generation_equals_uncached(arch, variant):
    model = with_variant(causal_lm(arch), variant)
    ids, mask = batch()
    runs = [model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=cache,
                           output_logits=True, return_dict_in_generate=True, pad_token_id=0) for cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences) and runs[0].sequences.shape == (2, 13)
    torch.testing.assert_close(torch.stack(runs[0].logits), torch.stack(runs[1].logits), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,scales", [("quest", 0), ("qknorm_hs", 3), ("qknorm_ds", 6), ("elliptical_quest", 0)])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_training_step_reaches_every_weight_and_scale(arch, variant, scales):
    model = with_variant(causal_lm(arch, attention_dropout=0.1) if arch == "llama" else causal_lm(arch, attn_pdrop=0.1),
                         variant).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ids, mask = batch()
    loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    assert torch.isfinite(loss)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unchanged, unchanged
    assert sum(".qk." in name for name in before) == scales  # per layer: one gain tensor, or c_q and c_k


@pytest.mark.parametrize("variant", ["qknorm", "elliptical"])
def test_variants_with_per_layer_parts_ask_for_replace_attention(variant):
    model = causal_lm("llama", variant)
    with pytest.raises(ValueError, match=rf"replace_attention\(model, '{variant}'\)"):
        model(batch()[0])


def test_probes_see_every_layer_and_quest_bounds_each_logit_by_its_query_norm():
    model = causal_lm("gpt2")
    report = replace_attention(model, "quest")
    assert list(report.replaced) == [f"transformer.h.{i}.attn" for i in range(3)] and not report.skipped
    found = probes.attention_probes(model)
    assert len(found) == 3
    for probe in found.values():
        probe.enabled = True
    ids, mask = batch()
    model(ids, attention_mask=mask)
    for probe in found.values():
        stats = probe.stats
        assert set(stats) == set(probes.STATS) and all(torch.isfinite(v) for v in stats.values())
        assert stats["max_logit"] <= stats["q_norm_max"] * (1 + 1e-5)  # |q·k̂| <= ‖q‖


def test_layers_that_do_not_call_the_interface_are_left_alone():
    config = transformers.AutoConfig.for_model("bloom", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(config)
    report = replace_attention(model, "quest")
    assert not report.replaced and set(report.skipped) == {"transformer.h.0.self_attention", "transformer.h.1.self_attention"}


def test_keys_are_normalised_in_float32_under_bf16_autocast(monkeypatch):
    model = with_variant(causal_lm("llama"), "quest")
    ids, mask = batch()
    calls, fold = [], hf.fold_qk

    def recorded_fold(q, k, *args, **kwargs):
        calls.append((q.dtype, k.dtype, torch.is_autocast_enabled("cpu")))
        return fold(q, k, *args, **kwargs)

    with torch.no_grad():
        exact = model(ids, attention_mask=mask).logits
        monkeypatch.setattr(hf, "fold_qk", recorded_fold)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, attention_mask=mask).logits
    assert len(calls) == 3 and set(calls) == {(torch.float32, torch.float32, False)}
    seen = mask.bool()
    torch.testing.assert_close(low[seen].float(), exact[seen], atol=0.05, rtol=0.05)


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers.modeling_utils", None)
    monkeypatch.delitem(sys.modules, "common.hf")
    with pytest.raises(ConfigError, match=r"transformers.modeling_utils cannot be imported.*pip install 'quest-study\[hf\]'"):
        import common.hf  # noqa: F401


def test_a_transformers_architecture_without_the_extra_is_one_line_naming_it(monkeypatch, run_args, capsys):
    from runners.cli import main as cli

    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if the package were not installed
    assert cli(["train", "domain=language", "preset=smoke", "model.arch=gpt2", *run_args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'quest-study[hf]'" in err


def test_the_attention_core_patcher_and_integration_import_with_torch_alone():
    """Neither Lightning, PyG, OmegaConf, timm nor the study's own layers above common load with them."""
    blocked = ["lightning", "pytorch_lightning", "lightning_fabric", "torchmetrics", "torch_geometric", "omegaconf",
               "timm", "runners", "domains"]
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError("blocked: " + name, name=name)  # as if not installed
sys.meta_path.insert(0, Block())
import common.attention, common.patch, common.probes, common.hf
from common.attention import attend, MultiheadAttention
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


# --- the language domain on transformers architectures ---------------------------------------------------------------

@pytest.mark.parametrize("variant", hf.BACKENDS)
def test_the_language_domain_builds_every_variant_into_a_transformers_architecture(variant):
    from domains.language.hf import TransformersLM

    size = {"dim": 16, "depth": 2, "heads": 2, "mlp_ratio": 2.0, "dropout": 0.0, "attn_dropout": 0.0, "tie_weights": True}
    net = TransformersLM(VOCAB, arch="llama", context=8, attention=Attention(variant=variant, l2norm_kernel="formula"),
                         **size)
    layers = [m for m in net.modules() if hf.is_attention(m)]
    assert len(layers) == 2 and all(layer.qk.variant.name == variant and not layer.qk.fused for layer in layers)
    assert net.model.config._attn_implementation == variant
    tokens = torch.randint(VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    logits = net(tokens)
    logits.logsumexp(-1).mean().backward()
    assert logits.shape == (2, 8, VOCAB)
    # every weight takes part, but the uniform ablation's query projections, whose output it zeroes
    assert {name for name, p in net.named_parameters() if p.grad is None} == (
        {f"model.model.layers.{i}.self_attn.q_proj.weight" for i in range(2)} if variant == "uniform" else set())


@pytest.mark.parametrize("arch,variant", [("llama", "qknorm_hs"), ("qwen3", "quest"), ("gpt_neox", "elliptical_quest"),
                                          ("gpt2", "qknorm_ds")])
def test_quest_train_trains_and_quest_generate_samples_a_transformers_architecture(arch, variant, run_args, capsys):
    from common.records import find_records, read_record
    from runners.cli import main as cli

    assert cli(["train", "domain=language", "preset=smoke", f"attention={variant}", f"model.arch={arch}", *run_args]) == 0
    assert f"ok: language/{variant} seed 0" in capsys.readouterr().out
    (path,) = find_records(run_args[0].split("=", 1)[1])
    record = read_record(path)
    assert record.setting("model.arch") == arch and record.status == "ok"
    assert set(record.probes) == {*probes.STATS, *(f"peak_{stat}" for stat in probes.PEAKED)}
    assert all(v == v for v in record.probes.values())  # finite
    assert cli(["generate", str(path.parent), "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("def ")


@pytest.mark.parametrize("override,message", [("model.arch=bert", "unknown model.arch='bert'"),
                                              ("model.dropout=0.1", "model.arch=llama has no residual dropout"),
                                              ("model.init=torch", "model.init=torch is for model.arch=gpt")])
def test_a_transformers_architecture_refuses_what_it_cannot_take_in_one_line(override, message, run_args, capsys):
    from runners.cli import main as cli

    args = ["train", "domain=language", "preset=smoke", "model.arch=llama", override, *run_args]
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_our_gpt_keeps_the_run_directories_it_had_before_model_arch():
    from runners.config import as_dict, compose, config_hash

    cfg = compose(["domain=language", "preset=demo"])
    before = as_dict(cfg)
    del before["model"]["arch"]
    assert config_hash(cfg) == config_hash(before)
    assert config_hash(compose(["domain=language", "preset=demo", "model.arch=llama"])) != config_hash(cfg)


def test_the_language_bench_times_a_transformers_architecture_beside_our_gpt(monkeypatch, capsys):
    import domains.language.bench as bench

    seconds = {"torch": 2.0, "standard": 1.0, "quest": 4.0, "llama quest": 8.0, "llama sdpa": 2.0,
               "with cache": 0.5, "without cache": 2.5}

    def timed(jobs, rounds, device, warmup=1):
        for job in jobs.values():
            job()
        return {name: seconds[name] for name in jobs}

    monkeypatch.setattr(bench, "interleaved_seconds", timed)
    result = bench.main(["--dim", "16", "--depth", "1", "--heads", "2", "--context", "8", "--batch-size", "2",
                         "--steps", "1", "--rounds", "1", "--new-tokens", "2", "--threads", "1", "--hf", "llama"])
    assert result["llama quest/quest"] == pytest.approx(0.5) and result["llama quest/llama sdpa"] == pytest.approx(0.25)
    out = capsys.readouterr().out
    assert "train llama quest" in out and "train llama sdpa" in out


@pytest.mark.parametrize("arch,variant", [("llama", "quest"), ("gpt2", "qknorm_ds"), ("gpt_neox", "elliptical")])
def test_the_language_domains_sampler_decodes_a_transformers_architecture_with_the_cache(arch, variant):
    from domains.language.hf import TransformersLM
    from domains.language.model import generate

    torch.manual_seed(0)
    size = {"dim": 16, "depth": 2, "heads": 2, "mlp_ratio": 2.0, "dropout": 0.0, "attn_dropout": 0.0, "tie_weights": True}
    net = TransformersLM(VOCAB, arch=arch, context=12, attention=Attention(variant=variant), **size).eval()
    prompt = torch.randint(VOCAB, (2, 3), generator=torch.Generator().manual_seed(2))
    # 20 new tokens run past the context of 12, where both re-encode the last 12 tokens each step
    cached = generate(net, prompt, 20, temperature=0)
    assert torch.equal(cached, generate(net, prompt, 20, temperature=0, use_cache=False)) and cached.shape == (2, 23)
