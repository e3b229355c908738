"""The tuned protocol of a sweep file (its ``select:`` section, ``runners.sweeps.spec.Select``): each variant's
settings chosen on validation runs at selection seeds, then every variant trained and tested at its own choice on
the confirmation seeds, beside the sweep's one-recipe runs.

    select:
      seeds: [100, 101]
      scale: {optim.lr: [0.333, 1, 3]}
      extend: 1
      confirm_seeds: [5, 6, 7]

A sweep ``grid:`` applies to the tuned runs too (each choice in every cell); selection runs at the recipe.

Selection runs go to ``<output_dir>/select/`` and are never attacked. The choice per domain and variant is
``runners.runs.selection``'s rule (mean ``best_val`` over the selection seeds, a diverged or failed run the
worst score, ties to the earlier value in grid order), or with ``rule: curve`` the vertex of ``runners.runs.margins``.
Either way each choice's margin (the best value against the runner-up, paired over the selection seeds, *decided*
or *within noise*, and whether it sits on an edge the extension could not leave) is printed and kept beside it. It
is written to ``<output_dir>/selection.json`` once every selection run is recorded and no edge is left to extend
(a value that diverged or failed past the best brackets it too), and stays fixed from then on: later launches, and the
aggregation that labels each run "same recipe" or "tuned", read that file (delete it to choose again). The
confirmation runs, the sweep's own and the tuned ones, go to ``<output_dir>/`` itself; a tuned run whose choice
is the recipe's is the same run as the recipe's and is made once.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from common.errors import ConfigError
from common.records import RunRecord, read_records
from common.schema import RunConfig
from common.typed import lookup
from runners.config import compose, run_directory
from runners.runs.margins import Grid, Margin, bucket, margin
from runners.runs.selection import SELECTION_FILE, Selection, candidates, leaves, read_selection
from runners.sweeps.spec import Sweep, cells, expand, run_args

Recorded = list[tuple[RunRecord, dict[str, object]]]  # selection runs' records, each with its settings (``leaves``)


class Tuning:
    """The selection and confirmation runs of a sweep with a ``select:`` section. ``base(domain, variant,
    seed, out)`` gives a run's ``quest train`` arguments as the sweep makes them (``runners.sweeps.spec``)."""

    def __init__(self, spec: Sweep, out: Path, base: Callable[..., list[str]]):
        select = spec.select
        self.out, self.base, self.use = out, base, select.use
        self.file = out / SELECTION_FILE
        self.label = select.label  # what sets this sweep's tables apart from another's (say, its init)
        self.domains = select.domains or spec.domains
        self.variants = select.variants or spec.variants
        self.confirmed = [v for v in self.variants if v in spec.variants]  # the tuned variants the sweep also runs
        self.combos = cells(spec.grid)  # the sweep's grid: selection runs at the recipe, tuned runs in every cell
        self.seeds = select.seeds
        self.recipe_seeds = spec.seeds if select.recipe else []
        self.confirm_seeds = select.confirm_seeds or spec.seeds  # also where recipe: false
        self.scale = {key: sorted(factors) for key, factors in select.scale.items()}
        self.extend = select.extend
        self.rule = select.rule
        self.grid_keys = set(spec.grid)
        self._configs: dict[str, RunConfig] = {}  # per domain, the recipe's config

    def recipe(self, domain: str, keys: list[str] | None = None) -> dict[str, float]:
        """The recipe's value of each scaled key (or of ``keys``) in ``domain`` (the sweep's preset and overrides);
        a key that is not a number there is a ``ConfigError``."""
        keys = list(self.scale) if keys is None else keys
        if domain not in self._configs:
            seed = (self.seeds or self.recipe_seeds or self.confirm_seeds)[0]
            self._configs[domain] = compose(self.base(domain, "standard", seed, self.out))
        values = {key: lookup(self._configs[domain], key) for key in keys}
        if wrong := [key for key, value in values.items() if isinstance(value, bool) or not isinstance(value, (int, float))]:
            raise ConfigError(f"{', '.join(wrong)} is not a number in the {domain} runs' config: only a number is scaled or chosen")
        return {key: float(value) for key, value in values.items()}

    def value(self, domain: str, key: str, factor: float) -> float:
        return float(f"{self.recipe(domain)[key] * factor:.3g}")

    def _args(self, domain: str, variant: str, seed: int, out: Path, settings: dict[str, float],
              combo: dict | None = None) -> list[str]:
        return [*self.base(domain, variant, seed, out, combo), *(f"{key}={value!r}" for key, value in settings.items())]

    def _grid(self, domain: str, variant: str, records: Recorded) -> tuple[dict[str, list[float]], bool]:
        """The multiples tried for one domain and variant, extended at each edge its choice came to sit on; and
        whether every one of their runs is recorded."""
        grid = {key: list(factors) for key, factors in self.scale.items()}
        for _ in range(self.extend):  # one key (Select)
            scores = self._scores(domain, variant, grid, records)
            if scores is None:
                return grid, False
            (key, factors), = grid.items()
            best = _best(scores)
            if len(factors) < 2 or 0 < best < len(factors) - 1:
                return grid, True
            grid[key] = ([factors[0] ** 2 / factors[1], *factors] if best == 0
                         else [*factors, factors[-1] ** 2 / factors[-2]])
        return grid, self._scores(domain, variant, grid, records) is not None

    def _scores(self, domain: str, variant: str, grid: dict[str, list[float]], records: Recorded) -> list[float] | None:
        """The score of each setting of the grid (``cells`` order) by ``runners.runs.selection``'s rule,
        signed so that higher is better; None while one of its runs has no record."""
        runs = self._runs(domain, variant, grid, records)
        if runs is None:
            return None
        return [row["mean"] if row["mode"] == "max" else -row["mean"] for (row,) in map(candidates, runs)]

    def _runs(self, domain: str, variant: str, grid: dict[str, list[float]], records: Recorded) -> list[list[RunRecord]] | None:
        """The records of each setting of the grid (``cells`` order), None while one of them has no record."""
        found = []
        for settings in cells(grid):
            values = {key: self.value(domain, key, factor) for key, factor in settings.items()}
            runs = [rec for rec, flat in records if rec.domain == domain and rec.variant == variant
                    and rec.seed in self.seeds and all(_close(flat.get(k), v) for k, v in values.items())]
            if len({rec.seed for rec in runs}) < len(self.seeds):
                return None
            found.append(runs)
        return found

    def margin(self, domain: str, variant: str, grid: dict[str, list[float]], records: Recorded) -> Margin | None:
        """The margin of the choice over a one-key grid (``runners.runs.margins``); None for a grid of several keys."""
        if len(grid) != 1:
            return None
        (key, factors), = grid.items()
        scored: Grid = {}
        for factor, runs in zip(factors, self._runs(domain, variant, grid, records)):
            row, = candidates(runs)
            sign = 1 if row["mode"] == "max" else -1
            scored[self.value(domain, key, factor)] = {seed: sign * score for seed, score in row["scores"].items()}
        return margin(scored)

    def selection_runs(self) -> list[list[str]]:
        """The selection runs of the current round: every grid as far as it is extended now."""
        records = self._records()
        return [self._args(domain, variant, seed, self.out / "select",
                           {k: self.value(domain, k, f) for k, f in settings.items()})
                for domain in self.domains for variant in self.variants
                for settings in cells(self._grid(domain, variant, records)[0]) for seed in self.seeds]

    def _records(self) -> Recorded:
        found, _ = read_records(self.out / "select") if (self.out / "select").is_dir() else ([], [])
        return [(rec, leaves(rec.config)) for _, rec in sorted(found, key=lambda item: str(item[0]))
                if rec.status != "stopped"]

    def choose(self) -> Selection | None:
        """The choice of each domain and variant once the selection is complete (written to ``selection.json``
        and returned), None while selection runs are left; an existing ``selection.json`` stands."""
        if self.file.exists():
            return self._covering(read_selection(self.file), self.file,
                                  "it belongs to another sweep: give this sweep an output_dir of its own")
        if self.use:
            return self._borrow()
        records = self._records()
        picked: dict[str, dict[str, dict[str, float]]] = {}
        margins: dict[str, dict[str, dict]] = {}
        for domain in self.domains:
            for variant in self.variants:
                grid, complete = self._grid(domain, variant, records)
                if not complete:
                    return None
                settings = cells(grid)[_best(self._scores(domain, variant, grid, records))]
                values = {k: self.value(domain, k, f) for k, f in settings.items()}
                found = self.margin(domain, variant, grid, records)
                if found is not None:  # one key: its margin, and the curve's choice under rule: curve
                    (key, value), = values.items()
                    values = {key: found.chosen if self.rule == "curve" else value}
                    margins.setdefault(domain, {})[variant] = found.as_json()
                    print(f"select: {domain} / {variant}: {key}={values[key]:g} ({self.rule} rule); {found.describe()}")
                picked.setdefault(domain, {})[variant] = values
        selection = Selection(keys=list(self.scale), seeds=self.seeds, recipe_seeds=self.recipe_seeds,
                              confirm_seeds=self.confirm_seeds, label=self.label, rule=self.rule, variants=self.variants,
                              recipe={d: self.recipe(d) for d in self.domains}, chosen=picked, margins=margins)
        selection.write(self.file)
        return selection

    def _covering(self, selection: Selection, source: Path, why: str) -> Selection:
        """``selection`` if it chose for every domain and variant of this sweep, else a ``ConfigError`` naming what
        it lacks and ``why``."""
        lacking = [f"{d}/{v}" for d in self.domains for v in self.variants if v not in selection.chosen.get(d, {})]
        if lacking:
            raise ConfigError(f"{source} has no choice for {', '.join(lacking)}: {why}")
        self._settable(selection, source)
        return selection

    def _settable(self, selection: Selection, source: Path) -> None:
        """A ``ConfigError`` unless each choice of ``selection`` sets exactly its ``keys``, each a number in this
        sweep's runs and none of the keys the sweep sets itself (what a run is and where it goes, its grid): a
        selection file is data, and may not move a run or change what it compares."""
        for domain in self.domains:
            for variant in self.variants:
                if (keys := set(selection.chosen[domain][variant])) != set(selection.keys):
                    raise ConfigError(f"{source}: the choice for {domain}/{variant} sets {', '.join(sorted(keys)) or 'nothing'}, "
                                      f"not the selection's keys ({', '.join(selection.keys)})")
        if own := sorted(set(selection.keys) & (RUN_KEYS | self.grid_keys)):
            raise ConfigError(f"{source}: a selection may not set {', '.join(own)}: the sweep sets it")
        for domain in self.domains:
            try:
                self.recipe(domain, selection.keys)
            except ConfigError as err:
                raise ConfigError(f"{source}: {err}") from None

    def _borrow(self) -> Selection:
        """``use``: the other sweep's choices for this sweep's domains and variants (an error until it has them);
        the recipe is this sweep's own, which may differ from the other's in what the choices do not set."""
        source = Path(self.use) / SELECTION_FILE
        if not source.exists():
            raise ConfigError(f"select: use: {source} does not exist; run that sweep's selection first")
        other = self._covering(read_selection(source), source, "select: use: names a sweep without them")
        self.scale = dict.fromkeys(other.keys, [1.0])
        selection = other.model_copy(update={
            "recipe_seeds": self.recipe_seeds, "confirm_seeds": self.confirm_seeds, "variants": self.variants,
            "source": str(source), "label": self.label, "recipe": {d: self.recipe(d) for d in self.domains},
            "chosen": {d: {v: other.chosen[d][v] for v in self.variants} for d in self.domains}})
        selection.write(self.file)
        return selection

    def tuned_runs(self, selection: Selection) -> list[list[str]]:
        """Each tuned variant the sweep runs at its choice on the confirmation seeds."""
        return [self._args(domain, variant, seed, self.out, selection.chosen[domain][variant], combo)
                for seed in self.confirm_seeds for domain in self.domains for combo in self.combos
                for variant in self.confirmed]


