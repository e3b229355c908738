"""The one progress line of a sweep and its closing summary, fed the outcome of each run."""
from __future__ import annotations

import math
import sys
from statistics import fmean

PROBLEMS = ("failed", "invalid")


class Progress:
    """The one progress line of a sweep, fed the outcomes of its runs from this process or its workers."""

    def __init__(self, runs: list[list[str]], workers: int = 1):
        self.runs, self.workers = runs, workers
        self.outcomes: dict[int, dict] = {}
        self.stopped: set[int] = set()  # runs stopped by a signal: not done, made again by the next launch
        self.shown: int | None = None

    def add(self, outcome: dict) -> None:
        """Note a run's outcome; the first word on a run stands (workers that find it held by another process
        or already recorded add nothing, nor does a run's start), but for a config that would not compose and
        that another worker then made: its file was being written when the first read it. A failed or invalid
        run is reported at once."""
        if outcome["status"] == "stopped":
            self.stopped.add(outcome["index"])
        known = self.outcomes.get(outcome["index"])
        made_after_all = known is not None and known["run_dir"] is None and outcome["wall_s"] is not None
        if outcome["status"] in ("busy", "running", "stopped") or (known is not None and not made_after_all):
            return
        self.outcomes[outcome["index"]] = outcome
        if outcome["status"] in PROBLEMS:
            print(f"sweep: {self.describe(outcome)}", file=sys.stderr, flush=True)

    def update(self, outcome: dict) -> None:
        self.add(outcome)
        self.show()

    def count(self, status: str) -> int:
        return sum(o["status"] == status for o in self.outcomes.values())

    def show(self) -> None:
        """Print the progress line if a run has been settled since the last one (outcomes only grow)."""
        done, total = len(self.outcomes), len(self.runs)
        if done == self.shown:
            return
        self.shown = done
        walls = [o["wall_s"] for o in self.outcomes.values() if o["wall_s"] is not None]
        eta = f"{math.ceil(fmean(walls) * (total - done) / self.workers / 60)} min" if walls else "–"
        counts = [f"{done}/{total} done", f"{self.count('diverged')} diverged", f"{self.count('failed')} failed"]
        counts += [f"{self.count('invalid')} invalid"] if self.count("invalid") else []
        print(f"sweep: {' · '.join(counts + [f'eta {eta}'])}", flush=True)

    def describe(self, outcome: dict) -> str:
        given = dict(arg.partition("=")[::2] for arg in self.runs[outcome["index"]])  # the last one wins, as in compose
        run = f"{given['domain']}/{given['attention']} seed {given['seed']}"
        where = f" -> {outcome['run_dir']}" if outcome["status"] == "failed" else ""
        return f"{outcome['status']} {run}: {outcome['error']}{where}"

    def problems(self) -> None:
        """List the failed and invalid runs, with why, on stderr."""
        problems = [o for _, o in sorted(self.outcomes.items()) if o["status"] in PROBLEMS]
        if problems:
            print(f"sweep: {len(problems)} run(s) failed or invalid:", file=sys.stderr)
            print("\n".join(f"  {self.describe(o)}" for o in problems), file=sys.stderr, flush=True)

    def summary(self) -> None:
        print(f"sweep: finished, {len(self.outcomes)}/{len(self.runs)} done: "
              + " · ".join(f"{self.count(s)} {s}" for s in ("ok", "diverged", *PROBLEMS)), flush=True)
        self.problems()

    def ran(self) -> dict[str, int]:
        """How many runs this launch ran ended in each way: not those recorded before it (no wall time), but its
        invalid runs (none either), and the runs it stopped."""
        ran = [o for o in self.outcomes.values() if o["wall_s"] is not None or o["status"] == "invalid"]
        return {**{status: sum(o["status"] == status for o in ran) for status in ("ok", "diverged", *PROBLEMS)},
                "stopped": len(self.stopped)}

    def code(self) -> int:
        return 2 if self.count("invalid") else 1 if self.count("failed") else 0
