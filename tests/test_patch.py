"""common.patch.replace_attention on every supported family: same outputs with `standard`, QUEST's key-scale
invariance after patching, training steps, state dicts, and the report for what it leaves alone."""
import copy

import pytest
import torch
from torch import nn

from common import probes
from common.attention import attention_layer
from common.blocks import Encoder
from common.patch import PatchedMultiheadAttention, PatchedTimmAttention, replace_attention

DIM, HEADS = 16, 2


def _generator():
    return torch.Generator().manual_seed(0)


def _torch_encoder(batch_first):
    layer = nn.TransformerEncoderLayer(DIM, HEADS, 32, dropout=0.0, batch_first=batch_first)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=batch_first)
    x = torch.randn(3, 5, DIM, generator=_generator())
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True

    def run(m):  # in eval without grad, the unpatched encoder takes torch's fused nested-tensor path
        out = m(x if batch_first else x.transpose(0, 1), src_key_padding_mask=pad)
        out = out if batch_first else out.transpose(0, 1)
        return out.masked_fill(pad[..., None], 0.0)  # that path zeroes padded positions
    return model, run, 2


def _torch_decoder():
    model = nn.TransformerDecoderLayer(DIM, HEADS, 32, dropout=0.0, batch_first=True)
    gen = _generator()
    tgt, memory = torch.randn(2, 4, DIM, generator=gen), torch.randn(2, 6, DIM, generator=gen)
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    memory_pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])

    def run(m):
        return m(tgt, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=memory_pad)
    return model, run, 2


def _timm_vit(qk_norm):
    timm = pytest.importorskip("timm")
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=DIM, depth=2, num_heads=HEADS, num_classes=3, qk_norm=qk_norm)
    x = torch.randn(2, 3, 16, 16, generator=_generator())
    return model, lambda m: m(x), 2


def _torchvision_vit():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.VisionTransformer(  # the class every vit_* builder returns
        image_size=16, patch_size=8, num_layers=2, num_heads=HEADS, hidden_dim=DIM, mlp_dim=32, num_classes=3)
    x = torch.randn(2, 3, 16, 16, generator=_generator())
    return model, lambda m: m(x), 2


def _torchaudio_conformer():
    from torchaudio.models import Conformer

    model = Conformer(input_dim=DIM, num_heads=HEADS, ffn_dim=32, num_layers=2, depthwise_conv_kernel_size=3)
    x, lengths = torch.randn(2, 6, DIM, generator=_generator()), torch.tensor([6, 4])
    return model, lambda m: m(x, lengths)[0], 2


def _pyg_gps():
    from torch_geometric.nn import GINConv, GPSConv

    mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
    model = GPSConv(DIM, GINConv(mlp), heads=HEADS)
    x = torch.randn(7, DIM, generator=_generator())
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [1, 2, 3, 0, 5, 6, 4]])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    return model, lambda m: m(x, edge_index, batch), 1


FAMILIES = {
    "torch_encoder_batch_first": lambda: _torch_encoder(True),
    "torch_encoder_seq_first": lambda: _torch_encoder(False),
    "torch_decoder": _torch_decoder,
    "timm_vit": lambda: _timm_vit(False),
    "timm_vit_qk_norm": lambda: _timm_vit(True),
    "torchvision_vit": _torchvision_vit,
    "torchaudio_conformer": _torchaudio_conformer,
    "pyg_gps": _pyg_gps,
}


def _patched_modules(model):
    return [m for m in model.modules() if isinstance(m, (PatchedMultiheadAttention, PatchedTimmAttention))]


def _attend(module, x):
    """Call a patched attention module on batch-first self-attention input x."""
    if isinstance(module, PatchedTimmAttention):
        return module(x)
    tokens = x if module.batch_first else x.transpose(0, 1)
    out = module(tokens, tokens, tokens, need_weights=False)[0]
    return out if module.batch_first else out.transpose(0, 1)


def _qkv_projection(module):
    if isinstance(module, PatchedTimmAttention):
        return module.qkv.weight, module.qkv.bias
    return module.in_proj_weight, module.in_proj_bias


