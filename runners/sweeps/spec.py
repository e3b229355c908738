"""A sweep file: read as data, validated as a ``Sweep`` (every key typed, documented and checked with the others),
then expanded into the ``quest train`` arguments of its runs."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from common.attention import ABLATIONS, VARIANTS
from common.errors import ConfigError
from common.files import MiB, read_yaml
from common.registry import domain_names
from common.schema import MAX_SEED
from common.typed import Model, first_problem, said
from runners.config import CONFIG_DIR, refuse_interpolation


def _known(kind: str, names: Callable[[], Collection[str]]) -> AfterValidator:
    """Names each of which ``names()`` holds; ``all`` is every one."""
    def check(value: list[str] | str) -> list[str]:
        known = list(names())
        if value == "all":
            return known
        if unknown := [name for name in value if name not in known]:
            raise PydanticCustomError("unknown", f"has unknown {kind} {', '.join(unknown)}; choose from {', '.join(known)}")
        return value
    return AfterValidator(check)


Name = Annotated[str, Field(min_length=1)]
Names = Annotated[list[Name], Field(min_length=1)]
Seeds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_SEED)]], Field(min_length=1)]
SEEDS = f"must be a non-empty list of seeds from 0 to {MAX_SEED}"
Override = Annotated[str, Field(pattern=r"^[^=]+=")]


Count = Annotated[int, Field(gt=0)]


class Slurm(Model):
    """A sweep's ``slurm:`` section: the job array's resources, each passed to submitit under its alias if set."""

    partition: str | None = Field(None, serialization_alias="slurm_partition")
    """The SLURM partition."""
    time_min: Count | None = Field(None, serialization_alias="timeout_min")
    """Each task's time limit, in minutes."""
    gpus_per_task: Annotated[int, Field(ge=0)] | None = Field(None, serialization_alias="gpus_per_node")
    """GPUs for each array task."""
    cpus_per_task: Count | None = None
    """CPU cores for each process."""
    mem_gb: Count | None = None
    """Memory for each node, in GB."""
    array_parallelism: Count | None = Field(None, serialization_alias="slurm_array_parallelism")
    """How many of the array's tasks run at once."""
    nodes: Count | None = None
    """Nodes for each array task."""
    tasks_per_node: Count | None = None
    """Processes on each node."""
    additional: dict[str, Any] = {}
    """Any other sbatch option, passed on as submitit's ``slurm_<key>``."""


class Select(Model):
    """A sweep's ``select:`` section, its tuned protocol (``runners.sweeps.tuning``): each variant's settings chosen
    on selection runs, or another sweep's choices taken (``use``)."""

    variants: Annotated[list[Name], _known("variant", VARIANTS.keys)] = []
    """The variants tuned (default: the sweep's); one the sweep does not run is chosen for, never confirmed."""
    domains: Annotated[list[Name], _known("domain", domain_names)] = []
    """The domains tuned (default: the sweep's)."""
    seeds: Annotated[Seeds, said(SEEDS)] = []
    """The selection seeds: never the seeds of a comparison."""
    scale: Annotated[dict[Name, Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]], Field(min_length=1),
                     said("must map config keys to non-empty lists of positive multiples")] = {}
    """Per config key, the multiples of each domain's recipe value tried (rounded to 3 significant digits)."""
    extend: Annotated[int, Field(ge=0)] = 0
    """How often a choice at an edge of its grid adds the next multiple that way (one key only)."""
    confirm_seeds: Annotated[Seeds | None, said(SEEDS)] = None
    """The tuned runs' seeds (default: the sweep's)."""
    use: Name | None = None
    """Instead of selecting: another sweep's output folder, whose choices (selection.json) this one takes."""
    label: str | None = None
    """Added to the protocols' names (``tuned, PyTorch init``), so that this sweep's tables stay apart."""
    recipe: bool = True
    """Whether the sweep's own one-recipe runs are made beside the tuned ones."""
    rule: Annotated[Literal["best", "curve"], said("must be best or curve")] = "best"
    """best: the best grid value; curve: the vertex of a parabola in log(value) through it and its neighbours."""

    @model_validator(mode="after")
    def _one_way_to_choose(self) -> Select:
        if self.use is not None and (own := {"scale", "seeds", "extend"} & self.model_fields_set):
            raise PydanticCustomError("rule", f"use takes another sweep's choices: {', '.join(sorted(own))} belong to that sweep")
        if self.use is None and not (self.seeds and self.scale):
            raise PydanticCustomError("rule", "needs seeds and scale to select, or use: another sweep's choices")
        if len(self.scale) > 1 and self.extend:
            raise PydanticCustomError("rule", "extend must be 0 where more than one key is scaled")
        if len(self.scale) > 1 and self.rule != "best":
            raise PydanticCustomError("rule", "rule must be best where more than one key is scaled")
        return self


