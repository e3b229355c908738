"""Put a QUEST-study attention variant into a model someone else wrote, in place, keeping its weights.

    from common.patch import replace_attention
    report = replace_attention(model, variant="quest")
    print(report)            # which modules were converted, which were left alone and why

Converted in place (the module objects and parameter tensors stay the same, so state dicts, optimisers
and hooks keep working; learnable variants add their gains under ``<module>.qk``):

- ``torch.nn.MultiheadAttention`` with one embedding size for q/k/v, no ``add_bias_kv`` and no
  ``add_zero_attn``, and with it ``nn.TransformerEncoder/DecoderLayer``, torchvision's ``vit_*``,
  torchaudio's ``Conformer`` and PyG's ``GPSConv``, which all build on it;
- timm's ViT ``Attention`` (its qkv, q_norm/k_norm, proj and dropouts are kept);
- the attention layers of Hugging Face transformers models that compute attention through its
  ``AttentionInterface`` (Llama, Qwen3, GPT-NeoX, GPT-2, ViT, BERT, ...): ``common.hf`` gives each the variant's
  fold and selects the variant's backend. These take the elliptical variants too: transformers hands each layer
  every key's values, from which the previous layer's are kept.

Conversion swaps the module's class (as ``torch.nn.utils.parametrize`` does) for one whose forward runs
``common.attention``; every converted module carries a stability probe like the project's own layers.
Attention-like modules of any other kind are left alone and listed in the report.
"""
from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from common import probes
from common.attention import EdgeMultiheadAttention, MultiheadAttention, attend_folded, get_variant, make_fold

log = logging.getLogger(__name__)

# Class names that suggest a module computes attention: such modules, if not converted, are reported.
_ATTENTION_LIKE = re.compile(r"attention|attn", re.IGNORECASE)


@dataclass
class PatchReport:
    """What ``replace_attention`` did, by module name (``""`` is the model itself); ``str()`` lists it.

    Args:
        variant: The variant's name.
        replaced: Module name -> what it was before conversion.
        skipped: Module name -> why it was left alone.
    """

    variant: str
    replaced: dict[str, str] = field(default_factory=dict)  # module name -> what it was
    skipped: dict[str, str] = field(default_factory=dict)  # module name -> why it was left alone

    def __str__(self) -> str:
        lines = [f"replace_attention(variant={self.variant!r}): {len(self.replaced)} replaced, {len(self.skipped)} left alone"]
        lines += [f"  replaced {name or '(model)'}: {kind}" for name, kind in self.replaced.items()]
        lines += [f"  left alone {name or '(model)'}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


class PatchedMultiheadAttention(MultiheadAttention, nn.MultiheadAttention):
    """A ``torch.nn.MultiheadAttention`` running ``common.attention``. It stays an instance of torch's class
    because callers check that (PyG's ``GPSConv`` silently skips attention otherwise). Made only by
    ``_convert``, which converts an existing module in place.

    Attributes:
        qk: The variant's fold (``common.attention.QKFold``), holding its learnable scales if any.
        probe: The module's stability probe, off until enabled.
    """

    def _reset_parameters(self) -> None:  # torch's name, called by e.g. GPSConv.reset_parameters
        self.reset_parameters()

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        """torch's signature, defaults and mask conventions; unbatched ``(q_len, dim)`` inputs give unbatched output and
        weights without the batch dimension."""
        if query.dim() == 2:
            dim = 0 if self.batch_first else 1
            padding = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
            out, weights = self.forward(query.unsqueeze(dim), key.unsqueeze(dim), value.unsqueeze(dim), padding,
                                        need_weights, attn_mask, average_attn_weights, is_causal)
            return out.squeeze(dim), None if weights is None else weights.squeeze(0)
        return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                               average_attn_weights, is_causal)


class PatchedTimmAttention(nn.Module):
    """timm's ViT ``Attention`` with its scores computed by ``common.attention``: timm's own qkv, q_norm, k_norm, norm,
    gate, proj and dropouts are kept (and so are its state-dict names). Made only by ``_convert``, which converts an
    existing module in place. ``qk`` and ``probe``: as ``PatchedMultiheadAttention``'s."""

    @property
    def variant(self):
        """The module's ``Variant``, as its fold holds it."""
        return self.qk.variant

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        """timm's signature, ``x`` ``(batch, tokens, dim)`` to the same shape; ``attn_mask`` has SDPA meaning (boolean
        True = attend, or additive), broadcasting to ``(batch, heads, tokens, tokens)``; ``is_causal`` masks each
        token's later ones."""
        batch, tokens, _ = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)

        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = x.new_zeros(attn_mask.shape).masked_fill(~attn_mask, float("-inf"))
        qf, kf, scale = self.qk(q, k)
        x = attend_folded(qf, kf, v, scale, attn_bias=attn_mask, causal=is_causal, probe=self.probe, raw_qk=(q, k),
                          dropout_p=self.attn_drop.p if self.training else 0.0)

        x = x.transpose(1, 2).reshape(batch, tokens, self.num_heads * self.head_dim)
        if getattr(self, "norm", None) is not None:  # older timm releases have neither norm nor gate
            x = self.norm(x)
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))