@torch.no_grad()
def _scale_keys(module, factor):
    """Multiply the key projection (weight rows and bias) by factor: every key vector grows by it."""
    weight, bias = _qkv_projection(module)
    rows = slice(weight.shape[0] // 3, 2 * weight.shape[0] // 3)
    weight[rows] *= factor
    if bias is not None:
        bias[rows] *= factor


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # the unpatched encoder's fused path
@pytest.mark.parametrize("family", FAMILIES)
def test_standard_gives_the_original_outputs(family):
    model, run, count = FAMILIES[family]()
    model.eval()
    patched = copy.deepcopy(model)
    report = replace_attention(patched, "standard")
    assert len(report.replaced) == count and not report.skipped
    assert len(_patched_modules(patched)) == count
    with torch.no_grad():
        torch.testing.assert_close(run(patched), run(model), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "timm_vit_qk_norm"])  # its LayerNorm hides key scale
@pytest.mark.parametrize("variant", ["quest", "standard"])
def test_quest_ignores_key_scale_after_patching(family, variant):
    model, _, _ = FAMILIES[family]()
    replace_attention(model, variant)
    module = _patched_modules(model)[0].eval()
    nn.init.xavier_uniform_(_qkv_projection(module)[0])  # timm's small init gives near-uniform attention
    x = torch.randn(2, 5, DIM, generator=_generator())
    before = _attend(module, x)
    _scale_keys(module, 7.0)
    after = _attend(module, x)
    if variant == "quest":
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)
    else:  # the test can tell the difference
        assert (after - before).norm() > 0.01 * before.norm()


@pytest.mark.parametrize("family", FAMILIES)
def test_training_steps_update_weights_and_gains(family):
    torch.manual_seed(0)
    model, run, _ = FAMILIES[family]()
    replace_attention(model, "qknorm", seq_len=5)
    model.train()
    gains = [m.qk.gain for m in _patched_modules(model)]
    start = [g.detach().clone() for g in gains]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        loss = (run(model) - 1).pow(2).mean()  # torchvision starts its head at zero: aim away from it
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    assert all(not torch.equal(g, s) for g, s in zip(gains, start))


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dicts_still_load(family):
    model, run, _ = FAMILIES[family]()
    original = model.state_dict()

    quest = copy.deepcopy(model)
    replace_attention(quest, "quest")
    assert quest.state_dict().keys() == original.keys()
    quest.load_state_dict(original)  # strict: same names, nothing added

    learnable = copy.deepcopy(model)
    replace_attention(learnable, "qknorm_ds")
    result = learnable.load_state_dict(original, strict=False)  # an original checkpoint: only the new scales miss
    assert not result.unexpected_keys
    assert result.missing_keys and all(".qk." in key for key in result.missing_keys)

    fresh, _, _ = FAMILIES[family]()
    replace_attention(fresh, "qknorm_ds")
    fresh.load_state_dict(learnable.state_dict())
    fresh.eval(), learnable.eval()
    with torch.no_grad():
        torch.testing.assert_close(run(fresh), run(learnable))


def test_optimizer_made_before_patching_still_trains_the_same_tensors():
    model, run, _ = _torch_encoder(True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model.layers[0].self_attn.in_proj_weight
    replace_attention(model, "quest")
    assert model.layers[0].self_attn.in_proj_weight is weight
    before = weight.detach().clone()
    run(model).sum().backward()
    optimizer.step()
    assert not torch.equal(weight, before)


def test_torch_call_signature_is_kept():
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(DIM, HEADS)
    patched = copy.deepcopy(reference)
    replace_attention(patched, "standard")
    x = torch.randn(5, DIM)  # unbatched, and need_weights left at torch's default (True)
    (out, weights), (ref_out, ref_weights) = patched(x, x, x), reference(x, x, x)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-4)
    assert isinstance(patched, nn.MultiheadAttention)  # PyG's GPSConv checks this before calling attention


def test_gps_reset_parameters_still_works():
    """PyG's ``GPSConv.reset_parameters`` calls torch's ``_reset_parameters`` on its attention: after patching
    it re-draws the projections (torch's init: Xavier-uniform weights, zero biases) and leaves the patch."""
    model, run, _ = _pyg_gps()
    replace_attention(model, "quest")
    attn = model.attn
    with torch.no_grad():
        for parameter in (attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.bias):
            parameter.fill_(3.0)
    model.reset_parameters()
    bound = (6 / (DIM + 3 * DIM)) ** 0.5  # Xavier-uniform over [3 * DIM, DIM]
    assert attn.in_proj_weight.abs().max() <= bound and attn.in_proj_weight.std() > bound / 4
    assert not attn.in_proj_bias.any() and not attn.out_proj.bias.any()
    assert model.attn is attn and isinstance(attn, PatchedMultiheadAttention) and attn.variant.name == "quest"
    assert torch.isfinite(run(model)).all()


