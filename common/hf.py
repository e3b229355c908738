"""The QUEST study's attention variants inside Hugging Face transformers models.

    import common.hf  # registers the variants as attention backends, by their names
    model = AutoModelForCausalLM.from_config(config, attn_implementation="quest")

Importing this module registers every variant and ablation with transformers' ``AttentionInterface`` (and SDPA's
masks with its ``AttentionMaskInterface``). The parameter-free ones (standard, quest, qnorm, uniform) need nothing
else; the QK-norm family's learnable scales and the elliptical variants' previous values, which a backend function
cannot own, are added to each layer by ``common.patch.replace_attention`` (``convert``).

What a backend does with the call transformers makes (RoPE, float32 folds, the model's ``scaling``, grouped-query
attention, masks, the KV cache, soft-capping refused): docs/in-your-model.md.
"""
from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from common import probes
from common.attention import ABLATIONS, VARIANTS, AttentionState, QKFold, attend_folded, explicit_mask, fold_qk, get_variant, make_fold
from common.attention.elliptical import _unit_max, elliptical_metric
from common.optional import require

_modeling = require("transformers.modeling_utils", extra="hf")
_masking = require("transformers.masking_utils", extra="hf")

BACKENDS = (*VARIANTS, *ABLATIONS)  # the attn_implementation names this module registers


def is_attention(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers layer that computes attention through the ``AttentionInterface``
    (most of the library's models since 4.48): its forward looks the backend up there."""
    forward = inspect.unwrap(type(module).forward)
    return type(module).__module__.startswith("transformers.") and "ALL_ATTENTION_FUNCTIONS" in forward.__code__.co_names


def convert(layers: list[nn.Module], variant: str, **attention_kwargs) -> None:
    """Give each of ``layers`` (``is_attention``, in the model's order) the fold of ``variant`` (its learnable scales,
    from ``attention_kwargs``: ``seq_len``, ``qk_gain_init``, ``eps``) and a probe, chain them for the elliptical
    metric, and select the variant's backend in their configs. Called by ``common.patch.replace_attention``."""
    spec = get_variant(variant)
    state = AttentionState()  # read by elliptical variants only; one per stack, like common.blocks.Encoder's
    for index, layer in enumerate(layers):
        heads = layer.config.num_attention_heads
        head_dim = getattr(layer, "head_dim", None) or layer.config.hidden_size // heads
        layer.qk = make_fold(spec, heads, head_dim, **attention_kwargs).to(next(layer.parameters()))
        layer.probe = probes.Probe()
        layer.qk_state, layer.qk_first = state, index == 0
        layer.config._attn_implementation = spec.name


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, *,
                      variant: str, position_bias: Tensor | None = None, softcap: float | None = None,
                      output_attentions: bool = False, **kwargs) -> tuple[Tensor, Tensor | None]:
    """One attention call of a transformers layer under ``variant``: q [batch, heads, tokens, head_dim], k and v
    [batch, kv_heads, keys, head_dim]."""
    if softcap is not None:
        raise ValueError(f"attn_implementation={variant!r} has no logit soft-capping; QUEST bounds a logit by the "
                         "query norm instead: set the model's softcap to None")
    fold = _fold_of(module, variant)
    spec = fold.variant if fold is not None else get_variant(variant)
    q_len = query.shape[2]
    causal = q_len > 1 and attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if causal and key.shape[2] > q_len:  # a static cache's first pass: SDPA's top-left triangle, over the filled slots
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    groups = getattr(module, "num_key_value_groups", 1)
    metric = _repeat_kv(_elliptical_metric(module, value, attention_mask, causal, q_len), groups) if spec.elliptical else None
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    with torch.autocast(query.device.type, enabled=False):  # norms in float32 under bf16/fp16 autocast too
        qf, kf, scale = fold_qk(query.float(), key.float(), spec, fold=fold, metric=metric)
    qf, kf = qf.to(value.dtype), kf.to(value.dtype)
    if spec.scaled and scaling is not None:
        scale = scaling
    bias = _additive(attention_mask, position_bias, value.dtype)
    out = attend_folded(qf, kf, value, scale, attn_bias=bias, causal=causal, dropout_p=dropout,
                        probe=getattr(module, "probe", None), raw_qk=(query, key))
    weights = None
    if output_attentions:
        mask = explicit_mask(None, bias, causal, q_len, kf.shape[2], qf.dtype, qf.device)
        weights = probes.explicit_attention(qf, kf, scale, mask)[1]
    return out.transpose(1, 2).contiguous(), weights


def _fold_of(module: nn.Module, variant: str) -> QKFold | None:
    """The layer's own fold when ``convert`` gave it this variant's; None for a parameter-free variant without one."""
    fold = getattr(module, "qk", None)
    if isinstance(fold, QKFold) and fold.variant.name == variant:
        return fold
    spec = get_variant(variant)
    if spec.learnable or spec.elliptical:
        needs = "learnable scales" if spec.learnable else "the previous layer's values"
        raise ValueError(f"attn_implementation={variant!r} needs {needs} in every layer: add them with "
                         f"common.patch.replace_attention(model, {variant!r})")
    return None


def _repeat_kv(x: Tensor | None, groups: int) -> Tensor | None:
    """[B, kv_heads, ...] -> [B, kv_heads * groups, ...], each kv head serving its group of query heads in turn
    (transformers' repeat_kv)."""
    return x if x is None or groups == 1 else x.repeat_interleave(groups, dim=1)


def _additive(mask: Tensor | None, position_bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    if position_bias is None:
        return mask
    return position_bias.to(dtype) if mask is None else mask + position_bias.to(dtype)


@torch.no_grad()
def _elliptical_metric(module: nn.Module, values: Tensor, mask: Tensor | None, causal: bool, q_len: int) -> Tensor | None:
    """The elliptical weights of this call's queries from the previous layer's values, each query's mean over the
    keys it may see (with the KV cache, transformers hands a layer every key's values, so cached decoding matches a
    full pass); None in the first layer, which runs the base variant."""
    state = module.qk_state
    if module.qk_first:  # a new forward pass
        state.values = None
    prev = state.exchange(values)
    if prev is None:
        return None
    if mask is None:
        metric = elliptical_metric(values, prev, eps=module.qk.eps, causal=causal)
        return metric[..., -q_len:, :] if causal else metric
    visible = (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min).to(values.dtype)
    return _unit_max(visible @ (values - prev).abs() / visible.sum(-1, keepdim=True).clamp_min(1), module.qk.eps)


def _backend(variant: str):
    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, *args, variant=variant, **kwargs)

    forward.__name__ = forward.__qualname__ = f"{variant}_attention_forward"
    return forward


for _name in BACKENDS:
    _modeling.AttentionInterface.register(_name, _backend(_name))
    _masking.AttentionMaskInterface.register(_name, _masking.sdpa_mask)
