"""The transformers backends (common.hf) never silently wrong: every keyword the installed library's models pass to
an attention function is honoured or refused (a scan of its sources), attention sinks and a top-k indexer's keys are
honoured as the library's own eager attention and SDPA paths compute them, features no variant computes and masks
SDPA would refuse are refused in one line naming them, elliptical variants are exact under gradient checkpointing, a
model saved under a variant reloads with it and its learnt scales, and grouped-query attention reaches SDPA without
copies. Tiny models built from configs, float32 unless said."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

from common import hf  # noqa: E402  (registers the backends)
from common.errors import ConfigError  # noqa: E402
from common.patch import replace_attention  # noqa: E402

VOCAB = 64
MODELS = Path(transformers.__file__).parent / "models"


def build(arch: str, implementation: str, seed: int = 0, **config):
    torch.manual_seed(seed)
    settings = transformers.AutoConfig.for_model(arch, vocab_size=VOCAB, bos_token_id=None, eos_token_id=None,
                                                 pad_token_id=None, **config)
    return transformers.AutoModelForCausalLM.from_config(settings, attn_implementation=implementation).eval()


def batch(length: int = 9):
    """Two sequences, the first left-padded by 2."""
    ids = torch.randint(VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[0, :2] = 0
    return ids, mask


def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


# --- every keyword an attention call can pass -----------------------------------------------------------------------

def _is_attention_function(node: ast.expr, names: set[str]) -> bool:
    """A call's function is an attention function: looked up in ALL_ATTENTION_FUNCTIONS, named *eager_attention_forward
    or *attention_interface, or a local name assigned from one of those."""
    def mentions(expr):
        return any(isinstance(n, ast.Name) and (n.id == "ALL_ATTENTION_FUNCTIONS" or n.id.endswith("eager_attention_forward"))
                   for n in ast.walk(expr))
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return mentions(node) or name in names or (name or "").endswith("attention_interface")


def attention_keywords() -> dict[str, set[str]]:
    """keyword -> the models whose modelling code passes it to an attention function."""
    found: dict[str, set[str]] = {}
    for path in sorted(MODELS.glob("*/modeling_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            assigned = {target.id for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        and n.value is not None and _is_attention_function(n.value, set())
                        for target in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(target, ast.Name)}
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                if _is_attention_function(call.func, assigned):
                    for keyword in call.keywords:
                        if keyword.arg is not None:
                            found.setdefault(keyword.arg, set()).add(path.parent.name)
    return found


def test_every_keyword_the_librarys_models_pass_to_attention_is_honoured_ignored_or_refused():
    found = attention_keywords()
    assert {"dropout", "scaling", "s_aux", "indices", "softcap"} <= set(found)  # the scan sees the calls
    known = hf.HONOURED | hf.IGNORED | set(hf.REFUSED)
    assert not hf.HONOURED & hf.IGNORED and not (hf.HONOURED | hf.IGNORED) & set(hf.REFUSED)
    unknown = {keyword: sorted(models)[:5] for keyword, models in found.items() if keyword not in known}
    assert not unknown, f"attention keywords common.hf neither honours, ignores nor refuses: {unknown}"


def test_every_keyword_a_model_hands_on_from_its_caller_is_known():
    kwargs = transformers.utils.generic.TransformersKwargs
    passed_on = kwargs.__required_keys__ | kwargs.__optional_keys__
    assert not passed_on - (hf.HONOURED | hf.IGNORED | set(hf.REFUSED))


# --- attention sinks ---------------------------------------------------------------------------------------------------

GPT_OSS = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1, "sliding_window": 4}


def gpt_oss(implementation: str, sinks: tuple[float, float] = (0.5, 3.0)):
    model = build("gpt_oss", implementation, **GPT_OSS)
    generator = torch.Generator().manual_seed(2)
    for layer in model.model.layers:
        layer.self_attn.sinks.data = torch.empty(4).uniform_(*sinks, generator=generator)
    return model


def quest_with_sinks(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """gpt-oss's eager attention with QUEST's logits q·k̂, written out."""
    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    logits = query @ unit(key).mT + attention_mask
    sinks = module.sinks.view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    weights = torch.cat([logits, sinks], -1).softmax(-1)[..., :-1]
    return (weights @ value).transpose(1, 2), weights


def test_sinks_are_honoured_as_the_librarys_eager_attention_computes_them():
    ids, mask = batch()
    seen = mask.bool()
    eager = gpt_oss("eager")(ids, attention_mask=mask).logits[seen]
    standard = gpt_oss("standard")
    torch.testing.assert_close(standard(ids, attention_mask=mask).logits[seen], eager, atol=1e-5, rtol=1e-5)
    moved = gpt_oss("standard", sinks=(-2.0, 0.0))(ids, attention_mask=mask).logits[seen]
    assert (moved - eager).abs().max() > 1e-2  # the sinks take part


def test_sink_gradients_match_the_librarys_eager_attention():
    ids, mask = batch()
    grads = []
    for implementation in ("eager", "standard"):
        model = gpt_oss(implementation).train()
        model(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append(torch.stack([layer.self_attn.sinks.grad for layer in model.model.layers]))
    assert grads[0].abs().max() > 1e-4
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4)


def test_quest_with_sinks_equals_a_hand_written_reference():
    transformers.AttentionInterface.register("reference_quest_sinks", quest_with_sinks)
    transformers.masking_utils.AttentionMaskInterface.register("reference_quest_sinks", transformers.masking_utils.eager_mask)
    ids, mask = batch()
    seen = mask.bool()
    ours = gpt_oss("quest")(ids, attention_mask=mask).logits[seen]
    reference = gpt_oss("reference_quest_sinks")(ids, attention_mask=mask).logits[seen]
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


class Layer(torch.nn.Module):
    """What a transformers attention layer shows a backend: grouped heads and causality."""

    num_key_value_groups, is_causal = 2, True


def test_per_query_sinks_are_honoured():
    """Inkling's ``sinks=``: a logit per head and query, [batch, heads, queries, 1]."""
    g = torch.Generator().manual_seed(3)
    q, (k, v), sinks = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 2, 6, 8, generator=g), torch.randn(2, 4, 6, 1, generator=g)
    out, weights = hf.attention_forward(Layer(), q, k, v, None, scaling=0.3, variant="standard", sinks=sinks,
                                        output_attentions=True)
    logits = (q @ k.repeat_interleave(2, 1).mT * 0.3).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    expected = torch.cat([logits, sinks], -1).softmax(-1)[..., :-1]
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(out, (expected @ v.repeat_interleave(2, 1)).transpose(1, 2))


