import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.attention import (
    ABLATIONS,
    FOLD_SCALES,
    FOLDS,
    VARIANTS,
    AttentionState,
    EdgeMultiheadAttention,
    MultiheadAttention,
    QKFold,
    Variant,
    attend,
    attention_layer,
    elliptical_metric,
    get_variant,
    l2_normalize,
    make_fold,
)
from common.blocks import Encoder
from common.patch import replace_attention
from common.probes import attention_probes

torch.manual_seed(0)
B, H, N, D = 2, 3, 7, 8


# A variant built from existing settings: QUEST's free query with a learnable per-head gain. Registering it is one
# line; every test parametrised over ALL_VARIANTS then checks it as it checks the study's own variants.
ONE_LINE = Variant("quest_hs", norm_q=False, norm_k=True, scaled=False, fold="HeadGain")
# A variant with a fold of its own, the example of docs/guides/add-a-variant.md (docs/examples/key_scale.py), registered
# as the guide says and checked by the same tests, none of them edited for it.
_spec = importlib.util.spec_from_file_location("key_scale", Path(__file__).parents[1] / "docs" / "examples" / "key_scale.py")
GUIDE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(GUIDE)
ALL_VARIANTS = [*VARIANTS, ONE_LINE.name, GUIDE.QUEST_KS.name]


@pytest.fixture(autouse=True)
def one_line_variant(monkeypatch):
    monkeypatch.setitem(VARIANTS, ONE_LINE.name, ONE_LINE)
    monkeypatch.setitem(FOLDS, "KeyScale", GUIDE.KeyScale)
    monkeypatch.setitem(FOLD_SCALES, "KeyScale", GUIDE.KEY_SCALE_SCALES)
    monkeypatch.setitem(VARIANTS, GUIDE.QUEST_KS.name, GUIDE.QUEST_KS)


def reference_logits(q, k, variant, fold=None, metric=None):
    """The variant's row of the table in common/attention/__init__.py written out literally, read from its
    declaration alone: its ``Variant`` entry (elliptical, which of q and k are normalised, the scale) and its
    fold's ``reference_logits`` (the learnable scales' literal formula). A new variant or fold is checked
    without touching this function (docs/guides/add-a-variant.md)."""
    spec = get_variant(variant)
    unit = lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # noqa: E731
    if spec.elliptical and metric is not None:
        q = q * metric
    if spec.norm_q:
        q = unit(q)
    if spec.norm_k:
        k = unit(k)
    logits = (fold if fold is not None else make_fold(spec, q.shape[1], q.shape[-1])).reference_logits(q, k)
    return logits / math.sqrt(q.shape[-1]) if spec.scaled else logits


def reference_attend(q, k, v, variant, key_padding_mask=None, attn_bias=None, **params):
    logits = reference_logits(q, k, variant, **params)
    if attn_bias is not None:
        logits = logits + attn_bias
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    return logits.softmax(-1) @ v


def variant_params(variant, dtype):
    """The variant's fold, its learnable scales moved off their initial values, and an elliptical metric."""
    spec = get_variant(variant)
    params = {"fold": make_fold(spec, H, D).to(dtype)}
    with torch.no_grad():
        for p in params["fold"].parameters():
            p.copy_(torch.linspace(0.5, 3.0, p.numel(), dtype=dtype).view_as(p).flip(0) * (1 + torch.rand_like(p)))
    if spec.elliptical:
        params["metric"] = torch.rand(B, H, 1, D, dtype=dtype)
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_attend_matches_explicit_softmax(variant, masked, dtype):
    q, k, v = (torch.randn(B, H, N, D, dtype=dtype, requires_grad=True) for _ in range(3))
    kpm = bias = None
    if masked:
        kpm = torch.zeros(B, N, dtype=torch.bool)
        kpm[1, 4:] = True
        bias = torch.randn(1, H, N, N, dtype=dtype)
    params = variant_params(variant, dtype)
    out = attend(q, k, v, variant, key_padding_mask=kpm, attn_bias=bias, **params)
    ref = reference_attend(q, k, v, variant, kpm, bias, **params)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(out, ref, **tol)

    grad = torch.randn_like(out)
    leaves = [q, k, v, *params["fold"].parameters()]
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad)
    for g, w in zip(got, want):
        # float rounding grows with a gradient's scale (QK-layernorm's gains of up to 6 on both sides make a key's
        # gradient reach 16): the absolute tolerance is per unit of the largest gradient
        torch.testing.assert_close(g, w, atol=tol["atol"] * max(1.0, w.abs().max().item()), rtol=tol["rtol"])


