"""A sweep file: read and checked key by key, then expanded into the ``quest train`` arguments of its runs."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from common.attention import VARIANTS
from common.errors import ConfigError
from common.files import MiB, read_yaml
from common.registry import domain_names
from common.schema import MAX_SEED
from runners.config import CONFIG_DIR, refuse_interpolation
from runners.sweeps.tuning import Tuning, check_select, unique_runs

SWEEP_KEYS = {"domains", "variants", "ablations", "seeds", "preset", "output_dir", "overrides", "domain_overrides", "grid",
              "slurm", "robustness", "select", "snapshots"}


def load_sweep(path: str | Path) -> dict:
    """The sweep file at ``path`` (or named in ``configs/sweep/``), checked key by key: anything it cannot
    mean is a one-line ``ConfigError`` naming the file and the key. It is read as data (``common.files``), and its
    values stay data (no ``${...}``)."""
    path = Path(path)
    if not path.exists() and (CONFIG_DIR / "sweep" / f"{path}.yaml").exists():
        path = CONFIG_DIR / "sweep" / f"{path}.yaml"
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    spec = read_yaml(path, "sweep file", MiB)
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{path}: a sweep file is a mapping of sweep keys ({', '.join(sorted(SWEEP_KEYS))}); "
                          f"this one is {'empty' if not spec else f'a {type(spec).__name__}'}")
    for key, value in spec.items():
        refuse_interpolation(value, f"{path}: {key}")
    unknown = set(spec) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"valid: {', '.join(sorted(SWEEP_KEYS))}")
    for key, value in spec.items():
        problem = SWEEP_CHECKS[key](value)
        if problem:
            raise ConfigError(f"{path}: {key}: {problem}, got {value!r}")
    return spec


def _names(value) -> str | None:
    if value == "all":
        return None
    return _strings(value)


def _strings(value) -> str | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        return "must be a non-empty list of names" + (" or all" if value != "all" else "")
    return None


def _overrides(value) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        return "must be a list of key=value strings"
    return None


SWEEP_CHECKS: dict[str, Callable] = {  # each key's check: what is wrong with its value, or None
    "domains": _names,
    "variants": _names,
    "ablations": lambda v: None if v is None else _strings(v),
    "seeds": lambda v: None if isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool)
                                                                  and 0 <= s <= MAX_SEED for s in v)
    else f"must be a non-empty list of seeds from 0 to {MAX_SEED}",
    "preset": lambda v: None if isinstance(v, str) and v else "must be a preset name",
    "output_dir": lambda v: None if isinstance(v, str) and v else "must be a folder",
    "overrides": lambda v: None if v is None else _overrides(v),
    "domain_overrides": lambda v: None if v is None or (isinstance(v, dict) and not any(map(_overrides, v.values())))
    else "must map domain names to lists of key=value strings",
    "grid": lambda v: None if v is None or (isinstance(v, dict) and all(isinstance(x, list) and x for x in v.values()))
    else "must map config keys to non-empty lists of values",
    "slurm": lambda v: None if v is None or isinstance(v, dict) else "must be a mapping of slurm settings",
    "robustness": lambda v: None if isinstance(v, bool) else "must be true or false",
    "select": check_select,
    "snapshots": lambda v: None if isinstance(v, list) and v and all(
        isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in v)
    else "must be a list of fractions of training in (0, 1]",
}


def _domains(spec: dict) -> list[str]:
    domains = spec.get("domains", "all")
    return domain_names() if domains == "all" else list(domains)


def _variants(spec: dict) -> list[str]:
    variants = spec.get("variants", "all")
    return list(VARIANTS) if variants == "all" else list(variants)


def run_args(spec: dict, domain: str, variant: str, seed: int, out: str | Path, settings: dict | None = None,
             extra: list[str] = ()) -> list[str]:
    """One run's ``quest train`` arguments: the sweep's preset and overrides, then ``settings`` and ``extra``."""
    args = [f"domain={domain}", f"attention={variant}", f"seed={seed}", f"output_dir={out}"]
    if "preset" in spec:
        args.append(f"preset={spec['preset']}")
    args += list(spec.get("overrides") or [])
    args += list((spec.get("domain_overrides") or {}).get(domain, []))
    return args + [f"{k}={v}" for k, v in (settings or {}).items()] + list(extra)


def expand(spec: dict, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """Every run of the sweep's grid as ``quest train`` arguments, seed by seed: a sweep stopped early has
    covered every domain and variant at the first seeds rather than a few domains at all seeds. (A ``select:``
    section adds its own runs: ``tuning``.)"""
    variants = _variants(spec) + list(spec.get("ablations") or [])
    out = output_dir or spec.get("output_dir", "runs")
    return [run_args(spec, domain, variant, seed, out, combo, extra)
            for seed, domain, combo, variant in itertools.product(spec.get("seeds", [0]), _domains(spec), _combos(spec),
                                                                  variants)]


def _combos(spec: dict) -> list[dict]:
    grid = spec.get("grid") or {}
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]


def tuning(spec: dict, output_dir: str | None = None, extra: list[str] = ()) -> Tuning | None:
    """The sweep's tuned protocol (``runners.sweeps.tuning``), None without a ``select:`` section."""
    if "select" not in spec:
        return None
    out = Path(output_dir or spec.get("output_dir", "runs"))
    return Tuning(spec, out, lambda domain, variant, seed, where, combo=None: run_args(spec, domain, variant, seed,
                                                                                       where, combo, extra),
                  _domains(spec), _variants(spec), _combos(spec))


def confirmation(spec: dict, selection: dict, output_dir: str | None = None, extra: list[str] = ()) -> list[list[str]]:
    """The runs after selection, seed by seed (a sweep stopped early has both protocols at its first seeds): at
    each seed the sweep's own runs (unless ``select: {recipe: false}``), then each tuned variant at its choice;
    each run made once."""
    own = expand(spec, output_dir, extra) if spec["select"].get("recipe", True) else []
    runs = own + tuning(spec, output_dir, extra).tuned_runs(selection)
    return unique_runs(sorted(runs, key=lambda args: int(next(a for a in args if a.startswith("seed="))[5:])))