# --- a top-k indexer's keys, refused features and masks -------------------------------------------------------------

DEEPSEEK_V32 = {"hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 4,
                "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 16,
                "qk_rope_head_dim": 4, "v_head_dim": 8, "qk_nope_head_dim": 4, "index_topk": 3, "index_head_dim": 8,
                "index_n_heads": 2, "head_dim": 4, "first_k_dense_replace": 1, "max_position_embeddings": 64}


def test_a_top_k_indexers_keys_are_honoured_as_the_library_masks_them_for_sdpa(monkeypatch):
    """DeepSeek-V3.2 masks the keys its indexer left out itself for eager and SDPA, and passes ``indices=`` to any
    other backend."""
    ids, mask = batch()
    seen = mask.bool()
    sdpa = build("deepseek_v32", "sdpa", **DEEPSEEK_V32)(ids, attention_mask=mask).logits[seen]
    standard = build("deepseek_v32", "standard", **DEEPSEEK_V32)
    torch.testing.assert_close(standard(ids, attention_mask=mask).logits[seen], sdpa)
    monkeypatch.setattr(hf, "_top_k", lambda mask, *args: mask)  # the indices dropped: every key seen
    assert (standard(ids, attention_mask=mask).logits[seen] - sdpa).abs().max() > 1e-4


@pytest.mark.parametrize("variant", ["standard", "quest"])
def test_soft_capping_is_refused_in_one_line_naming_the_variant_asked(variant):
    model = build("gemma2", variant, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8)
    with pytest.raises(ConfigError, match=rf"soft-capping \(softcap=\), which attn_implementation='{variant}' does not"):
        model(batch()[0])


def test_block_sparse_attention_is_refused():
    q, k, v = torch.randn(3, 1, 4, 5, 8).unbind(0)
    with pytest.raises(ConfigError, match="block-sparse attention"):
        hf.attention_forward(Layer(), q, k, v, None, variant="quest", block_indices=torch.zeros(1, 1, 5, 1, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.float64])
def test_a_mask_sdpa_would_refuse_is_refused(dtype):
    """A 0/1 mask of integers (or of float64 beside float32 queries) taken as an additive bias would mask nothing."""
    q, k, v = torch.randn(3, 1, 4, 5, 8).unbind(0)
    with pytest.raises(ConfigError, match=f"boolean .* not {dtype}"):
        hf.attention_forward(Layer(), q, k, v, torch.ones(1, 1, 5, 5, dtype=dtype).tril(), variant="standard")


def test_a_boolean_mask_equals_its_additive_form():
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    allowed = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(0)) > 0.3
    allowed[..., 0] = True
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    layer = Layer()
    layer.num_key_value_groups = 1
    torch.testing.assert_close(hf.attention_forward(layer, q, k, v, allowed, variant="quest")[0],
                               hf.attention_forward(layer, q, k, v, additive, variant="quest")[0])


# --- gradient checkpointing ------------------------------------------------------------------------------------------

LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 32}


@pytest.mark.parametrize("variant", ["elliptical", "elliptical_quest"])
def test_elliptical_gradients_are_exact_under_gradient_checkpointing(variant):
    ids, mask = batch()
    grads = []
    for checkpointing in (False, True):
        model = build("llama", "sdpa", **LLAMA)
        replace_attention(model, variant)
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        model.train()(ids, attention_mask=mask, labels=ids).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


# --- save and reload -------------------------------------------------------------------------------------------------

