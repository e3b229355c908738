"""A Hugging Face transformers causal LM built from a config (no download) at the size of our GPT, for
``model.arch=llama|qwen3|gpt_neox|gpt2``: the same run, data and task as ``arch=gpt``, on the library's own layers.

Every variant reaches its attention layers through ``common.patch.replace_attention`` (``common.hf``): the
parameter-free ones as registered backends, the QK-norm family with its learnable scales (started from the run's
``seq_len = data.context``), the elliptical pair chained layer to layer. The model starts as the library
initialises it (N(0, 0.02²) weights; GPT-2 also scales its residual projections by 1/√(2·depth), Llama and
Qwen3 do not). Llama and Qwen3 (SwiGLU, three matrices) carry 1.5x our GPT's MLP parameters at the same
``mlp_ratio``; positions are rotary (GPT-NeoX on a quarter of each head) except GPT-2's learned table.
"""
from __future__ import annotations

import inspect

from torch import Tensor, nn

from common.errors import ConfigError
from common.optional import require
from common.patch import replace_attention
from common.schema import Attention

from .config import ARCHS


def hf_config(arch: str, vocab_size: int, *, context: int, dim: int, depth: int, heads: int, mlp_ratio: float,
              dropout: float, attn_dropout: float, tie_weights: bool):
    """The transformers config of ``arch`` at our GPT's size, in each library config's own names: one key/value head
    per query head, as ours (Qwen3's default would group them)."""
    transformers = require("transformers", extra="hf")
    hidden = int(dim * mlp_ratio)
    own = {"llama": {"intermediate_size": hidden, "attention_dropout": attn_dropout, "num_key_value_heads": heads},
           "qwen3": {"intermediate_size": hidden, "attention_dropout": attn_dropout, "num_key_value_heads": heads,
                     "head_dim": dim // heads},
           "gpt_neox": {"intermediate_size": hidden, "attention_dropout": attn_dropout, "hidden_dropout": dropout},
           "gpt2": {"n_inner": hidden, "attn_pdrop": attn_dropout, "resid_pdrop": dropout, "embd_pdrop": dropout}}
    if arch not in own:
        raise ConfigError(f"unknown model.arch {arch!r}; choose from gpt, {', '.join(ARCHS)}")
    if dropout and arch in ("llama", "qwen3"):
        raise ConfigError(f"model.arch={arch} has no residual dropout: set model.dropout=0 (model.attn_dropout applies)")
    return transformers.AutoConfig.for_model(arch, vocab_size=vocab_size, hidden_size=dim, num_hidden_layers=depth,
                                             num_attention_heads=heads, max_position_embeddings=context,
                                             tie_word_embeddings=tie_weights, bos_token_id=None, eos_token_id=None,
                                             **own[arch])  # bytes and characters have no special tokens


class TransformersLM(nn.Module):
    """tokens [B, T] -> next-token logits [B, T, vocab] from ``AutoModelForCausalLM.from_config``, its attention
    the run's variant. ``attention``: the run's attention section."""

    def __init__(self, vocab_size: int, *, arch: str, context: int, attention: Attention, init: str = "gpt2", **size):
        super().__init__()
        if init != "gpt2":
            raise ConfigError(f"model.init={init} is for model.arch=gpt; a transformers architecture starts as its "
                              "library initialises it (N(0, 0.02²) weights, as gpt2)")
        config = hf_config(arch, vocab_size, context=context, **size)
        self.context = context
        self.model = require("transformers", extra="hf").AutoModelForCausalLM.from_config(config)
        replace_attention(self.model, **dict(attention), seq_len=context)
        # transformers renamed past_key_values to cache after 5.18
        self.cache_name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def new_cache(self):
        return require("transformers", extra="hf").DynamicCache(config=self.model.config)

    def forward(self, tokens: Tensor, cache=None) -> Tensor:
        """With ``cache`` (``self.new_cache()``, a transformers ``DynamicCache``), ``tokens`` follow those already
        cached (``domains.language.model.generate``)."""
        return self.model(input_ids=tokens, use_cache=cache is not None, **{self.cache_name: cache}).logits