def test_l2_normalize_gradient_and_zero_vectors():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: l2_normalize(t), (x,))
    # with a gain per head folded in ([B, H, N, D] rows, gain [H, 1, 1]): the gain's gradient too
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    gain = torch.rand(3, 1, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, g: l2_normalize(t, gain=g), (x, gain))
    torch.testing.assert_close(l2_normalize(x, gain=gain), gain * F.normalize(x, dim=-1))
    zero = torch.zeros(2, 3, requires_grad=True)
    y = l2_normalize(zero)
    y.sum().backward()
    assert torch.equal(y, torch.zeros(2, 3)) and torch.isfinite(zero.grad).all()
    empty = torch.randn(0, 3, 5, requires_grad=True)  # no rows: the fused CPU kernels would divide by zero
    l2_normalize(empty).sum().backward()
    assert empty.grad.shape == empty.shape


def _head_split(layout: str, dtype: torch.dtype) -> torch.Tensor:
    """A [B, H, N, D] leaf's view in the layouts attention meets: contiguous, the transposed [B, N, H, D] a
    projection gives, and one of three chunks of a fused q/k/v projection (rows not dense in memory)."""
    if layout == "contiguous":
        return torch.randn(B, H, N, D, dtype=dtype)
    if layout == "projection":
        return torch.randn(B, N, H, D, dtype=dtype).transpose(1, 2)
    return torch.randn(B, N, 3 * H * D, dtype=dtype).chunk(3, -1)[1].unflatten(-1, (H, D)).transpose(1, 2)