def test_a_model_saved_under_a_variant_reloads_with_it(tmp_path):
    model = build("llama", "quest", **LLAMA)
    model.save_pretrained(tmp_path)
    assert '"attn_implementation": "quest"' in (tmp_path / "config.json").read_text()
    ids, mask = batch()
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # with common.hf imported, as a user would
    routed = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    expected = model(ids, attention_mask=mask).logits
    for reloaded in (plain, routed):
        assert reloaded.config._attn_implementation == "quest"
        torch.testing.assert_close(reloaded(ids, attention_mask=mask).logits, expected, atol=0, rtol=0)
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert sdpa.config._attn_implementation == "sdpa"  # asked for


def test_without_common_hf_a_saved_variant_is_refused_naming_it(tmp_path):
    build("llama", "quest", **LLAMA).save_pretrained(tmp_path)
    code = f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0 and 'attn_implementation="quest"` is not supported' in result.stderr


@pytest.mark.parametrize("variant", ["qknorm", "qknorm_hs", "elliptical_quest"])
def test_learnt_scales_survive_save_and_reload(tmp_path, variant, caplog):
    model = build("llama", "sdpa", **LLAMA)
    replace_attention(model, variant)
    for name, p in model.named_parameters():
        if ".qk." in name:
            p.data.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(4))
    model.save_pretrained(tmp_path)
    reloaded = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path).eval()
    assert type(reloaded) is type(model) and "UNEXPECTED" not in caplog.text and "MISSING" not in caplog.text
    assert {n: p for n, p in reloaded.named_parameters() if ".qk." in n}.keys() == {n for n, _ in model.named_parameters() if ".qk." in n}
    for (name, p), q in zip(reloaded.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q), name
    ids, mask = batch()
    torch.testing.assert_close(reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits,
                               atol=0, rtol=0)


def test_a_plain_reload_of_learnt_scales_is_refused_pointing_at_the_route(tmp_path):
    model = build("llama", "sdpa", **LLAMA)
    replace_attention(model, "qknorm")
    model.save_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # the library drops the gains it does not know
    with pytest.raises(ConfigError, match=r"needs learnable scales in every layer: load a saved model with common\.hf\.from_pretrained"):
        plain(batch()[0])


# --- speed: what reaches SDPA ----------------------------------------------------------------------------------------

def test_grouped_query_attention_reaches_sdpa_without_copies(monkeypatch):
    from common.attention import functional

    calls, sdpa = [], functional.F.scaled_dot_product_attention

    def recorded(q, k, v, **kwargs):
        calls.append((q.shape[1], k.shape[1], v.shape[1], kwargs.get("enable_gqa")))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(functional.F, "scaled_dot_product_attention", recorded)
    ids, mask = batch()
    for attention_mask in (None, mask):  # SDPA's causal flag, and a padding mask
        build("llama", "quest", **LLAMA)(ids, attention_mask=attention_mask)
    assert calls and set(calls) == {(4, 2, 2, True)}


def test_quest_leaves_the_queries_in_the_models_dtype_and_normalises_keys_in_float32(monkeypatch):
    """GPT-2 under bf16 autocast: its queries arrive in bfloat16 (no rotation promotes them)."""
    seen, fold = [], hf.fold_qk

    def recorded(q, k, *args, **kwargs):
        seen.append((q.dtype, k.dtype, torch.is_autocast_enabled("cpu")))
        return fold(q, k, *args, **kwargs)

    monkeypatch.setattr(hf, "fold_qk", recorded)
    model = build("gpt2", "quest", n_embd=32, n_layer=2, n_head=4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(batch()[0])
    assert seen == [(torch.bfloat16, torch.float32, False)] * 2


def test_quest_bench_hf_times_quest_beside_the_librarys_sdpa_on_the_same_model(monkeypatch, capsys):
    from runners.cli import main as cli
    from runners.runs import hfbench

    configs, batch_size, length = hfbench.SIZES["tiny"]
    assert configs["llama"]["num_key_value_heads"] < configs["llama"]["num_attention_heads"]  # grouped-query attention
    monkeypatch.setitem(hfbench.SIZES, "tiny", ({"llama": LLAMA}, 2, 8))
    built, build = {}, hfbench.build

    def recorded_build(arch, implementation, config, device, seed=0):
        model = build(arch, implementation, config, device, seed)
        built[implementation] = (model, {name: p.detach().clone() for name, p in model.named_parameters()})
        return model

    def timed(jobs, rounds, device, warmup=1):
        for job in jobs.values():
            job()
        return {"sdpa": 2.0, "standard": 2.02, "quest": 2.1}

    monkeypatch.setattr(hfbench, "build", recorded_build)
    monkeypatch.setattr(hfbench, "interleaved_seconds", timed)
    assert cli(["bench", "--hf", "llama", "--steps", "1", "--repeats", "1", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[-2:] == ["1.010", "1.050"]
    assert {name: model.config._attn_implementation for name, (model, _) in built.items()} == {
        name: name for name in ("sdpa", "standard", "quest")}
    (_, start), (quest, same_start) = built["sdpa"], built["quest"]
    assert all(torch.equal(start[name], same_start[name]) for name in start)
    assert all(not torch.equal(p, start[name]) for name, p in quest.named_parameters())  # the job trained it