class Sweep(Model):
    """A sweep file: every run of its domains × variants (and ablations) × seeds × ``grid`` cells, each a ``quest
    train`` of its preset and overrides; with ``select:``, the tuned protocol's runs too."""

    domains: Annotated[Names | Literal["all"], said("must be a non-empty list of names or all"),
                       _known("domain", domain_names)] = Field(default_factory=domain_names)
    """The domains run (``all``, the default: every known one)."""
    variants: Annotated[Names | Literal["all"], said("must be a non-empty list of names or all"),
                        _known("variant", VARIANTS.keys)] = Field(default_factory=lambda: list(VARIANTS))
    """The attention variants compared (``all``, the default: every one, ablations left out)."""
    ablations: Annotated[Names, said("must be a non-empty list of names"), _known("ablation", ABLATIONS.keys)] = []
    """Ablations run beside the variants (``uniform``), never compared with them."""
    seeds: Annotated[Seeds, said(SEEDS)] = [0]
    """The seeds of every run."""
    preset: Annotated[Name | None, said("must be a preset name")] = None
    """The preset of every run (default: the config's)."""
    output_dir: Annotated[Name, said("must be a folder")] = "runs"
    """Where the runs go (``--output-dir`` overrides it)."""
    overrides: Annotated[list[Override], said("must be a list of key=value strings")] = []
    """Config overrides for every run."""
    domain_overrides: Annotated[dict[Name, list[Override]], said("must map domain names to lists of key=value strings")] = {}
    """Config overrides for the runs of one domain, after ``overrides``."""
    grid: Annotated[dict[Name, Annotated[list[str | int | float | bool], Field(min_length=1)]],
                    said("must map config keys to non-empty lists of values")] = {}
    """Config values swept in every combination, each cell a run of every domain, variant and seed."""
    slurm: Slurm = Slurm()
    """``--launcher slurm``'s settings (``runners.sweeps.slurm``)."""
    robustness: Annotated[bool, said("must be true or false")] = False
    """Whether the finished classifier runs are attacked (those whose domain has a robustness section)."""
    select: Select | None = None
    """The tuned protocol (``Select``); none without this section."""
    snapshots: Annotated[list[Annotated[float, Field(gt=0, le=1)]], Field(min_length=1),
                         said("must be a list of fractions of training in (0, 1]")] = []
    """Fractions of training at which each run keeps its weights and tests them."""

    @field_validator("domain_overrides")
    @classmethod
    def _domains_run(cls, overrides: dict[str, list[str]], info: ValidationInfo) -> dict[str, list[str]]:
        if stray := sorted(set(overrides) - set(info.data.get("domains", overrides))):  # a typo would apply nowhere
            raise PydanticCustomError("rule", f"names {', '.join(stray)}, which the sweep does not run")
        return overrides

    @field_validator("select")
    @classmethod
    def _apart(cls, select: Select | None, info: ValidationInfo) -> Select | None:
        if select is None:
            return select
        if both := sorted(set(select.scale) & set(info.data.get("grid", {}))):  # the choice would override every cell
            raise PydanticCustomError("rule", f"scales {', '.join(both)}, which the grid varies")
        if shared := sorted(set(select.seeds) & {*info.data.get("seeds", ()), *(select.confirm_seeds or ())}):
            raise PydanticCustomError("rule", f"selection seeds {shared} are also seeds of the comparison")
        return select


def load_sweep(path: str | Path) -> Sweep:
    """The sweep file at ``path`` (or named in ``configs/sweep/``) as a ``Sweep``: anything it cannot mean is a
    one-line ``ConfigError`` naming the file and the key. It is read as data (``common.files``), and its values stay
    data (no ``${...}``)."""
    path = Path(path)
    if not path.exists() and (CONFIG_DIR / "sweep" / f"{path}.yaml").exists():
        path = CONFIG_DIR / "sweep" / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    spec = read_yaml(path, "sweep file", MiB)
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{path}: a sweep file is a mapping of sweep keys ({', '.join(sorted(Sweep.model_fields))}); "
                          f"this one is {'empty' if not spec else f'a {type(spec).__name__}'}")
    for key, value in spec.items():
        refuse_interpolation(value, f"{path}: {key}")
    try:
        return Sweep.model_validate(spec)
    except ValidationError as err:
        raise ConfigError(f"{path}: {_problem(err)}") from None


def _problem(err: ValidationError) -> str:
    """The first problem in one line: the sweep key, the key within its section (``select``, ``slurm``), what is wrong
    and the value."""
    errors = err.errors(include_url=False)
    key, reason, value = first_problem(err)
    head, _, within = key.partition(".")
    if errors[0]["type"] == "extra_forbidden":  # every unknown key of the section at once
        section = errors[0]["loc"][:-1]
        unknown = [str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == section]
        return f"{head + ': ' if within else ''}unknown key(s) {', '.join(unknown)}"
    return f"{head}: {within + ' ' if within else ''}{reason}, got {value!r}"


def run_args(spec: Sweep, domain: str, variant: str, seed: int, out: str | Path, settings: dict | None = None,
             extra: list[str] = ()) -> list[str]:
    """One run's ``quest train`` arguments: the sweep's preset and overrides, then ``settings`` and ``extra``."""
    args = [f"domain={domain}", f"attention={variant}", f"seed={seed}", f"output_dir={out}"]
    if spec.preset is not None:
        args.append(f"preset={spec.preset}")
    args += spec.overrides + spec.domain_overrides.get(domain, [])
    return args + [f"{k}={v}" for k, v in (settings or {}).items()] + list(extra)


def expand(spec: Sweep, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """Every run of the sweep's grid as ``quest train`` arguments, seed by seed: a sweep stopped early has
    covered every domain and variant at the first seeds rather than a few domains at all seeds. (A ``select:``
    section adds its own runs: ``tuning``.)"""
    out = output_dir or spec.output_dir
    return [run_args(spec, domain, variant, seed, out, combo, extra)
            for seed, domain, combo, variant in itertools.product(spec.seeds, spec.domains, cells(spec.grid),
                                                                  spec.variants + spec.ablations)]


def cells(grid: dict[str, list]) -> list[dict]:
    """Every combination of the grid's values, the last key's varying fastest."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