@pytest.mark.parametrize("layout", ["contiguous", "projection", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_cpu_normalisation_is_the_formula(layout, dtype):
    """On CPU l2_normalize runs PyTorch's fused weight-norm kernels; everywhere else (and under torch.func) the
    written-out formula: both give the same values and gradients, for the input, a per-head gain, rows
    shorter than eps and all-zero rows."""
    from common.attention.kernels import _L2Normalize

    x = _head_split(layout, dtype)
    with torch.no_grad():
        x[0, 0, 0] = 0  # padding
        x[0, 1, 2] *= 1e-8  # below eps: linear, x · g / eps
    gain = torch.rand(H, 1, 1) + 0.5
    grad = torch.randn(B, H, N, D, dtype=dtype)
    results = []
    for normalize in (l2_normalize, lambda x, eps, gain: _L2Normalize.apply(x, gain, eps)[0]):
        leaves = (x.detach().clone().requires_grad_(), gain.clone().requires_grad_())
        out = normalize(leaves[0], 1e-6, gain=leaves[1]) if normalize is l2_normalize else normalize(*leaves[:1], 1e-6, leaves[1])
        results.append((out, *torch.autograd.grad(out, leaves, grad)))
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for got, want in zip(*results):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tol)
    assert torch.equal(results[0][0][0, 0, 0], torch.zeros(D, dtype=dtype))


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_zero_padded_keys_and_fully_padded_rows_stay_finite(variant):
    q, k, v = (torch.randn(B, H, N, D, requires_grad=True) for _ in range(3))
    kpm = torch.zeros(B, N, dtype=torch.bool)
    kpm[0, 3:] = True
    kpm[1] = True  # a sample with no key at all
    with torch.no_grad():
        k[0, :, 3:] = 0.0  # padded keys are all-zero vectors
    out = attend(q, k, v, variant, key_padding_mask=kpm, **variant_params(variant, torch.float32))
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_quest_is_invariant_to_key_scaling():
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    scale = torch.rand(B, H, N, 1) * 10 + 0.1
    torch.testing.assert_close(attend(q, k, v, "quest"), attend(q, k * scale, v, "quest"))
    assert not torch.allclose(attend(q, k, v, "standard"), attend(q, k * scale, v, "standard"))


def entropy_of_rows(q, k, variant):
    from common.attention import fold_qk

    qf, kf, s = fold_qk(q, k, variant)
    p = ((qf @ kf.transpose(-2, -1)) * s).softmax(-1)
    return -(p * p.log()).sum(-1)


def test_quest_query_norm_sharpens_its_row():
    q, k = torch.randn(1, 1, 4, D), torch.randn(1, 1, 16, D)
    before = entropy_of_rows(q, k, "quest")
    after = entropy_of_rows(q * torch.tensor([3.0, 1, 1, 1]).view(1, 1, 4, 1), k, "quest")
    assert after[0, 0, 0] < before[0, 0, 0]
    torch.testing.assert_close(after[0, 0, 1:], before[0, 0, 1:])


def test_qnorm_is_invariant_to_query_scaling():
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    torch.testing.assert_close(attend(q, k, v, "qnorm"), attend(q * 7.5, k, v, "qnorm"))


@pytest.mark.parametrize("batch_first", [True, False])
def test_standard_equals_torch_multihead_attention(batch_first):
    dim, heads = 24, 4
    ours = MultiheadAttention(dim, heads, "standard", batch_first=batch_first)
    theirs = torch.nn.MultiheadAttention(dim, heads, batch_first=batch_first)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 9, dim) if batch_first else torch.randn(9, 3, dim)
    mem = torch.randn(3, 5, dim) if batch_first else torch.randn(5, 3, dim)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 2:] = True
    causal = torch.triu(torch.ones(9, 9, dtype=torch.bool), 1)
    for args, kwargs in [((x, x, x), {"attn_mask": causal}), ((x, mem, mem), {"key_padding_mask": kpm})]:
        out, w = ours(*args, need_weights=True, **kwargs)
        ref, ref_w = theirs(*args, need_weights=True, **kwargs)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_learnable_parameters_get_gradients_and_elliptical_metric_none(variant):
    mha = MultiheadAttention(16, 2, variant, seq_len=6)
    x = torch.randn(2, 6, 16)
    prev = torch.randn(2, 2, 6, 8, requires_grad=True)
    state = AttentionState(prev)
    out, _ = mha(x, state=state)
    out.sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert prev.grad is None and not state.values.requires_grad  # elliptical weights carry no gradient
    extra = {n for n, _ in mha.qk.named_parameters()}
    assert extra == set(FOLD_SCALES[get_variant(variant).fold])  # what the fold's line declares is what it creates
    assert mha.variant.learnable == bool(extra)


def test_qknorm_gain_initialisation():
    assert MultiheadAttention(16, 2, "qknorm", seq_len=64).qk.gain.item() == pytest.approx(math.log2(64**2 - 64))
    assert MultiheadAttention(16, 2, "qknorm_hs", seq_len=10).qk.gain.shape == (2,)
    ds = MultiheadAttention(16, 2, "qknorm_ds").qk
    # The logit starts at sqrt(d)·cos.
    q = torch.randn(3, 8)
    k = torch.randn(3, 8)
    logit = ((ds.q_scale * F.normalize(q, dim=-1)) * (ds.k_scale * F.normalize(k, dim=-1))).sum(-1)
    torch.testing.assert_close(logit, math.sqrt(8) * F.cosine_similarity(q, k, dim=-1))


