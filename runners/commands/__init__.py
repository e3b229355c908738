"""The ``quest`` commands, one thin module each over the library in ``runners.runs``, ``runners.sweeps`` and
``runners.results``; ``runners.cli`` finds them here by name (``COMMANDS``)."""
from __future__ import annotations

import argparse

from common.arguments import CommandParser, positive_int

# command -> its module under runners.commands (each has ``main(argv) -> exit status``)
COMMANDS = {"train": "train", "list": "listing", "sweep": "sweep", "ensemble": "ensemble", "aggregate": "aggregate",
            "stability": "stability", "bench": "bench", "feed": "feed", "robustness": "robustness",
            "select": "select", "archive": "archive", "curve": "curve", "scaling": "scaling", "power": "power",
            "docs": "docs"}

# how `quest --help` lists them (the domains' own commands follow, under their domain)
GROUPS = (("run", ("train", "sweep", "ensemble", "list")),
          ("results", ("aggregate", "select", "power", "archive", "curve", "scaling", "stability")),
          ("evaluate and measure", ("robustness", "bench", "feed")),
          ("documentation", ("docs",)))


def add_sweep_arguments(parser: CommandParser, workers_help: str) -> None:
    parser.add_argument("sweep", help="a sweep YAML, or the name of one in configs/sweep/")
    parser.add_argument("--workers", type=positive_int, default=1, help=workers_help)
    parser.add_argument("--threads", type=positive_int, help="CPU threads per worker (default: the machine's cores / "
                        "workers); 1 when another sweep or job runs beside this one")
    parser.add_argument("--output-dir", help="override the sweep's output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--redo", choices=("diverged", "all"),
                        help="also rerun the diverged runs, or every run (failed runs are always rerun)")
    parser.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)  # set for the workers of a launch

