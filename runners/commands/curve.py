"""`quest curve <run dir> ... [--robustness]`: a run's learning curve, from the snapshots it kept.

Each snapshot (the weights at a fraction of training, kept by a sweep with `snapshots: [0.125, 0.25, 0.5, 1]`)
is restored and tested on the test split; with ``--robustness``, a classifier is also attacked and corrupted as
``quest robustness`` does. The points land in the run's record (``curve``), which ``quest scaling`` reads.
"""
from __future__ import annotations

from common.arguments import CommandParser
from runners.runs.snapshot_tests import evaluate_curve


def main(argv: list[str]) -> int:
    parser = CommandParser("quest curve", __doc__)
    parser.add_argument("runs", nargs="+", help="finished run directories that kept snapshots")
    parser.add_argument("--robustness", action="store_true", help="attack and corrupt each snapshot of a classifier")
    args = parser.parse_args(argv)
    for path in args.runs:
        points = evaluate_curve(path, args.robustness)
        print(f"curve: {path}: " + " · ".join(f"step {p.step}" for p in points))
    return 0
