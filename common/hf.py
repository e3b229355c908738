"""The QUEST study's attention variants inside Hugging Face transformers models.

    import common.hf  # registers the variants as attention backends, by their names
    model = AutoModelForCausalLM.from_config(config, attn_implementation="quest")

Importing this module registers every variant and ablation with transformers' ``AttentionInterface`` (and SDPA's
masks with its ``AttentionMaskInterface``). The parameter-free ones (standard, quest, qnorm, uniform) need nothing
else; the QK-norm family's learnable scales and the elliptical variants' previous values, which a backend function
cannot own, are added to each layer by ``common.patch.replace_attention`` (``convert``). A model saved under a
variant records it in its ``config.json`` (``attn_implementation``), and ``from_pretrained`` rebuilds it with the
variant and its learnt scales.

What a backend does with the call transformers makes (RoPE, float32 folds, the model's ``scaling``, grouped-query
attention, masks, sinks, the KV cache, what it refuses): docs/guides/in-your-model.md.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor, nn

from common import probes
from common.attention import (
    ABLATIONS,
    VARIANTS,
    QKFold,
    Variant,
    attend_folded,
    causal_mask,
    explicit_mask,
    fold_qk,
    get_variant,
    make_fold,
)
from common.attention.elliptical import _unit_max, elliptical_metric
from common.errors import ConfigError
from common.optional import require

_modeling = require("transformers.modeling_utils", extra="hf")
_masking = require("transformers.masking_utils", extra="hf")
_configuration = require("transformers.configuration_utils", extra="hf")

BACKENDS = (*VARIANTS, *ABLATIONS)  # the attn_implementation names this module registers

# Every keyword a transformers model passes to its attention function, by what the backends do with it.
# tests/test_hf_backend.py reads the installed library's models/*/modeling_*.py for the keywords of every such call
# (and the keys of its TransformersKwargs) and fails on one that is in none of these, so that a new library
# release cannot bring a feature the backends would drop without a word.
HONOURED = frozenset({"query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal", "position_bias",
                      "output_attentions", "s_aux", "sinks", "indices"})
# Already in what the backend is handed (the mask transformers builds holds sliding windows and packed sequences,
# the rotated q and k the positions), or a flash kernel's bookkeeping: the library's SDPA ignores them too.
IGNORED = frozenset({"sliding_window", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                     "max_length_k", "seq_idx", "deterministic", "use_cache", "output_hidden_states",
                     "output_router_logits", "num_items_in_batch"})
# Features no variant computes: a call that passes one (anything but None) is refused, naming it and what to do.
REFUSED = {"softcap": ("logit soft-capping", "set the config's attn_logit_softcapping to None"),
           "block_indices": ("block-sparse attention from its indexer", "load it with attn_implementation='eager'")}


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
    chain: dict[int, Tensor] = {}  # each layer's last values, by its place: read by elliptical variants only
    for index, layer in enumerate(layers):
        heads = layer.config.num_attention_heads
        head_dim = getattr(layer, "head_dim", None) or layer.config.hidden_size // heads
        layer.qk = make_fold(spec, heads, head_dim, **attention_kwargs).to(next(layer.parameters()))
        layer.probe = probes.Probe()
        layer.qk_chain, layer.qk_index = chain, index
        layer.config._attn_implementation = spec.name


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, *,
                      variant: str, position_bias: Tensor | None = None, output_attentions: bool = False,
                      s_aux: Tensor | None = None, sinks: Tensor | None = None, indices: Tensor | None = None,
                      **kwargs) -> tuple[Tensor, Tensor | None]:
    """One attention call of a transformers layer under ``variant``: q [batch, heads, tokens, head_dim], k and v
    [batch, kv_heads, keys, head_dim]. ``s_aux`` (per head) and ``sinks`` (per query) are attention sinks, one more
    logit in each row's softmax with nothing to carry; ``indices`` the keys each query may see (a top-k indexer's)."""
    _refuse(module, variant, kwargs)
    _check_mask(attention_mask, query, variant)
    fold = _fold_of(module, variant)
    spec = fold.variant if fold is not None else get_variant(variant)
    q_len = query.shape[2]
    causal = q_len > 1 and attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if causal and key.shape[2] > q_len:  # a static cache's first pass: SDPA's top-left triangle, over the filled slots
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    if indices is not None:
        attention_mask, causal = _top_k(attention_mask, indices, causal, q_len, key.shape[2]), False
    metric = _elliptical_metric(module, value, attention_mask, causal, q_len) if spec.elliptical else None
    mask = _sdpa_mask(attention_mask, position_bias, value.dtype)
    sink = s_aux.view(1, -1, 1, 1) if s_aux is not None else sinks
    key, value, groups = _grouped(query, key, value, fold, masked=mask is not None or sink is not None)
    if metric is not None:
        metric = metric.repeat_interleave(query.shape[1] // metric.shape[1], 1)
    with torch.autocast(query.device.type, enabled=False):  # norms in float32 under bf16/fp16 autocast too
        qf, kf, scale = fold_qk(*_in_float32(query, key, spec), spec, fold=fold, metric=metric)
    qf, kf = qf.to(value.dtype), kf.to(value.dtype)  # no copy where the variant left them in the model's dtype
    if spec.scaled and scaling is not None:
        scale = scaling
    if sink is not None:
        kf, value, mask, causal = _with_sink(kf, value, mask, causal, sink, q_len)
    out = attend_folded(qf, kf, value, scale, attn_bias=mask, causal=causal, dropout_p=dropout,
                        probe=getattr(module, "probe", None), raw_qk=(query, key), enable_gqa=groups > 1)
    weights = _weights(qf, kf, scale, mask, causal, groups, sink is not None) if output_attentions else None
    return out.transpose(1, 2).contiguous(), weights


def _refuse(module: nn.Module, variant: str, kwargs: dict) -> None:
    for name, (feature, remedy) in REFUSED.items():
        if kwargs.get(name) is not None:
            raise ConfigError(f"{type(module).__name__} asks for {feature} ({name}=), which attn_implementation="
                              f"{variant!r} does not compute: {remedy}")


def _check_mask(mask: Tensor | None, query: Tensor, variant: str) -> None:
    """Refuse a mask SDPA would refuse: one of integers (0/1) taken as an additive bias would mask nothing."""
    if mask is None or mask.dtype == torch.bool or mask.dtype == query.dtype:
        return
    if mask.is_floating_point() and torch.is_autocast_enabled(query.device.type):  # autocast casts it for SDPA too
        return
    raise ConfigError(f"attn_implementation={variant!r} takes an attention_mask that is boolean (True = attend) or "
                      f"additive in the queries' dtype {query.dtype}, as SDPA does, not {mask.dtype}: convert it "
                      "with mask.bool() or an additive float mask")


def _fold_of(module: nn.Module, variant: str) -> QKFold | None:
    """The layer's own fold when ``convert`` gave it this variant's; None for a parameter-free variant without one."""
    fold = getattr(module, "qk", None)
    if isinstance(fold, QKFold) and fold.variant.name == variant:
        return fold
    spec = get_variant(variant)
    if spec.learnable or spec.elliptical:
        needs = "learnable scales" if spec.learnable else "the previous layer's values"
        raise ConfigError(f"attn_implementation={variant!r} needs {needs} in every layer: load a saved model with "
                          f"common.hf.from_pretrained, or add them with common.patch.replace_attention(model, {variant!r})")
    return None


def _grouped(query: Tensor, key: Tensor, value: Tensor, fold: QKFold | None, masked: bool) -> tuple[Tensor, Tensor, int]:
    """(key, value, groups) for grouped-query attention: SDPA's ``enable_gqa`` reads each key/value head for its group of
    query heads, without copies. Copied per query head (the library's ``repeat_kv``) where a gain per query head must
    be folded into the keys, or where a mask would send CUDA's SDPA with ``enable_gqa`` to its unfused kernel."""
    groups = query.shape[1] // key.shape[1]
    gain = None if fold is None else fold.logit_gain(query)
    if groups > 1 and ((gain is not None and gain.numel() > 1) or (masked and query.device.type == "cuda")):
        return key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1), 1
    return key, value, groups


