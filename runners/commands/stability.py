"""`quest stability <runs dir> ... [-o STABILITY.md]`: learning-rate sensitivity and logit growth.

Reads the records of a learning-rate sweep (configs/sweep/stability.yaml) and writes, per domain, dataset
and preset: final loss against learning rate (one line per variant, a band over seeds), each variant's
learning-rate sensitivity with its spread over seeds, where runs diverged, the peak attention logit and query norm
at every rate (median over seeds), and the max attention logit over training at the two highest rates, layer by
layer (first seed).

Learning-rate sensitivity follows Wortsman et al. (2023, "Small-scale proxies for large-scale Transformer
training instabilities"): for one variant and seed, the mean over the learning-rate grid of
min(final loss, initial loss) minus the best of those values. The final loss is the last validation loss;
a run that diverged, or ended above its initial loss (the first training loss), counts as its initial loss.
0 means every learning rate ends as well as the best one.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.files import write_atomic
from runners.results.frame import GROUP
from runners.results.lr_sensitivity import load_lr_runs, section


def main(argv: list[str]) -> int:
    parser = CommandParser("quest stability", __doc__)
    parser.add_argument("runs", nargs="+", help="run directories of a learning-rate sweep")
    parser.add_argument("-o", "--output", default="STABILITY.md", help="markdown file to write")
    args = parser.parse_args(argv)
    out = Path(args.output)
    figures = out.parent / (out.stem + "_figures")
    figures.mkdir(parents=True, exist_ok=True)
    runs = load_lr_runs(*args.runs)
    about = __doc__.split("\n\n", 2)[2].strip()  # the docstring's last paragraph: what the endpoint is
    lines = ["# Stability: learning-rate sensitivity", "", f"From `quest stability {' '.join(args.runs)}`. {about}", ""]
    for _, group in runs.groupby(GROUP[:3], sort=True):  # no protocols: one learning-rate grid
        lines += section(group, figures, out.parent)
    write_atomic(out, "\n".join(lines) + "\n")
    print(f"stability: {len(runs)} runs -> {out}")
    return 0
