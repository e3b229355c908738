"""`quest imagenet <run dir or checkpoint> [--real real.json [--val DIR]] [--imagenet-c DIR] [--imagenet-a DIR]
[--max-per-class N]`: ImageNet-ReaL, ImageNet-C (mCE) and ImageNet-A results of a finished vision run.

The vision domain's command (its ``commands``). Rebuilds the run from its resolved ``config.yaml`` (as
``quest robustness`` does), loads ``checkpoints/best.ckpt`` (or the checkpoint given), evaluates each suite
given with ``domains.vision.imagenet``, merges the results into the run's record as ``imagenet`` (a later
call with another suite adds to it) and prints them. Applies to vision runs on an ImageFolder tree, whose
classes are ImageNet wnids; ``--val`` defaults to the run's ``<data.root>/val``.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser, positive_int
from common.checkpoint import restore, run_config
from common.errors import ConfigError
from common.records import read_record, write_record
from domains.vision.imagenet import (
    CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    SEVERITIES,
    Classifier,
    evaluate_imagenet_a,
    evaluate_imagenet_c,
    evaluate_real,
)


def evaluate_run(path: str | Path, *, real: str | None = None, val: str | None = None, imagenet_c: str | None = None,
                 imagenet_a: str | None = None, max_per_class: int | None = None) -> dict[str, float]:
    """Evaluate one run on the suites given and merge the results into its record; returns them."""
    run_dir, checkpoint, cfg = run_config(path, key="run", domain="vision")
    data = cfg.data
    if data.dataset != "imagefolder":
        raise ConfigError(f"{run_dir} is a vision run on {data.dataset}: ImageNet evaluation needs a run on an "
                          "ImageFolder tree")
    record = read_record(run_dir)
    datamodule, task = restore(checkpoint, cfg)
    classifier = Classifier(task, datamodule.classes, data)
    results: dict[str, float] = {}
    if real:
        results |= evaluate_real(classifier, real, val or Path(data.root) / "val", max_per_class)
    if imagenet_c:
        results |= evaluate_imagenet_c(classifier, imagenet_c, max_per_class)
    if imagenet_a:
        results |= evaluate_imagenet_a(classifier, imagenet_a, max_per_class)
    record.imagenet = {**(record.imagenet or {}), **results}
    write_record(run_dir, record)
    return results


def table(results: dict[str, float]) -> str:
    """The results as the paper's tables give them: accuracies and errors in percent, mCE with AlexNet = 100."""
    lines = []
    if "real_acc" in results:
        lines.append(f"ImageNet-ReaL  top-1 {100 * results['real_acc']:.2f}% on {results['real_images']:.0f} images "
                     f"(original labels: {100 * results['real_val_acc']:.2f}%)")
    if "c_mce" in results:
        lines.append(f"ImageNet-C     mCE {results['c_mce']:.2f} (AlexNet = 100), mean error "
                     f"{100 * results['c_error_mean']:.2f}% over {results['c_images']:.0f} images")
        lines.append(f"  {'corruption':18s} {'CE':>7s}" + "".join(f"{f'err s{s}':>9s}" for s in SEVERITIES))
        for c in (*CORRUPTIONS, *EXTRA_CORRUPTIONS):
            if f"c_error_{c}_s1" in results:
                ce = f"{results[f'c_ce_{c}']:7.2f}" if f"c_ce_{c}" in results else f"{'-':>7s}"
                lines.append(f"  {c:18s} {ce}" + "".join(f"{100 * results[f'c_error_{c}_s{s}']:8.2f}%"
                                                         for s in SEVERITIES))
    if "a_acc" in results:
        lines.append(f"ImageNet-A     top-1 {100 * results['a_acc']:.2f}% on {results['a_images']:.0f} images "
                     "(argmax over its classes)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = CommandParser("quest imagenet", __doc__)
    parser.add_argument("run", metavar="RUN", help="run directory or checkpoint file")
    parser.add_argument("--real", metavar="JSON", help="ReaL's real.json (google-research/reassessed-imagenet)")
    parser.add_argument("--val", metavar="DIR", help="ImageNet val/<wnid>/ILSVRC2012_val_*.JPEG (default: the "
                        "run's <data.root>/val)")
    parser.add_argument("--imagenet-c", metavar="DIR", help="ImageNet-C: DIR/<corruption>/<severity>/<wnid>/")
    parser.add_argument("--imagenet-a", metavar="DIR", help="ImageNet-A: DIR/<wnid>/")
    parser.add_argument("--max-per-class", type=positive_int, metavar="N", help="evaluate the first N images of each class")
    args = parser.parse_args(argv)
    if not (args.real or args.imagenet_c or args.imagenet_a):
        parser.error("give at least one of --real, --imagenet-c, --imagenet-a")
    if args.val and not args.real:
        parser.error("--val goes with --real")
    results = evaluate_run(args.run, real=args.real, val=args.val, imagenet_c=args.imagenet_c,
                           imagenet_a=args.imagenet_a, max_per_class=args.max_per_class)
    print(f"{args.run}:\n{table(results)}")
    return 0
