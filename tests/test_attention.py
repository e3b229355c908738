import math

import pytest
import torch
import torch.nn.functional as F

from common.attention import (
    VARIANTS,
    EdgeMultiheadAttention,
    MultiheadAttention,
    attend,
    elliptical_metric,
    get_variant,
    l2_normalize,
)
from common.blocks import Encoder

torch.manual_seed(0)
B, H, N, D = 2, 3, 7, 8


def reference_logits(q, k, variant, gain=None, q_scale=None, k_scale=None, metric=None):
    """The table of DESIGN.md §1 written out literally."""
    unit = lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    if variant in ("elliptical", "elliptical_quest") and metric is not None:
        q = q * metric
    if variant in ("standard", "elliptical"):
        return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if variant in ("quest", "elliptical_quest"):
        return q @ unit(k).transpose(-2, -1)
    if variant == "qnorm":
        return unit(q) @ k.transpose(-2, -1)
    if variant in ("qknorm", "qknorm_hs"):
        return gain * (unit(q) @ unit(k).transpose(-2, -1))
    if variant == "qknorm_ds":
        return (q_scale * unit(q)) @ (k_scale * unit(k)).transpose(-2, -1)
    raise AssertionError(variant)


def reference_attend(q, k, v, variant, key_padding_mask=None, attn_bias=None, **params):
    logits = reference_logits(q, k, variant, **params)
    if attn_bias is not None:
        logits = logits + attn_bias
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    return logits.softmax(-1) @ v


def variant_params(variant, dtype):
    params = {}
    if variant == "qknorm":
        params["gain"] = torch.tensor(3.0, dtype=dtype, requires_grad=True)
    if variant == "qknorm_hs":
        params["gain"] = torch.linspace(1, 4, H, dtype=dtype).view(H, 1, 1).requires_grad_()
    if variant == "qknorm_ds":
        params["q_scale"] = torch.linspace(0.5, 2, D, dtype=dtype).requires_grad_()
        params["k_scale"] = torch.linspace(2, 0.5, D, dtype=dtype).requires_grad_()
    if variant.startswith("elliptical"):
        params["metric"] = torch.rand(B, H, 1, D, dtype=dtype)
    return params


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
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
    leaves = [q, k, v] + [p for p in params.values() if p.requires_grad]
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def test_l2_normalize_gradient_and_zero_vectors():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: l2_normalize(t), (x,))
    zero = torch.zeros(2, 3, requires_grad=True)
    y = l2_normalize(zero)
    y.sum().backward()
    assert torch.equal(y, torch.zeros(2, 3)) and torch.isfinite(zero.grad).all()


@pytest.mark.parametrize("variant", list(VARIANTS))
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


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_learnable_parameters_get_gradients_and_elliptical_metric_none(variant):
    mha = MultiheadAttention(16, 2, variant, seq_len=6)
    x = torch.randn(2, 6, 16)
    prev = torch.randn(2, 2, 6, 8, requires_grad=True)
    out, _, values = mha(x, prev_values=prev, return_values=True)
    out.sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert prev.grad is None and not values.requires_grad  # elliptical weights carry no gradient
    extra = {n for n, _ in mha.qk.named_parameters()}
    expected = {"qknorm": {"gain"}, "qknorm_hs": {"gain"}, "qknorm_ds": {"q_scale", "k_scale"}}
    assert extra == expected.get(variant, set())


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


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_edge_attention_agrees_with_dense_on_complete_graph(variant):
    torch.manual_seed(1)
    dim, heads, n = 16, 2, 6
    dense = MultiheadAttention(dim, heads, variant, seq_len=n)
    edge = EdgeMultiheadAttention(dim, heads, variant, seq_len=n)
    with torch.no_grad():
        edge.in_proj.weight.copy_(dense.in_proj_weight)
        edge.in_proj.bias.copy_(dense.in_proj_bias)
        edge.out_proj.load_state_dict(dense.out_proj.state_dict())
        for (name, p), (_, p2) in zip(dense.qk.named_parameters(), edge.qk.named_parameters()):
            p2.copy_(p)
    x = torch.randn(n, dim)
    src, dst = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    edge_index = torch.stack([src.flatten(), dst.flatten()])
    prev = torch.randn(1, heads, n, dim // heads)
    out_dense, _, _ = dense(x[None], prev_values=prev, return_values=True)
    out_edge, _ = edge(x, edge_index, prev_values=prev[0].transpose(0, 1))
    torch.testing.assert_close(out_edge, out_dense[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encoder_threads_values_and_ignores_padding(variant):
    enc = Encoder(16, 3, 2, variant=variant, seq_len=6).eval()
    x = torch.randn(2, 6, 16)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    out = enc(x, key_padding_mask=kpm)
    x2 = x.clone()
    x2[1, 4:] = 100.0  # whatever sits in padded positions
    out2 = enc(x2, key_padding_mask=kpm)
    torch.testing.assert_close(out[1, :4], out2[1, :4])


def test_torch_compile_matches_eager():
    # aot_eager traces with dynamo and AOT autograd like inductor does, without minutes of C++ codegen.
    mha = MultiheadAttention(16, 2, "quest")
    x = torch.randn(2, 5, 16, requires_grad=True)
    compiled = torch.compile(mha, backend="aot_eager")
    out, ref = compiled(x)[0], mha(x)[0]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown attention variant 'questt'; choose from standard"):
        get_variant("questt")


def test_drop_path_is_identity_in_eval_and_drops_whole_samples_in_training():
    from common.blocks import DropPath

    layer = DropPath(0.5)
    x = torch.ones(1000, 3, 4)
    assert torch.equal(layer.eval()(x), x)
    y = layer.train()(x)
    kept = y[:, 0, 0] != 0
    assert torch.all(y[kept] == 2.0) and torch.all(y[~kept] == 0.0) and 400 < int(kept.sum()) < 600
    enc = Encoder(8, 3, 2, drop_path=0.2)
    assert [layer.drop_path.p for layer in enc.layers] == pytest.approx([0.0, 0.1, 0.2])
