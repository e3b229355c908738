"""`quest scaling <runs dir> ... [-o SCALING.md]`: learning curves across training length and width.

From runs that kept snapshots and tested them (a sweep with `snapshots:`, or `quest curve`): per domain and
width, each variant's test metric (and, for classifiers, its corruption and PGD accuracy) against training steps
with 95% intervals over seeds, the stability probes along training, a table of each variant's paired
difference to standard at every length, and one of how that difference changes from one width to the next
(paired by seed). `quest aggregate --report SCALING.md` puts it in RESULTS.md.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.files import write_atomic
from runners.results.learning_curves import report


def main(argv: list[str]) -> int:
    parser = CommandParser("quest scaling", __doc__)
    parser.add_argument("runs", nargs="+", help="directories of runs with tested curves")
    parser.add_argument("-o", "--output", type=Path, default=Path("SCALING.md"), help="markdown file to write")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.output, report(*args.runs, out=args.output) + "\n")
    print(f"scaling: -> {args.output}")
    return 0