def _in_float32(query: Tensor, key: Tensor, spec: Variant) -> tuple[Tensor, Tensor]:
    """q and k as the fold takes them: in float32 where the variant normalises or scales them (under bf16 the norms
    and gains would lose their precision), as they are where it leaves them alone (QUEST's queries)."""
    learnable = spec.learnable
    return (query.float() if spec.norm_q or learnable else query), (key.float() if spec.norm_k or learnable else key)


def _sdpa_mask(mask: Tensor | None, position_bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The mask as SDPA takes it: a boolean mask (True = attend) stays boolean unless T5's position bias joins it."""
    if position_bias is None:
        return mask
    bias = position_bias.to(dtype)
    if mask is None:
        return bias
    return torch.where(mask, bias, float("-inf")) if mask.dtype == torch.bool else mask + bias


def _top_k(mask: Tensor | None, indices: Tensor, causal: bool, q_len: int, k_len: int) -> Tensor:
    """The mask with only the keys a top-k indexer picked for each query (indices [batch, queries, k]), as
    DeepSeek-V3.2 masks them itself for eager and SDPA."""
    picked = torch.zeros(*indices.shape[:2], k_len, dtype=torch.bool, device=indices.device)
    picked = picked.scatter_(-1, indices.long(), True)[:, None]
    if mask is None:
        return picked & causal_mask(q_len, k_len, picked.device) if causal else picked
    return mask & picked if mask.dtype == torch.bool else mask.masked_fill(~picked, torch.finfo(mask.dtype).min)


def _with_sink(kf: Tensor, value: Tensor, mask: Tensor | None, causal: bool, sink: Tensor,
               q_len: int) -> tuple[Tensor, Tensor, Tensor, bool]:
    """A sink is one more logit in each row's softmax whose probability carries nothing (gpt-oss's eager attention
    appends the column and drops it after): one more key, zero (its logit 0 at any scale) with value zero, and the
    sink's logit in that key's column of an additive mask, through which its gradient flows."""
    k_len, dtype = kf.shape[2], value.dtype
    full = explicit_mask(None, mask, causal, q_len, k_len, dtype, kf.device)
    if full is None:
        full = torch.zeros(1, 1, q_len, k_len, dtype=dtype, device=kf.device)
    elif full.dtype == torch.bool:
        full = torch.zeros(full.shape, dtype=dtype, device=kf.device).masked_fill(~full, float("-inf"))
    shape = torch.broadcast_shapes(full.shape[:-1], sink.shape[:-1])
    with_sink = torch.cat([full.expand(*shape, k_len), sink.to(dtype).expand(*shape, 1)], -1)
    pad = kf.new_zeros(*kf.shape[:2], 1, kf.shape[3])
    return torch.cat([kf, pad], 2), torch.cat([value, pad.to(value.dtype)], 2), with_sink, False


def _weights(qf: Tensor, kf: Tensor, scale: float, mask: Tensor | None, causal: bool, groups: int, sink: bool) -> Tensor:
    """The attention weights ``output_attentions`` returns, written out only then; a sink's column dropped."""
    kf = kf.repeat_interleave(groups, 1) if groups > 1 else kf
    full = explicit_mask(None, mask, causal, qf.shape[2], kf.shape[2], qf.dtype, qf.device)
    weights = probes.explicit_attention(qf, kf, scale, full)[1]
    return weights[..., :-1] if sink else weights


@torch.no_grad()
def _elliptical_metric(module: nn.Module, values: Tensor, mask: Tensor | None, causal: bool, q_len: int) -> Tensor | None:
    """The elliptical weights of this call's queries from the previous layer's values, each query's mean over the
    keys it may see (with the KV cache, transformers hands a layer every key's values, so cached decoding matches a
    full pass); None in the first layer, which runs the base variant. Each layer reads the values the layer before
    it left in the chain: under gradient checkpointing, which runs the layers again last to first in the backward
    pass, a layer run again finds the same values as in the forward pass, so its gradients are exact."""
    chain, index = module.qk_chain, module.qk_index
    prev = chain.get(index - 1)
    chain[index] = values.detach()
    if prev is None or prev.shape != values.shape:
        return None
    if mask is None:
        metric = elliptical_metric(values, prev, eps=module.qk.eps, causal=causal)
        return metric[..., -q_len:, :] if causal else metric
    visible = (mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min).to(values.dtype)
    return _unit_max(visible @ (values - prev).abs() / visible.sum(-1, keepdim=True).clamp_min(1), module.qk.eps)


def from_pretrained(model_class, path, **kwargs):
    """A model saved under a variant, rebuilt with it: ``model_class.from_pretrained(path, **kwargs)`` (an
    ``AutoModel...`` class or the model's own) with the variant its ``config.json`` records, and, for a variant with
    learnable scales or the elliptical chain, those scales added before the weights load, so that the library loads
    the learnt ones with the rest (a plain ``from_pretrained`` would drop them as unexpected)."""
    transformers = require("transformers", extra="hf")
    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(path, **_hub_kwargs(kwargs))
    if "attn_implementation" in kwargs:
        config._attn_implementation = kwargs.pop("attn_implementation")
    variant = config._attn_implementation
    if variant not in BACKENDS or not (get_variant(variant).learnable or get_variant(variant).elliptical):
        return model_class.from_pretrained(path, config=config, **kwargs)
    concrete = _model_class(model_class, config)
    model = _with_scales(concrete, variant).from_pretrained(path, config=config, **kwargs)
    model.__class__ = concrete  # the loading subclass only added the scales
    return model


def _hub_kwargs(kwargs: dict) -> dict:
    return {name: kwargs[name] for name in ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code")
            if name in kwargs}


def _model_class(model_class, config):
    """The model class an ``AutoModel...`` class picks for ``config``; a model's own class as it is."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    return require("transformers.models.auto.auto_factory", extra="hf")._get_model_class(config, mapping)


def _with_scales(concrete, variant: str):
    """``concrete`` with ``variant``'s folds added to every attention layer when the model is built, before
    ``from_pretrained`` loads the weights into it."""
    def __init__(self, config, *args, **kwargs):
        concrete.__init__(self, config, *args, **kwargs)
        convert([module for module in self.modules() if is_attention(module)], variant)

    return type(concrete.__name__, (concrete,), {"__init__": __init__, "__module__": concrete.__module__})


def _record_variant(to_dict):
    """``PreTrainedConfig.to_dict`` writing ``attn_implementation`` when it is one of these backends, which the library
    otherwise leaves out: ``from_pretrained`` reads it back, and without ``import common.hf`` refuses to load, naming it."""

    @functools.wraps(to_dict)
    def recorded(self) -> dict:
        out = to_dict(self)
        variant = getattr(self, "_attn_implementation_internal", None)
        if variant in BACKENDS:
            out["attn_implementation"] = variant
        return out

    recorded.records_variant = True
    return recorded


def _backend(variant: str):
    def forward(module, query, key, value, attention_mask, *args, **kwargs):
        return attention_forward(module, query, key, value, attention_mask, *args, variant=variant, **kwargs)

    forward.__name__ = forward.__qualname__ = f"{variant}_attention_forward"
    return forward


for _name in BACKENDS:
    _modeling.AttentionInterface.register(_name, _backend(_name))
    _masking.AttentionMaskInterface.register(_name, _masking.sdpa_mask)
if not getattr(_configuration.PreTrainedConfig.to_dict, "records_variant", False):  # once, if this module is reloaded
    _configuration.PreTrainedConfig.to_dict = _record_variant(_configuration.PreTrainedConfig.to_dict)
