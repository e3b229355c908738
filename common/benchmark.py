"""Timing and memory of the attention variants' kernels, forward+backward, for ``quest bench``: each variant
against plain ``F.scaled_dot_product_attention`` on the same q, k, v, measured side by side in one process
(``common.timing.interleaved_seconds``), and the peak memory of one call in a fresh child process."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from common.attention import QKFold, attend, elliptical_metric, get_variant, l2_normalize, make_fold
from common.timing import interleaved_seconds

SDPA = "sdpa"  # the baseline: F.scaled_dot_product_attention on the raw q, k, v
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("projection", "contiguous")  # q, k, v as MultiheadAttention gives them, or separate contiguous tensors

# Where a normalising variant's extra time goes: the key normalisation alone, forward+backward, as ``l2_normalize``
# runs it on the device (fused=True; CPU: the fused weight-norm kernels) and as the written-out formula (fused=False).
NORMALISATIONS = {"normalise k": True, "normalise k (formula)": False}


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
    fold = make_fold(spec, heads, head_dim).to(device, dtype)
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


def normalise_keys(k: Tensor, grad: Tensor, fused: bool) -> None:
    """Forward+backward of the key normalisation alone."""
    out = l2_normalize(k, fused=fused)
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
    jobs.update({name: partial(normalise_keys, k, grad, fused) for name, fused in NORMALISATIONS.items()})
    return interleaved_seconds(jobs, repeats, device, warmup)


def _proc_status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def peak_resident_mb(job: Callable[[], object]) -> float:
    """Peak resident memory of ``job()`` above what the process held just before it (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak (VmHWM) to the current resident memory
        f.write("5")
    base = _proc_status_mb("VmRSS")
    job()
    return _proc_status_mb("VmHWM") - base


def peak_memory_mb(shape, variant: str, naive: bool, device: str, dtype=torch.float32,
                   layout: str = "projection") -> float:
    """Peak memory of one forward+backward above what the process held just before it."""
    inputs = make_inputs(shape, variant, device, dtype, layout=layout)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(variant, inputs, naive=naive)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return peak_resident_mb(partial(step, variant, inputs, naive=naive))


def memory_in_child(shape, variant: str, naive: bool, device: str, dtype: str, layout: str) -> float:
    """``peak_memory_mb`` in a fresh interpreter, whose memory holds nothing of this one's; NaN if it fails."""
    cmd = [sys.executable, "-m", "common.benchmark", json.dumps([list(shape), variant, naive, device, dtype, layout])]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return float("nan") if out.returncode else float(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # memory_in_child's child
    shape, variant, naive, device, dtype, layout = json.loads(sys.argv[1])
    print(peak_memory_mb(tuple(shape), variant, naive, device, DTYPES[dtype], layout))