def test_probes_see_patched_modules():
    model, run, _ = _timm_vit(False)
    replace_attention(model, "quest")
    found = probes.attention_probes(model)
    assert len(found) == 2
    for probe in found.values():
        probe.enabled = True
    run(model)
    assert all(torch.isfinite(p.stats["max_logit"]) for p in found.values())


def test_report_lists_what_it_leaves_alone():
    from torch_geometric.nn import GPSConv

    class MyAttention(nn.Module):
        def forward(self, x):
            return x

    model = nn.ModuleDict({
        "ok": nn.MultiheadAttention(DIM, HEADS),
        "kdim": nn.MultiheadAttention(DIM, HEADS, kdim=8, vdim=8),
        "bias_kv": nn.MultiheadAttention(DIM, HEADS, add_bias_kv=True),
        "zero_attn": nn.MultiheadAttention(DIM, HEADS, add_zero_attn=True),
        "custom": MyAttention(),
        "performer": GPSConv(DIM, None, heads=HEADS, attn_type="performer"),
    })
    report = replace_attention(model, "quest")
    assert list(report.replaced) == ["ok"]
    assert set(report.skipped) == {"kdim", "bias_kv", "zero_attn", "custom", "performer.attn"}
    assert "kdim" in report.skipped["kdim"] and "PerformerAttention" in report.skipped["performer.attn"]
    assert type(model["kdim"]) is nn.MultiheadAttention
    assert "left alone custom" in str(report)


def test_nothing_to_patch_is_a_warning(caplog):
    report = replace_attention(nn.Sequential(nn.Linear(DIM, DIM)), "quest")
    assert not report.replaced
    assert not replace_attention(Encoder(DIM, 1, HEADS, attn_layer=attention_layer(variant="quest"))).skipped  # already common.attention
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "no attention it can convert" in r.getMessage()]
    assert len(warnings) == 2


def test_elliptical_variants_are_refused():
    model, _, _ = _torch_encoder(True)
    with pytest.raises(ValueError, match="common.blocks.Encoder"):
        replace_attention(model, "elliptical")


def test_torch_fused_inference_paths_do_not_bypass_the_variant():
    """In eval without grad, nn.TransformerEncoder packs padded batches into nested tensors and its layers
    call a fused kernel that never calls self_attn; after patching, every layer's attention must run."""
    model, run, _ = _torch_encoder(True)
    replace_attention(model, "quest")
    model.eval()
    found = probes.attention_probes(model)
    for probe in found.values():
        probe.enabled = True
    with torch.no_grad():
        run(model)
    assert len(found) == 2 and all(p.stats for p in found.values())


def test_standard_matches_an_encoder_with_padding_where_docs_say():
    """docs/attention.md: a converted nn.TransformerEncoder with ``standard`` equals the original at every
    non-padded position, and at padded ones too but in eval without gradients, where torch's nested-tensor fast
    path writes zeros there."""
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 2).eval()
    converted = copy.deepcopy(encoder)
    replace_attention(converted, "standard")
    x, pad = torch.randn(3, 8, 32), torch.zeros(3, 8, dtype=torch.bool)
    pad[1, 5:], pad[2, 2:] = True, True
    with torch.no_grad():
        theirs, ours = encoder(x, src_key_padding_mask=pad), converted(x, src_key_padding_mask=pad)
    torch.testing.assert_close(ours[~pad], theirs[~pad], atol=1e-5, rtol=1e-5)
    assert theirs[pad].abs().max() == 0 and ours[pad].abs().max() > 0  # the documented difference
    torch.testing.assert_close(ours.masked_fill(pad[..., None], 0), theirs, atol=1e-5, rtol=1e-5)
    theirs, ours = encoder(x, src_key_padding_mask=pad), converted(x, src_key_padding_mask=pad)  # gradients on
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
