"""`quest robustness <run dir or checkpoint> [key=value ...]`: robust accuracy of a finished classifier run.

Rebuilds the run from its resolved ``config.yaml`` with its best checkpoint (else its last, or the
checkpoint given; ``common.checkpoint.restore``), evaluates the test split with ``common.perturbations.evaluate_robustness`` under the
config's ``robustness`` section, and stores the result in the run's record as ``robustness``.
Overrides such as ``robustness.eps=[0.1]`` or ``robustness.max_samples=100`` apply to this evaluation
only (they are saved beside the result as ``robustness_config``).

Applies to classification domains whose config has a ``robustness`` section (vision; point clouds and
speech with ``input_range: null`` and no image corruptions); regression and dense-prediction domains
have no such section and are refused.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.attention import get_variant
from common.checkpoint import run_config
from runners.runs.robust_accuracy import evaluate_run


def main(argv: list[str]) -> int:
    parser = CommandParser("quest robustness", __doc__)
    parser.add_argument("args", nargs="+", metavar="RUN | KEY=VALUE",
                        help="run directories or checkpoint files, and config overrides for this evaluation")
    args = parser.parse_args(argv).args
    overrides = [a for a in args if "=" in a and not Path(a).exists()]
    runs = [a for a in args if a not in overrides]
    if not runs:
        parser.error("no run directory or checkpoint given")
    for path in runs:
        results = evaluate_run(path, overrides)
        print(f"{path}: " + " ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if get_variant(run_config(path, key="run")[2].attention.variant).elliptical:
            print("  note: elliptical variants compute their attention metric without gradient: white-box attacks "
                  "treat it as a constant, so these numbers may overstate robustness (gradient masking)")
    return 0
