"""Training speed of our Conformer encoder (``variant=standard``) against ``torchaudio.models.Conformer`` at
equal size, side by side in one process: ``quest speech-bench [--dim 144 --depth 16 ...]``.

Both get the same batch of features with ragged lengths (so both mask padding) and take AdamW steps on
the same loss. Rounds alternate between the two models and each model's median round counts
(``common.timing``), so load from other processes on a shared machine penalises neither. Prints steps/s of each and ours / torchaudio.
Ours carries a learnable relative-position bias; on CPU a mask that needs a gradient sends SDPA to its
math kernel, while torchaudio's bias-free attention gets the fused one: that is the whole difference.
"""
from __future__ import annotations

import argparse

import torch

from common.attention import attention_layer
from common.optional import require
from common.timing import add_device_arguments, device_from, interleaved_seconds

from .model import ConformerEncoder

torchaudio = require("torchaudio", extra="speech")


def train_steps(model: torch.nn.Module, x: torch.Tensor, lengths: torch.Tensor, n: int):
    """A job for ``common.timing``: ``n`` training steps of ``model``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(n):
            out, _ = model(x, lengths)
            out.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="quest speech-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=144)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=576)
    parser.add_argument("--kernel-size", type=int, default=31)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--frames", type=int, default=100,
                        help="encoder frames (after subsampling) of the longest utterance")
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    add_device_arguments(parser)
    args = parser.parse_args(argv)
    device = device_from(args)

    torch.manual_seed(0)
    size = (args.dim, args.heads, args.ffn_dim, args.depth, args.kernel_size)
    models = {
        "ours (standard)": ConformerEncoder(args.dim, args.depth, args.heads, args.ffn_dim, args.kernel_size,
                                            attn_layer=attention_layer(variant="standard"), seq_len=args.frames),
        "torchaudio": torchaudio.models.Conformer(*size[:2], size[2], size[3], size[4]),
    }
    x = torch.randn(args.batch_size, args.frames, args.dim, device=device)
    lengths = torch.randint(args.frames // 2, args.frames + 1, (args.batch_size,), device=device)
    lengths[0] = args.frames
    jobs = {name: train_steps(model.to(device).train(), x, lengths, args.steps) for name, model in models.items()}
    rate = {name: args.steps / seconds for name, seconds in interleaved_seconds(jobs, args.rounds, device).items()}

    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"Conformer encoder training on {device}: dim {args.dim}, depth {args.depth}, heads {args.heads}, "
          f"ffn {args.ffn_dim}, kernel {args.kernel_size}, batch {args.batch_size} x {args.frames} frames")
    for name, steps_per_s in rate.items():
        print(f"  {name:16s} {steps_per_s:8.2f} steps/s   {params[name]:,} parameters")
    ratio = rate["ours (standard)"] / rate["torchaudio"]
    print(f"  ratio ours / torchaudio: {ratio:.3f}")
    return {**rate, "ratio": ratio}


if __name__ == "__main__":
    main()
