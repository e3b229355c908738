"""`quest bench`: forward+backward time of every variant over plain ``F.scaled_dot_product_attention``
(``sdpa``: the same q, k, v, no variant) at several shapes, measured side by side in one process
(round-robin, median of repeats). By default q, k, v are what ``MultiheadAttention`` hands to attention:
head-split views of one [B, N, 3·H·d] projection, with the gradient its output projection sends back, so
the backward includes the split's (the same for every variant); ``--layout contiguous`` times separate
contiguous [B, H, N, d] tensors and the gradient of ``out.sum()`` instead. Also the memory of one
forward+backward of quest vs standard vs a naive explicit softmax at a long sequence, each in a fresh child
process: on CPU the peak resident memory above the resident memory just before the call (the kernel's
high-water mark is reset first, so the imports' peak does not count), on a GPU
``torch.cuda.max_memory_allocated`` above what the inputs hold.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from common.attention import VARIANTS, QKFold, attend, elliptical_metric, formula_normalization, get_variant, l2_normalize
from common.timing import interleaved_seconds

SDPA = "sdpa"  # the baseline: F.scaled_dot_product_attention on the raw q, k, v
# Where a normalising variant's extra time goes: the key normalisation alone, forward+backward, as
# ``l2_normalize`` runs it on the device (CPU: the fused weight-norm kernels) and as the written-out formula.
NORMALISATIONS = {"normalise k": contextlib.nullcontext, "normalise k (formula)": formula_normalization}
SHAPES = "8,8,1024,64;32,4,197,48;64,4,64,16;1,4,4096,64"  # long-ish, ViT-Tiny, many short sequences, long
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("projection", "contiguous")  # q, k, v as MultiheadAttention gives them, or separate contiguous tensors


@dataclass
class Inputs:
    """The leaves of one variant's step, how q, k, v are taken from them, the output's gradient, the variant's
    fold (its learnable scales as in a model) and, for elliptical variants, previous values."""

    leaves: tuple[Tensor, ...]
    qkv: Callable[[], tuple[Tensor, Tensor, Tensor]]
    grad: Tensor | None  # None: out.sum()
    fold: QKFold | None
    prev: Tensor | None


def make_inputs(shape, variant: str, device: str, dtype=torch.float32, seed: int = 0,
                layout: str = "projection") -> Inputs:
    g = torch.Generator().manual_seed(seed)
    batch, heads, tokens, head_dim = shape

    def randn(*size):
        return torch.randn(*size, generator=g, dtype=dtype).to(device)

    if layout == "projection":  # as MultiheadAttention._project splits its one input projection
        leaves = (randn(batch, tokens, 3 * heads * head_dim).requires_grad_(),)
        qkv = lambda: tuple(x.unflatten(-1, (heads, head_dim)).transpose(1, 2) for x in leaves[0].chunk(3, -1))  # noqa: E731
        grad = randn(batch, tokens, heads, head_dim).transpose(1, 2)  # out.transpose(1, 2).flatten(2) -> out_proj
    else:
        leaves = tuple(randn(*shape).requires_grad_() for _ in range(3))
        qkv, grad = lambda: leaves, None
    if variant == SDPA:
        return Inputs(leaves, qkv, grad, None, None)
    spec = get_variant(variant)
    fold = spec.make_fold(heads, head_dim).to(device, dtype)
    return Inputs(leaves, qkv, grad, fold, randn(*shape) if spec.elliptical else None)


def step(variant: str, inputs: Inputs, naive: bool = False) -> None:
    """One forward+backward; elliptical variants include computing their weights."""
    q, k, v = inputs.qkv()
    fold, prev = inputs.fold, inputs.prev
    metric = elliptical_metric(v.detach(), prev) if prev is not None else None
    if variant == SDPA:
        out = F.scaled_dot_product_attention(q, k, v)
    elif naive:
        qf, kf, scale = fold(q, k, metric)
        out = ((qf @ kf.transpose(-2, -1)) * scale).softmax(-1) @ v
    else:
        out = attend(q, k, v, variant, fold=fold, metric=metric)
    for leaf in inputs.leaves:
        leaf.grad = None
    if inputs.grad is None:
        out.sum().backward()
    else:
        out.backward(inputs.grad)


def normalise_keys(k: Tensor, grad: Tensor, context) -> None:
    """Forward+backward of the key normalisation alone."""
    with context():
        out = l2_normalize(k)
    k.grad = None
    out.backward(grad)


def time_variants(shape, variants, device: str, repeats: int, warmup: int = 1,
                  dtype=torch.float32, layout: str = "projection") -> dict[str, float]:
    """Median seconds per forward+backward of each variant and of the key normalisation alone
    (``NORMALISATIONS``), interleaved (``common.timing``)."""
    inputs = {v: make_inputs(shape, v, device, dtype, layout=layout) for v in variants}
    jobs = {v: partial(step, v, inputs[v]) for v in variants}
    keys = make_inputs(shape, SDPA, device, dtype, layout=layout)
    k = keys.qkv()[1].detach().requires_grad_()  # a leaf in k's layout: no gradient for the projection to split
    grad = keys.grad if keys.grad is not None else torch.ones_like(k)
    jobs.update({name: partial(normalise_keys, k, grad, context) for name, context in NORMALISATIONS.items()})
    return interleaved_seconds(jobs, repeats, device, warmup)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def peak_memory_mb(shape, variant: str, naive: bool, device: str, dtype=torch.float32,
                   layout: str = "projection") -> float:
    """Peak memory of one forward+backward above what the process held just before it."""
    inputs = make_inputs(shape, variant, device, dtype, layout=layout)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(variant, inputs, naive=naive)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets the peak RSS (VmHWM) to the current RSS
        f.write("5")
    base = _status_mb("VmRSS")
    step(variant, inputs, naive=naive)
    return _status_mb("VmHWM") - base


def _memory_in_child(shape, variant: str, naive: bool, device: str, dtype: str, layout: str) -> float:
    cmd = [sys.executable, "-m", "runners.bench", "--_memory",
           json.dumps([list(shape), variant, naive, device, dtype, layout])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quest bench", description=__doc__)
    parser.add_argument("--shapes", default=SHAPES, help="batch,heads,tokens,head_dim shapes timed, ';'-separated")
    parser.add_argument("--long", default="1,4,16384,64", help="shape of the memory measurement")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="of q, k, v and the variants' scales (bfloat16: what an accelerator trains in)")
    parser.add_argument("--layout", choices=LAYOUTS, default="projection",
                        help="of q, k, v: views of one fused projection, as the models give them, or contiguous tensors")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive explicit-softmax memory column")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--_memory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._memory:
        shape, variant, naive, device, dtype, layout = json.loads(args._memory)
        print(peak_memory_mb(tuple(shape), variant, naive, device, DTYPES[dtype], layout))
        return 0

    shapes = [tuple(int(x) for x in shape.split(",")) for shape in args.shapes.split(";")]
    long = tuple(int(x) for x in args.long.split(","))
    names = [SDPA, *VARIANTS]
    dtype = DTYPES[args.dtype]
    result = {"device": args.device, "dtype": args.dtype, "layout": args.layout, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "repeats": args.repeats, "long_shape": long, "shapes": {}}
    for shape in shapes:
        times = time_variants(shape, names, args.device, args.repeats, dtype=dtype, layout=args.layout)
        result["shapes"][str(list(shape))] = {"sdpa_ms": 1e3 * times[SDPA],
                                             "ratio": {v: times[v] / times[SDPA] for v in VARIANTS},
                                             "normalisation": {n: times[n] / times[SDPA] for n in NORMALISATIONS}}
    measure = partial(_memory_in_child, long, device=args.device, dtype=args.dtype, layout=args.layout)
    memory = {"standard": measure("standard", False), "quest": measure("quest", False)}
    if not args.no_naive:
        memory["quest (naive explicit softmax)"] = measure("quest", True)
    result["memory_mb"] = memory

    print(f"forward+backward on {args.device} ({result['threads']} threads), {args.dtype}, q/k/v layout "
          f"{args.layout}, median of {args.repeats}, time over plain SDPA on the same q, k, v")
    columns = list(result["shapes"])
    print(f"{'variant':22s}" + "".join(f"{c:>18s}" for c in columns))
    print(f"{'sdpa (ms)':22s}" + "".join(f"{result['shapes'][c]['sdpa_ms']:18.2f}" for c in columns))
    for v in VARIANTS:
        print(f"{v:22s}" + "".join(f"{result['shapes'][c]['ratio'][v]:18.3f}" for c in columns))
    for n in NORMALISATIONS:
        print(f"{n:22s}" + "".join(f"{result['shapes'][c]['normalisation'][n]:18.3f}" for c in columns))
    print(f"\nmemory of one forward+backward above the memory held before it, {list(long)}:")
    for name, mb in memory.items():
        share = f"  ({mb / memory['standard']:.2f}× standard)" if memory["standard"] > 0 else ""
        print(f"  {name:32s} {mb:10.1f} MB{share}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
