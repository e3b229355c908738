"""Training speed of our Conformer encoder (``variant=standard``) against ``torchaudio.models.Conformer`` at
equal size, side by side in one process: ``python -m domains.speech.bench [--dim 144 --depth 16 ...]``.

Both get the same batch of features with ragged lengths (so both mask padding) and take AdamW steps on
the same loss. Rounds alternate between the two models and each model's best round counts, so load from
other processes on a shared machine penalises neither. Prints steps/s of each and ours / torchaudio.
Ours carries a learnable relative-position bias; on CPU a mask that needs a gradient sends SDPA to its
math kernel, while torchaudio's bias-free attention gets the fused one: that is the whole difference.
"""
from __future__ import annotations

import argparse
import time

import torch
import torchaudio

from .model import ConformerEncoder


def train_step_timer(model: torch.nn.Module, x: torch.Tensor, lengths: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def steps(n: int) -> float:
        """Seconds for n training steps."""
        if x.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            out, _ = model(x, lengths)
            out.square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if x.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return steps


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m domains.speech.bench", description=__doc__,
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
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    size = (args.dim, args.heads, args.ffn_dim, args.depth, args.kernel_size)
    models = {
        "ours (standard)": ConformerEncoder(args.dim, args.depth, args.heads, args.ffn_dim, args.kernel_size,
                                            attention={"variant": "standard", "seq_len": args.frames}),
        "torchaudio": torchaudio.models.Conformer(*size[:2], size[2], size[3], size[4]),
    }
    x = torch.randn(args.batch_size, args.frames, args.dim, device=device)
    lengths = torch.randint(args.frames // 2, args.frames + 1, (args.batch_size,), device=device)
    lengths[0] = args.frames
    timers = {name: train_step_timer(model.to(device).train(), x, lengths) for name, model in models.items()}
    for steps in timers.values():
        steps(1)  # warm-up: allocator, kernels
    best = {name: 0.0 for name in timers}
    for _ in range(args.rounds):
        for name, steps in timers.items():
            best[name] = max(best[name], args.steps / steps(args.steps))

    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"Conformer encoder training on {device}: dim {args.dim}, depth {args.depth}, heads {args.heads}, "
          f"ffn {args.ffn_dim}, kernel {args.kernel_size}, batch {args.batch_size} x {args.frames} frames")
    for name, rate in best.items():
        print(f"  {name:16s} {rate:8.2f} steps/s   {params[name]:,} parameters")
    ratio = best["ours (standard)"] / best["torchaudio"]
    print(f"  ratio ours / torchaudio: {ratio:.3f}")
    return {**best, "ratio": ratio}


if __name__ == "__main__":
    main()
