"""The ``quest`` commands, one thin module each over the library in ``runners.runs``, ``runners.sweeps`` and
``runners.results``; ``runners.cli`` finds them here by name (``COMMANDS``)."""
from __future__ import annotations

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


# quest sweep and quest ensemble: a worker's threads, when the default share would oversubscribe the machine
THREADS_HELP = ("CPU threads per worker (default: the machine's cores / workers); 1 when another sweep or job runs "
                "beside this one")

