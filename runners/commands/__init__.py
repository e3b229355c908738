"""The ``quest`` commands, one thin module each over the library in ``runners.runs``, ``runners.sweeps`` and
``runners.results``; ``runners.cli`` finds them here by name (``COMMANDS``)."""
from __future__ import annotations

import argparse

# command -> its module under runners.commands (each has ``main(argv) -> exit status``)
COMMANDS = {"train": "train", "list": "listing", "sweep": "sweep", "ensemble": "ensemble", "aggregate": "aggregate",
            "stability": "stability", "bench": "bench", "feed": "feed", "robustness": "robustness",
            "select": "select", "archive": "archive", "curve": "curve", "scaling": "scaling", "power": "power"}


# quest sweep and quest ensemble: a worker's threads, when the default share would oversubscribe the machine
THREADS_HELP = ("CPU threads per worker (default: the machine's cores / workers); 1 when another sweep or job runs "
                "beside this one")


def positive_int(text: str) -> int:
    """An argparse type: a count of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)
