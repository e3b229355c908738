"""Attention variants of the QUEST study, every one on the fused SDPA kernel.

Each variant is a rewrite of (q, k) followed by one call to
``torch.nn.functional.scaled_dot_product_attention`` (per head, head size d):

    variant            logit s_ij                   learnable
    standard           q·k / sqrt(d)                -
    quest              q·k̂          (no scale)      -
    qnorm              q̂·k          (no scale)      -
    qknorm             g · q̂·k̂      g per layer     g
    qknorm_hs          g_h · q̂·k̂    g per head      g
    qknorm_ds          (c_q⊙q̂)·(c_k⊙k̂)              c_q, c_k ∈ R^d
    qk_layernorm       LN(q)·LN(k) / sqrt(d)        LN gains γ_q, γ_k ∈ R^d
    elliptical         (m⊙q)·k / sqrt(d)            - (m from values, no grad)
    elliptical_quest   (m⊙q)·k̂      (no scale)      -

QUEST's logit is ‖q_i‖·cos(q_i, k_j): the query norm sets the sharpness of its own row, while no key
can grow its norm to take attention from every query at once.  Explicit [tokens × tokens] logits are
only formed when asked for (``need_weights`` or a stability probe).

A variant is one ``Variant`` entry in ``VARIANTS``: which of q and k are L2-normalised, whether the
1/sqrt(d) scale stays, whether it is elliptical, and its ``fold``, the name of the ``QKFold`` class that
owns its learnable scales ("LayerGain", "HeadGain", "DimScale"; plain "QKFold" when it has none). A variant
is learnable when its fold owns parameters (``FOLD_SCALES``); docs/guides/add-a-variant.md lists every place a new
variant or fold touches.

Layers of a stack share one ``AttentionState``: each attention module reads the previous layer's
values from it (elliptical variants need them) and leaves its own, so a stack never needs to know
which variant it runs. Causal decoding one token at a time keeps a ``KVCache`` per layer across
forward passes.

Self-attention over 2 sequences of 10 tokens, 64 dimensions in 4 heads:

    from common.attention import MultiheadAttention
    out, _ = MultiheadAttention(64, 4, variant="quest")(torch.randn(2, 10, 64))  # out [2, 10, 64]

Each file needs at import only those it imports: ``variants.py`` (the variants as data) needs nothing, the rest
torch only (PyG for the edge path, imported on use).
"""
import importlib

# Every name is re-exported lazily (PEP 562): listing variants and checking configs import this package for
# VARIANTS and get_variant only, and should not wait for torch to load. A name's file is imported, and torch
# with it, when the name is first asked for.
_EXPORTS = {
    "variants": ("Variant", "VARIANTS", "ABLATIONS", "FOLD_SCALES", "get_variant"),
    "kernels": ("l2_normalize", "KERNELS"),
    "folds": ("QKFold", "LayerGain", "HeadGain", "DimScale", "QKLayerNorm", "ZeroQuery", "FOLDS", "qknorm_gain_init", "make_fold",
              "fold_qk"),
    "elliptical": ("elliptical_metric", "edge_elliptical_metric"),
    "state": ("AttentionState", "KVCache"),
    "functional": ("causal_mask", "merge_masks", "explicit_mask", "attend", "attend_folded"),
    "modules": ("MultiheadAttention", "EdgeMultiheadAttention", "attention_layer"),
}
_SUBMODULE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_SUBMODULE)


def __getattr__(name: str):
    if name not in _SUBMODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE[name]}"), name)
    globals()[name] = value  # found directly from now on, without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULE})