def _convert(module: nn.Module, patched: type, weight: Tensor, variant: str, **attention_kwargs) -> None:
    """Give ``module`` the variant's fold (on ``weight``'s device and dtype) and a probe, and its class ``patched``;
    its parameters stay."""
    module.qk = make_fold(variant, module.num_heads, module.head_dim, **attention_kwargs).to(weight)
    module.probe = probes.Probe()
    if isinstance(module, nn.MultiheadAttention):
        # torch reads this flag only to choose its fused encoder-layer kernel, which would bypass the variant.
        module._qkv_same_embed_dim = False
    module.__class__ = patched


def _torch_blocker(module: nn.MultiheadAttention) -> str | None:
    """Why this nn.MultiheadAttention cannot be converted, or None."""
    blockers = {"kdim/vdim different from embed_dim": not module._qkv_same_embed_dim,
                "add_bias_kv": module.bias_k is not None, "add_zero_attn": module.add_zero_attn}
    return next((f"nn.MultiheadAttention with {what}" for what, found in blockers.items() if found), None)


def replace_attention(model: nn.Module, variant: str = "quest", **attention_kwargs) -> PatchReport:
    """Convert every supported attention module of ``model`` to ``variant`` in place and report what was done. Masks
    keep torch's conventions (``key_padding_mask``: True = padding). Logs a warning when nothing could be converted.

    With ``variant="standard"`` the model computes what it computed before, to float rounding, but at the padded
    positions of an eval-mode ``nn.TransformerEncoder``, where torch's fused fast path (which converted layers never
    take) writes zeros (docs/attention.md, "What to know before converting a model").

    Args:
        **attention_kwargs: The variant's learnable scales (``seq_len``, ``qk_gain_init``, ``eps``, ``l2norm_kernel``);
            without ``seq_len`` a QK-norm gain starts at sqrt(head_dim), not log2(L² − L).

    Returns:
        The modules converted and those left alone, by name.

    Raises:
        ValueError: If ``variant`` is unknown, or is elliptical and ``model`` has no transformers attention layers.
    """
    spec = get_variant(variant)
    hf_layers = {}
    if "transformers" in sys.modules:  # timm and transformers are never imported here: a model holding their layers has loaded them
        from common import hf

        hf_layers = {name: m for name, m in model.named_modules() if hf.is_attention(m)}
    if spec.elliptical and not hf_layers:
        raise ValueError(f"variant {variant!r} reads each layer's previous values, which third-party layers do "
                         "not pass on; build the model from common.blocks.Encoder (or take a transformers model) to use it")
    report = PatchReport(spec.name)
    if hf_layers:
        hf.convert(list(hf_layers.values()), spec.name, **attention_kwargs)
        report.replaced |= {name: f"transformers {type(m).__name__}" for name, m in hf_layers.items()}
    timm_attention = getattr(sys.modules.get("timm.layers.attention"), "Attention", None)
    kinds = (MultiheadAttention, EdgeMultiheadAttention, PatchedTimmAttention)  # already common.attention
    for name, module in list(model.named_modules()):
        if isinstance(module, kinds) or name in hf_layers:
            continue
        if spec.elliptical and isinstance(module, (nn.MultiheadAttention, timm_attention or ())):
            report.skipped[name] = "elliptical variants need each layer's previous values, which it does not pass on"
        elif type(module) is nn.MultiheadAttention:
            if blocker := _torch_blocker(module):
                report.skipped[name] = blocker
            else:
                _convert(module, PatchedMultiheadAttention, module.in_proj_weight, spec.name, **attention_kwargs)
                report.replaced[name] = "torch.nn.MultiheadAttention"
        elif timm_attention is not None and type(module) is timm_attention:
            _convert(module, PatchedTimmAttention, module.qkv.weight, spec.name, **attention_kwargs)
            report.replaced[name] = "timm.layers.Attention"

    for name, module in model.named_modules():
        if isinstance(module, nn.TransformerEncoder) and isinstance(module.layers[0].self_attn, PatchedMultiheadAttention):
            # Its inference path packs padded batches into nested tensors for torch's fused kernel only.
            module.use_nested_tensor = False
        attention_like = _ATTENTION_LIKE.search(type(module).__name__) or isinstance(module, nn.MultiheadAttention)
        holds_replaced = any(child.startswith(f"{name}." if name else "") for child in report.replaced)
        if attention_like and not isinstance(module, kinds) and name not in report.replaced | report.skipped and not holds_replaced:
            report.skipped[name] = f"unknown attention module {type(module).__module__}.{type(module).__qualname__}"

    if not report.replaced:
        log.warning("replace_attention found no attention it can convert in %s; left alone: %s",
                    type(model).__name__, report.skipped or "nothing attention-like")
    return report
