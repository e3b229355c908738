"""`quest select <runs dir> ... [--by variant] [-o SELECTION.md] [--json selection.json]`: the settings a grid's
runs chose on validation data.

The runs' candidates (each combination of the settings that vary over them, seed excepted) ranked by their
mean validation score, best first, per domain, dataset and preset, and per variant with ``--by variant``
(each variant at its own best settings); then each choice's margin over the runner-up, paired over seeds, with its
verdict (decided or within noise), whether it sits on the grid's edge and the curve rule's vertex
(``runners.runs.margins``); then each setting's main effect (the mean score at each of its
values, over the candidates). The rule is ``runners.runs.selection``'s: mean of the records'
``best_val`` over seeds, a run that diverged or failed counting as the worst score, ties to the smaller model.
Test metrics are not read.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from common.arguments import CommandParser, whole
from common.errors import Stopped
from common.files import write_atomic
from runners.runs import rule_simulation
from runners.runs.selection import chosen, effects_table, grids, group_margins, margins_table, overrides, select, selection_table


def _seed_counts(text: str) -> list[int]:
    return [whole(2, 1000)(n) for n in text.split(",")]


def main(argv: list[str]) -> int:
    parser = CommandParser("quest select", __doc__)
    parser.add_argument("runs", nargs="+", help="directories of runs (searched recursively for record.json)")
    parser.add_argument("--by", action="append", default=[], choices=["variant"],
                        help="choose separately for each value of this record field")
    parser.add_argument("-o", "--output", type=Path, help="also write the tables to this markdown file")
    parser.add_argument("--json", type=Path, help="write every candidate, ranked, as JSON")
    parser.add_argument("--simulate", type=_seed_counts, metavar="N,N,...",
                        help="also simulate what rules best and curve cost at these numbers of selection seeds, from "
                             "each grid's own curvature and noise (runners.runs.rule_simulation)")
    args = parser.parse_args(argv)
    ranked = select(*args.runs, by=tuple(args.by))
    simulated = rule_simulation.table(grids(ranked), args.simulate) if args.simulate else []
    table = "\n".join(selection_table(ranked) + margins_table(ranked) + simulated + effects_table(ranked)).strip() + "\n"
    print(table, end="")
    counts = {row["runs"] for row in ranked}
    if len(counts) > 1:  # a grid still running, or runs lost: a choice among unequal evidence
        print(f"select: candidates have {min(counts)} to {max(counts)} runs each; the grid is incomplete", file=sys.stderr)
    found = group_margins(ranked)
    for group, row in chosen(ranked).items():
        verdict = f" ({found[group].verdict}{', on an edge' if found[group].edge else ''})" if group in found else ""
        print(f"select: {' / '.join(map(str, group))}: {' '.join(overrides(row['settings'])) or '(one candidate)'}{verdict}")
    with Stopped.on_signals():  # a signal stops it in one line, the earlier files left whole
        if args.output:
            write_atomic(args.output, table)
        if args.json:
            write_atomic(args.json, json.dumps(ranked, indent=1, default=str) + "\n")
    return 0