def test_elliptical_metric_follows_moving_coordinates():
    prev = torch.randn(1, 1, 5, 4)
    values = prev.clone()
    values[..., 2] += 1.0  # only coordinate 2 moves
    values[..., 0] += 0.5
    m = elliptical_metric(values, prev)
    torch.testing.assert_close(m.flatten(), torch.tensor([0.5, 0.0, 1.0, 0.0]))
    assert torch.equal(elliptical_metric(prev, prev), torch.ones(1, 1, 1, 4))


def test_elliptical_first_layer_runs_its_base_variant():
    ell = MultiheadAttention(16, 2, "elliptical_quest")
    base = MultiheadAttention(16, 2, "quest")
    base.load_state_dict(ell.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ell(x)[0], base(x)[0])


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_edge_attention_agrees_with_dense_on_complete_graph(variant):
    torch.manual_seed(1)
    dim, heads, n = 16, 2, 6
    dense = MultiheadAttention(dim, heads, variant, seq_len=n)
    edge = EdgeMultiheadAttention(dim, heads, variant, seq_len=n)
    with torch.no_grad():
        edge.in_proj.weight.copy_(dense.in_proj_weight)
        edge.in_proj.bias.copy_(dense.in_proj_bias)
        edge.out_proj.load_state_dict(dense.out_proj.state_dict())
        for p, p2 in zip(dense.qk.parameters(), edge.qk.parameters()):
            p2.copy_(p)
    x = torch.randn(n, dim)
    src, dst = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    edge_index = torch.stack([src.flatten(), dst.flatten()])
    prev = torch.randn(1, heads, n, dim // heads)
    out_dense, _ = dense(x[None], state=AttentionState(prev))
    out_edge = edge(x, edge_index, state=AttentionState(prev[0].transpose(0, 1)))
    torch.testing.assert_close(out_edge, out_dense[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_encoder_threads_values_and_ignores_padding(variant):
    enc = Encoder(16, 3, 2, attn_layer=attention_layer(variant=variant), seq_len=6).eval()
    x = torch.randn(2, 6, 16)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    out = enc(x, key_padding_mask=kpm)
    x2 = x.clone()
    x2[1, 4:] = 100.0  # whatever sits in padded positions
    out2 = enc(x2, key_padding_mask=kpm)
    torch.testing.assert_close(out[1, :4], out2[1, :4])


def test_attention_layer_checks_its_settings_when_made_and_builds_what_the_layer_would():
    """The factory a model gets is checked as it is made: a misspelt key or an unknown variant fails there, before
    any layer is built; the layers it makes are the ones the class makes with the same settings, to the weight."""
    with pytest.raises(TypeError, match=r"MultiheadAttention takes no attention setting 'qk_gian_init'; "
                                        r"did you mean qk_gain_init\?"):
        attention_layer(variant="qknorm", qk_gian_init=2.0)
    with pytest.raises(TypeError, match="EdgeMultiheadAttention takes no attention setting 'batch_first'"):
        attention_layer(EdgeMultiheadAttention, batch_first=True)
    with pytest.raises(ValueError, match="unknown attention variant 'questt'"):
        attention_layer(variant="questt")
    make = attention_layer(variant="qknorm", qk_gain_init=3.0, l2norm_kernel="formula")
    torch.manual_seed(1)
    made = make(16, 2, dropout=0.1, seq_len=6)
    torch.manual_seed(1)
    direct = MultiheadAttention(16, 2, "qknorm", dropout=0.1, seq_len=6, qk_gain_init=3.0, l2norm_kernel="formula")
    assert made.dropout == 0.1 and made.variant.name == "qknorm"
    for (name, theirs), ours in zip(direct.state_dict().items(), made.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)


def test_torch_compile_matches_eager():
    # aot_eager traces with dynamo and AOT autograd like inductor does, without minutes of C++ codegen.
    mha = MultiheadAttention(16, 2, "quest")
    x = torch.randn(2, 5, 16, requires_grad=True)
    compiled = torch.compile(mha, backend="aot_eager")
    out, ref = compiled(x)[0], mha(x)[0]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_a_variant_is_one_entry():
    """The one-line variant (``ONE_LINE``, registered for every test) takes its gain's initial value, and without
    its fold is refused: the tests parametrised over ALL_VARIANTS check everything else."""
    mha = MultiheadAttention(16, 2, "quest_hs", qk_gain_init=2.0)
    assert mha.variant.learnable and mha.qk.gain.shape == (2,)
    q, k, v = (torch.randn(B, 2, N, 8) for _ in range(3))
    unit_k = k / k.norm(dim=-1, keepdim=True)
    ref = (2.0 * q @ unit_k.transpose(-2, -1)).softmax(-1) @ v
    torch.testing.assert_close(attend(q, k, v, "quest_hs", fold=mha.qk), ref)
    with pytest.raises(ValueError, match="learnable scales"):
        attend(q, k, v, "quest_hs")


def test_core_needs_torch_only():
    code = ("import sys, common.attention, common.blocks, common.patch, common.probes; "
            "print([m for m in ('pytorch_lightning', 'lightning', 'torchmetrics') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_variants_are_listed_without_torch():
    """Listing and checking variant names imports common.attention, whose names load lazily: not torch."""
    code = ("import sys; from common.attention import VARIANTS, ABLATIONS, get_variant; get_variant('quest'); "
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_name_resolves_in_its_file():
    import common.attention as attention

    for name, module in attention._SUBMODULE.items():
        assert getattr(attention, name) is getattr(getattr(attention, module), name)
    assert set(attention.__all__) <= set(dir(attention))


def test_causal_stack_takes_the_fast_path_and_ignores_the_future(monkeypatch):
    enc = Encoder(16, 3, 2, attn_layer=attention_layer(variant="elliptical_quest")).eval()
    x = torch.randn(2, 6, 16)
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs["attn_mask"], kwargs["is_causal"]))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = enc(x, is_causal=True)
    assert seen == [(None, True)] * 3  # SDPA's causal kernel, no dense triangle
    x2 = x.clone()
    x2[:, 4:] = 100.0  # the future
    torch.testing.assert_close(enc(x2, is_causal=True)[:, :4], out[:, :4])


def test_probes_of_a_causal_stack_match_the_explicit_reference():
    enc = Encoder(16, 2, 2, attn_layer=attention_layer(variant="quest")).eval()
    inputs = {}
    for i, layer in enumerate(enc.layers):
        layer.attn.register_forward_pre_hook(lambda m, args, i=i: inputs.update({i: args[0]}))
    for probe in attention_probes(enc).values():
        probe.enabled = True
    enc(torch.randn(2, 6, 16), is_causal=True)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    for i, layer in enumerate(enc.layers):
        q, k, _ = layer.attn._project(inputs[i], inputs[i], inputs[i])
        qf, kf, scale = layer.attn.qk(q, k)
        logits = (qf @ kf.transpose(-2, -1)) * scale
        attn = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
        entropy = -(attn * attn.clamp_min(1e-30).log()).sum(-1).mean()
        stats = layer.attn.probe.stats
        torch.testing.assert_close(stats["max_logit"], logits[..., allowed].max())
        torch.testing.assert_close(stats["entropy"], entropy)
        # sharpness: each query's spread over the keys it sees and its entropy over log(keys), the first query
        # (one key) left out
        rows = [(logits[:, :, i, : i + 1], attn[:, :, i, : i + 1]) for i in range(1, 6)]
        spread = torch.cat([row.std(-1, unbiased=False).flatten() for row, _ in rows]).mean()
        ratio = torch.cat([(-(p * p.log()).sum(-1) / math.log(p.shape[-1])).flatten() for _, p in rows]).mean()
        torch.testing.assert_close(stats["logit_std"], spread)
        torch.testing.assert_close(stats["entropy_ratio"], ratio)


def test_graph_probes_measure_sharpness_per_target_node():
    """Over edges: node 0 receives two edges with logits a and b (spread |a - b| / 2), node 1 one (no spread)."""
    from common.probes import Probe

    probe = Probe()
    logits = torch.tensor([[1.0], [3.0], [5.0]])
    dst = torch.tensor([0, 0, 1])
    alpha = torch.tensor([[0.25], [0.75], [1.0]])
    probe.record_edges(torch.ones(2, 1, 4), torch.ones(2, 1, 4), logits, alpha, dst, num_nodes=2)
    assert probe.stats["logit_std"].item() == pytest.approx(1.0)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert probe.stats["entropy_ratio"].item() == pytest.approx(entropy / math.log(2))


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention variant 'questt'; choose from standard"):
        get_variant("questt")


def test_drop_path_is_identity_in_eval_and_drops_whole_samples_in_training():
    from timm.layers import DropPath

    enc = Encoder(8, 3, 2, drop_path=0.2)
    assert all(type(layer.drop_path) is DropPath for layer in enc.layers)  # timm's stochastic depth
    assert [layer.drop_path.drop_prob for layer in enc.layers] == pytest.approx([0.0, 0.1, 0.2])
    layer = enc.layers[-1].drop_path
    layer.drop_prob = 0.5
    x = torch.ones(1000, 3, 4)
    assert torch.equal(layer.eval()(x), x)
    y = layer.train()(x)
    kept = y[:, 0, 0] != 0
    assert torch.all(y[kept] == 2.0) and torch.all(y[~kept] == 0.0) and 400 < int(kept.sum()) < 600


def test_bench_times_every_variant_against_sdpa_and_memory_above_the_start(tmp_path, capsys):
    """`quest bench` on small shapes: a ratio to plain SDPA for every variant at every shape, and memory
    measured above what the process held before the call (at 2,048 tokens the explicit softmax's 2 x 2,048²
    float32 logits, 32 MB, dwarf the fused kernel's few MB; whole-process peaks would hide it)."""
    from runners.commands.bench import main as bench

    out = tmp_path / "bench.json"
    assert bench(["--shapes", "2,2,16,8;1,2,32,8", "--long", "1,2,2048,16", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["shapes"]) == ["[2, 2, 16, 8]", "[1, 2, 32, 8]"]
    for timing in result["shapes"].values():
        assert set(timing["ratio"]) == set(VARIANTS) and all(r > 0 for r in timing["ratio"].values())
        assert set(timing["normalisation"]) == {"normalise k", "normalise k (formula)"}
    memory = result["memory_mb"]
    assert memory["quest (naive explicit softmax)"] > 2 * memory["quest"] and memory["quest"] < 100
    assert "× standard" in capsys.readouterr().out
    # bfloat16, what an accelerator would train in: every variant runs its forward+backward in it
    assert bench(["--shapes", "2,2,16,8", "--long", "1,2,64,8", "--repeats", "1", "--dtype", "bfloat16", "--no-naive",
                  "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dtype"] == "bfloat16" and set(result["shapes"]["[2, 2, 16, 8]"]["ratio"]) == set(VARIANTS)
    assert "bfloat16" in capsys.readouterr().out
    assert bench(["--shapes", "2,2,16,8", "--long", "1,2,64,8", "--repeats", "1", "--layout", "contiguous",
                  "--no-naive", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["layout"] == "contiguous"


def test_bench_inputs_are_laid_out_as_the_attention_module_gives_them():
    from common.benchmark import make_inputs

    mha = MultiheadAttention(H * D, H)
    x = torch.randn(B, N, H * D)
    for want, got in zip(mha._project(x, x, x), make_inputs((B, H, N, D), "quest", "cpu").qkv()):
        assert got.shape == want.shape and got.stride() == want.stride()


def test_a_fold_without_learnable_scales_is_not_learnable():
    """The uniform ablation's fold (ZeroQuery) rewrites q but owns no parameter: attend() runs it without a fold
    module, as it runs QUEST; a fold that declares scales needs its module."""
    assert not ABLATIONS["uniform"].learnable and not VARIANTS["quest"].learnable
    assert VARIANTS["qknorm"].learnable and GUIDE.QUEST_KS.learnable
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    torch.testing.assert_close(attend(q, k, v, "uniform"), v.mean(2, keepdim=True).expand_as(v))
    with pytest.raises(ValueError, match="has learnable scales"):
        attend(q, k, v, GUIDE.QUEST_KS.name)


def test_uniform_ablation_averages_the_visible_values():
    """attention=uniform keeps the module and drops what it computes from content: each query takes the mean
    of the values it may see (padding masked, causal prefix); it is not one of the variants compared."""
    from common.attention import ABLATIONS

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    fold = make_fold("uniform", 2, 4)
    out = attend(q, k, v, "uniform", fold=fold, key_padding_mask=pad)
    torch.testing.assert_close(out[0], v[0].mean(-2, keepdim=True).expand(2, 5, 4))
    torch.testing.assert_close(out[1], v[1, :, :3].mean(-2, keepdim=True).expand(2, 5, 4))
    causal = attend(q, k, v, "uniform", fold=fold, causal=True)
    prefix_means = v.cumsum(-2) / torch.arange(1, 6).view(1, 1, 5, 1)
    torch.testing.assert_close(causal, prefix_means)
    assert "uniform" in ABLATIONS and "uniform" not in VARIANTS


class HeadDimTemperature(QKFold):
    """A parameter-free fold that reads its head size when built (a newcomer's first fold): q·k̂ × head_dim / 8."""

    def __init__(self, variant, num_heads, head_dim, **kwargs):
        super().__init__(variant, num_heads, head_dim, **kwargs)
        self.temperature = head_dim / 8

    def rescale(self, q, k):
        return q * self.temperature, k

    def reference_logits(self, q, k):
        return self.temperature * (q @ k.transpose(-2, -1))


def test_a_parameter_free_fold_is_built_at_the_real_head_size_on_every_path(monkeypatch):
    """Built with head size 0 where no fold module is kept, this fold gave exactly uniform attention through
    ``attend`` while every other test passed: each path (``attend``, the layer, the patch) against the formula."""
    spec = Variant("quest_hd", norm_q=False, norm_k=True, scaled=False, fold="HeadDimTemperature")
    monkeypatch.setitem(FOLDS, "HeadDimTemperature", HeadDimTemperature)
    monkeypatch.setitem(FOLD_SCALES, "HeadDimTemperature", ())
    monkeypatch.setitem(VARIANTS, spec.name, spec)
    q, k, v = (torch.randn(2, 4, 5, 16) for _ in range(3))
    expected = reference_attend(q, k, v, spec.name)
    torch.testing.assert_close(attend(q, k, v, spec.name), expected)
    x = torch.randn(2, 5, 64)
    layer = MultiheadAttention(64, 4, spec.name)
    q, k, v = (t.view(2, 5, 4, 16).transpose(1, 2) for t in F.linear(x, layer.in_proj_weight, layer.in_proj_bias).chunk(3, -1))
    mixed = reference_attend(q, k, v, spec.name).transpose(1, 2).reshape(2, 5, 64)
    torch.testing.assert_close(layer(x)[0], F.linear(mixed, layer.out_proj.weight, layer.out_proj.bias))
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, batch_first=True, dropout=0.0), 1,
                                    enable_nested_tensor=False).eval()
    plain = encoder.layers[0].self_attn
    want_q, want_k, want_v = (t.view(2, 5, 4, 16).transpose(1, 2)
                              for t in F.linear(x, plain.in_proj_weight, plain.in_proj_bias).chunk(3, -1))
    want = F.linear(reference_attend(want_q, want_k, want_v, spec.name).transpose(1, 2).reshape(2, 5, 64),
                    plain.out_proj.weight, plain.out_proj.bias)
    replace_attention(encoder, spec.name)
    patched = encoder.layers[0].self_attn
    torch.testing.assert_close(patched(x, x, x, need_weights=False)[0], want)
