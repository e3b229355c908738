"""Speed of the language model, measured side by side in one process: ``quest language-bench``.

1. Training steps/s (forward, loss, backward, AdamW step) of our GPT with ``standard`` attention against an
   equivalent GPT built from ``torch.nn.TransformerEncoderLayer`` (pre-norm, GELU, a causal mask passed
   with ``is_causal=True``; same embeddings, width, depth, heads, context and tied head), and of our GPT
   with ``quest`` against ours with ``standard``. With ``--nanogpt``, also against nanoGPT's GPT-2 model as the
   ``nano-gpt`` package ships it (the ``nanogpt`` extra): the anchor users compare with, at the same size. With
   ``--hf llama`` (or qwen3, gpt_neox, gpt2: ``model.arch``), also that transformers architecture at the same size,
   with QUEST and with the library's own SDPA (the ``hf`` extra).
2. Generation tokens/s of our GPT with the KV cache against without it (re-encoding the prefix per token).

Each comparison runs in rounds that alternate the models, each round starting at the next one, so drift
and load from other processes on a shared machine fall on all of them; the median round counts.
"""
from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.attention import attention_layer
from common.optional import require
from common.schema import Attention
from common.timing import add_device_arguments, device_from, interleaved_seconds

from .config import ARCHS
from .hf import TransformersLM
from .model import GPT, generate


class TorchGPT(nn.Module):
    """The same GPT on ``torch.nn.TransformerEncoder``: the reference for our standard attention."""

    def __init__(self, vocab_size: int, *, context: int, dim: int, depth: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.token_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, int(dim * mlp_ratio), dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.token_embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        x = self.token_embed(tokens) + self.pos_embed(torch.arange(length, device=tokens.device))
        return self.head(self.encoder(x, mask=mask, is_causal=True))


class NanoGPT(nn.Module):
    """nanoGPT's GPT-2 (``nano_gpt.model.GPT``: learned positions, pre-norm blocks, tied head, SDPA with
    ``is_causal``) at our size, returning the logits alone as the other models do."""

    def __init__(self, vocab_size: int, *, context: int, dim: int, depth: int, heads: int, mlp_ratio: float):
        super().__init__()
        nano_gpt = require("nano_gpt.model", extra="nanogpt")
        config = require("nano_gpt.config", extra="nanogpt").GPTConfig(
            block_size=context, vocab_size=vocab_size, n_layer=depth, n_head=heads, n_embd=dim)
        if mlp_ratio != 4.0:
            raise ValueError(f"nanoGPT's MLP is 4x as wide as the model, not {mlp_ratio}x")
        self.net = nano_gpt.GPT(config, tokenizer=None)  # the tokenizer only serves its sampling helpers

    def forward(self, tokens: Tensor) -> Tensor:
        return self.net(tokens)[0]


def train_steps(model: nn.Module, tokens: Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run(n: int) -> None:
        for _ in range(n):
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def rates(jobs: dict, work: int, rounds: int, device: torch.device) -> dict[str, float]:
    """Median units/s of each job (``job(work)`` does ``work`` units), interleaved (``common.timing``)."""
    seconds = interleaved_seconds({name: partial(job, work) for name, job in jobs.items()}, rounds, device)
    return {name: work / s for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="quest language-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per round (default: context-1)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--vocab", type=int, default=256, help="vocabulary size (bytes: 256; Tiny Shakespeare's characters: 65)")
    parser.add_argument("--compile", action="store_true",
                        help="also time each model's training step through torch.compile (the first round compiles, "
                        "uncounted)")
    parser.add_argument("--nanogpt", action="store_true",
                        help="also time nanoGPT's GPT-2 model (the nano-gpt package: pip install -e '.[nanogpt]')")
    parser.add_argument("--hf", choices=ARCHS, action="append", default=[], metavar="ARCH",
                        help=f"also time this transformers architecture ({', '.join(ARCHS)}; repeatable) with quest and "
                        "with the library's sdpa (pip install -e '.[hf]')")
    add_device_arguments(parser)
    args = parser.parse_args(argv)
    device = device_from(args)

    size = {"context": args.context, "dim": args.dim, "depth": args.depth, "heads": args.heads, "mlp_ratio": 4.0}
    torch.manual_seed(0)
    ours = {v: GPT(args.vocab, **size, dropout=0.0, attn_dropout=0.0, tie_weights=True,
                   attn_layer=attention_layer(variant=v)).to(device) for v in ("standard", "quest")}
    models = {"torch": TorchGPT(args.vocab, **size).to(device), "standard": ours["standard"], "quest": ours["quest"]}
    if args.nanogpt:
        models["nanogpt"] = NanoGPT(args.vocab, **size).to(device)
    for arch in args.hf:
        for variant in ("quest", "sdpa"):
            net = TransformersLM(args.vocab, arch=arch, **size, dropout=0.0, attn_dropout=0.0, tie_weights=True,
                                 attention=Attention(variant="standard" if variant == "sdpa" else variant))
            if variant == "sdpa":
                net.model.set_attn_implementation("sdpa")  # the library's own attention, not ours
            models[f"{arch} {variant}"] = net.to(device)
    if args.compile:  # the same modules (same weights), called through torch.compile
        models |= {f"{name} compiled": torch.compile(model) for name, model in list(models.items())}
    tokens = torch.randint(args.vocab, (args.batch_size, args.context + 1), device=device)
    train = rates({name: train_steps(m.train(), tokens) for name, m in models.items()}, args.steps, args.rounds, device)

    new = args.new_tokens or args.context - 1
    prompt = tokens[:1, :1]
    net = ours["quest"].eval()
    gen = rates({f"{name} cache": lambda n, cache=cache: generate(net, prompt, n, temperature=0, use_cache=cache)
                 for name, cache in (("with", True), ("without", False))}, new, max(3, args.rounds // 2), device)

    print(f"GPT on {device} ({torch.get_num_threads()} threads): dim {args.dim}, depth {args.depth}, heads {args.heads}, "
          f"context {args.context}, batch {args.batch_size}, vocabulary {args.vocab}")
    for name, rate in train.items():
        params = sum(p.numel() for p in models[name].parameters())
        print(f"  train {name:19s} {rate:8.2f} steps/s  {1e3 / rate:8.1f} ms/step  {params:,} parameters")
    ratios = {"standard/torch": train["standard"] / train["torch"],
              "quest/standard": train["quest"] / train["standard"],
              "cache/no cache": gen["with cache"] / gen["without cache"]}
    references = ["torch", *(["nanogpt"] if args.nanogpt else [])]
    ratios |= {f"standard/{ref}": train["standard"] / train[ref] for ref in references[1:]}
    ratios |= {f"{arch} quest/{name}": train[f"{arch} quest"] / train[name] for arch in args.hf
               for name in ("quest", f"{arch} sdpa")}
    if args.compile:
        ratios |= {f"{name} compiled/eager": train[f"{name} compiled"] / train[name]
                   for name in (*references, "standard", "quest")}
        ratios |= {f"standard/{ref} compiled": train["standard compiled"] / train[f"{ref} compiled"] for ref in references}
    for name, rate in gen.items():
        print(f"  generate (quest) {name:13s} {rate:8.1f} tokens/s  ({new} tokens from a 1-token prompt)")
    print("  ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return {**{f"train {k}": v for k, v in train.items()}, **gen, **ratios}


if __name__ == "__main__":
    main()