RUN_KEYS = {"domain", "attention", "seed", "output_dir", "preset"}  # what a run is and where it goes: the sweep's own


def _best(scores: list[float]) -> int:
    """The index of the best score; scores within the selection rule's tie (1e-4) go to the earlier one."""
    return max(range(len(scores)), key=lambda i: (bucket(scores[i]), -i))


def _close(a, b) -> bool:
    return a is not None and abs(float(a) - float(b)) <= 1e-9 * max(abs(float(b)), 1e-30)


def unique_runs(runs: list[list[str]]) -> list[list[str]]:
    """``runs`` without those that make a run directory an earlier one makes (the same config)."""
    seen, kept = set(), []
    for args in runs:
        try:
            where = run_directory(compose(args))
        except Exception:  # an invalid run stays, for the sweep to report
            where = tuple(args)
        if where not in seen:
            seen.add(where)
            kept.append(args)
    return kept


def tuning(spec: Sweep, output_dir: str | None = None, extra: list[str] = ()) -> Tuning | None:
    """The sweep's tuned protocol (``runners.sweeps.tuning``), None without a ``select:`` section."""
    if spec.select is None:
        return None
    return Tuning(spec, Path(output_dir or spec.output_dir), partial(run_args, spec, extra=extra))


def confirmation(spec: Sweep, selection: Selection, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """The runs after selection, seed by seed (a sweep stopped early has both protocols at its first seeds): at
    each seed the sweep's own runs (unless ``select: {recipe: false}``), then each tuned variant at its choice;
    each run made once."""
    own = expand(spec, output_dir, extra) if spec.select.recipe else []
    runs = own + tuning(spec, output_dir, extra).tuned_runs(selection)
    return unique_runs(sorted(runs, key=lambda args: int(next(a for a in args if a.startswith("seed="))[5:])))
