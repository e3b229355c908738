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

``--hf llama`` (or gpt2; repeatable) times a transformers model's training step instead: forward, loss, backward
and AdamW, with ``attn_implementation="quest"`` beside the library's ``"sdpa"`` (and ``"standard"``, the same SDPA
call through this project's backend, as a control), interleaved in one process, on one thread by default
(``--threads``); ``--hf-size gpu`` is the GPU checks' shape, ``--dtype bfloat16`` trains under autocast.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from common.arguments import CommandParser, device, positive_int, shape, shapes
from common.attention import VARIANTS
from common.benchmark import DTYPES, LAYOUTS, NORMALISATIONS, SDPA, memory_in_child, time_variants
from common.errors import ConfigError
from common.schema import COMPILE_MODES
from runners.runs import hfbench

SHAPES = "8,8,1024,64;32,4,197,48;64,4,64,16;1,4,4096,64"  # long-ish, ViT-Tiny, many short sequences, long


def main(argv: list[str]) -> int:
    parser = CommandParser("quest bench", __doc__)
    parser.add_argument("--shapes", type=shapes, default=SHAPES, help="batch,heads,tokens,head_dim shapes timed, ';'-separated")
    parser.add_argument("--long", type=shape, default="1,4,16384,64", help="shape of the memory measurement")
    parser.add_argument("--repeats", type=positive_int, default=12)
    parser.add_argument("--device", type=device, default="auto", help="auto (a GPU where there is one), cpu, cuda or cuda:N")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="of q, k, v and the variants' scales (bfloat16: what an accelerator trains in)")
    parser.add_argument("--layout", choices=LAYOUTS, default="projection",
                        help="of q, k, v: views of one fused projection, as the models give them, or contiguous tensors")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive explicit-softmax memory column")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--model", nargs="+", action="append", metavar="KEY=VALUE",
                        help="time a domain's own training step instead (domain=<d> preset=<p> ...; repeatable): "
                        "every variant's bare step as a ratio to standard's, and quest train's loop beside the bare one")
    parser.add_argument("--steps", type=positive_int, default=10, help="--model: training steps per round")
    parser.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                        help="--model: every variant's step eager and through torch.compile (MODE: its mode, default "
                        "'default'): steps/s, compile time cold and warm, peak memory, and a whole run's speed-up")
    parser.add_argument("--fixed-cost", nargs="+", action="append", metavar="KEY=VALUE",
                        help="where one whole quest train run's time goes (a fresh process; repeatable): start and "
                        "imports, data and model, fit, checkpoint writes, test")
    parser.add_argument("--hf", choices=hfbench.ARCHS, action="append", metavar="ARCH",
                        help=f"time a transformers model's training step with quest beside the library's sdpa "
                        f"({', '.join(hfbench.ARCHS)}; repeatable); --steps, --repeats, --device, --dtype apply")
    parser.add_argument("--hf-size", choices=hfbench.SIZES, default="tiny",
                        help="--hf: tiny (4 layers, width 128, 16 x 128 tokens) or gpu (8 layers, width 1024, 8 x 2048)")
    parser.add_argument("--threads", type=positive_int, default=1, help="--hf: torch threads on CPU")
    args = parser.parse_args(argv)
    if args.compile and args.model and args.compile not in COMPILE_MODES:
        raise ConfigError(f"--compile {args.compile!r} is not a torch.compile mode; choose from {', '.join(COMPILE_MODES)}")
    if args.hf:
        results = hf_bench(args)
    else:
        results = model_bench(args) if args.model or args.fixed_cost else attention_bench(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def attention_bench(args) -> dict:
    """The attention kernels' times at ``--shapes`` and their memory at ``--long``, printed."""
    result = {"device": args.device, "dtype": args.dtype, "layout": args.layout, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "repeats": args.repeats, "long_shape": args.long, "shapes": {}}
    for dims in args.shapes:
        times = time_variants(dims, [SDPA, *VARIANTS], args.device, args.repeats, dtype=DTYPES[args.dtype], layout=args.layout)
        result["shapes"][str(list(dims))] = {"sdpa_ms": 1e3 * times[SDPA],
                                             "ratio": {v: times[v] / times[SDPA] for v in VARIANTS},
                                             "normalisation": {n: times[n] / times[SDPA] for n in NORMALISATIONS}}
    measure = partial(memory_in_child, args.long, device=args.device, dtype=args.dtype, layout=args.layout)
    memory = {"standard": measure("standard", False), "quest": measure("quest", False)}
    if not args.no_naive:
        memory["quest (naive explicit softmax)"] = measure("quest", True)
    result["memory_mb"] = memory

    print(f"forward+backward on {args.device} ({result['threads']} threads), {args.dtype}, q/k/v layout "
          f"{args.layout}, median of {args.repeats}, time over plain SDPA on the same q, k, v")
    columns = list(result["shapes"])
    print(f"{'variant':22s}" + "".join(f"{c:>18s}" for c in columns))
    print(f"{'sdpa (ms)':22s}" + "".join(f"{result['shapes'][c]['sdpa_ms']:18.2f}" for c in columns))
    for kind, names in (("ratio", VARIANTS), ("normalisation", NORMALISATIONS)):
        for name in names:
            print(f"{name:22s}" + "".join(f"{result['shapes'][c][kind][name]:18.3f}" for c in columns))
    print(f"\nmemory of one forward+backward above the memory held before it, {list(args.long)}:")
    for name, mb in memory.items():
        share = f"  ({mb / memory['standard']:.2f}× standard)" if memory["standard"] > 0 else ""
        print(f"  {name:32s} {mb:10.1f} MB{share}")
    return result


def model_bench(args) -> list[dict]:
    """``--model``: per model, every variant's bare training step over standard's, and the loop overhead;
    ``--fixed-cost``: where one whole run's time goes. Printed; returns the results."""
    from runners.runs.stepbench import fixed_cost, measure  # Lightning and the domains: only here

    if args.compile and args.model:
        return compiled_bench(args)
    if args.fixed_cost:
        results = [fixed_cost(run) for run in args.fixed_cost]
        parts = list(results[0]["parts_s"])
        heading = ("one quest train run from a fresh process: seconds per part, and the fixed share (all but the "
                   "fit's training and validation)")
        columns = ["wall s", *parts, "fixed"]
        rows = [[f"{r['wall_s']:.1f}", *(f"{r['parts_s'][p]:.2f}" for p in parts), f"{r['fixed_share']:.1%}"]
                for r in results]
    else:
        results = [measure(model, list(VARIANTS), args.steps, args.repeats) for model in args.model]
        heading = (f"training step on cpu (threads: the run's), median of {args.repeats} rounds of {args.steps} "
                   "steps: each variant's bare step over standard's; loop: quest train's Lightning loop over the "
                   "bare loop (standard)")
        columns = ["standard ms", *VARIANTS, "loop"]
        rows = [[f"{r['bare_ms']['standard']:.2f}", *(f"{r['ratio'][v]:.3f}" for v in VARIANTS),
                 f"{r['loop_overhead']:.3f}"] for r in results]
    print(heading)
    width = max(len(c) for c in columns) + 2
    print(f"{'run':36s}" + "".join(f"{c:>{width}s}" for c in columns))
    for result, row in zip(results, rows):
        print(f"{' '.join(result['config']):36s}" + "".join(f"{cell:>{width}s}" for cell in row))
    return results


def compiled_bench(args) -> list[dict]:
    """``--model ... --compile``: per model and variant, the bare step eager and compiled side by side."""
    from runners.runs.compilebench import measure_compiled

    results = [measure_compiled(model, list(VARIANTS), args.steps, args.repeats, args.compile) for model in args.model]
    columns = {"eager it/s": "eager_steps_per_s", "compiled it/s": "compiled_steps_per_s", "speed-up": "speedup",
               "compile s cold": "compile_cold_s", "warm": "compile_warm_s", "MB eager": "peak_mb_eager",
               "MB compiled": "peak_mb_compiled", "run speed-up": "run_speedup"}
    width = max(len(c) for c in columns) + 2
    for result in results:
        print(f"{' '.join(result['config'])}: training step on cpu ({result['threads']} threads), eager and "
              f"torch.compile(mode={result['mode']!r}), median of {result['rounds']} rounds of {result['steps']} steps; "
              f"run speed-up: {result['run_steps']} steps, warm compile paid once")
        print(f"{'variant':18s}" + "".join(f"{c:>{width}s}" for c in columns))
        for variant, row in result["variants"].items():
            print(f"{variant:18s}" + "".join(f"{row[key]:>{width}.{3 if 'speed' in key else 1}f}" for key in columns.values()))
    return results


def hf_bench(args) -> list[dict]:
    """``--hf``: per architecture, the training step with quest and with the library's sdpa, and their ratio."""
    torch.set_num_threads(args.threads)
    autocast = DTYPES[args.dtype] if args.dtype != "float32" else None
    results = [hfbench.measure(arch, args.hf_size, device=args.device, autocast=autocast, steps=args.steps, rounds=args.repeats)
               for arch in args.hf]
    print(f"transformers training step (forward, loss, backward, AdamW) on {args.device} ({torch.get_num_threads()} "
          f"threads), {args.dtype}, size {args.hf_size}, median of {args.repeats} interleaved rounds of {args.steps} steps")
    print(f"{'model':8s}{'params':>12s}{'sdpa ms':>12s}{'standard/sdpa':>15s}{'quest/sdpa':>12s}")
    for r in results:
        print(f"{r['arch']:8s}{r['params']:12,d}{r['ms']['sdpa']:12.2f}{r['ratio']['standard']:15.3f}{r['ratio']['quest']:12.3f}")
    return results
