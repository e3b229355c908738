"""Compose and validate a run's config: base <- domain <- preset <- attention variant <- overrides.

The keys of base.yaml and the domain file are the schema: a key outside it, a value whose type differs
from the default's there (not from whatever a preset set it to), or one outside its range in
``configs/ranges.yaml``, is a one-line ``ConfigError`` naming the key and what is allowed.
``attention=<name>`` takes any variant of ``common.attention.VARIANTS``; a variant that carries
settings of its own may add ``configs/attention/<name>.yaml``, applied after the preset.

Values from the command line and sweep files are data. A value is read as YAML (numbers, lists, null)
except where the schema or the reading says it is a string, which is then taken as typed (a path may hold
`` #``); and a ``${...}`` in it is refused, since OmegaConf would resolve it, and ``oc.env`` reads the
environment into the config and the run's record.
"""
from __future__ import annotations

import difflib
import hashlib
import operator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.registry import discover, get_domain, package_domains

discover("domains")  # the project's own domains; plugins add theirs through the entry-point group

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("domain", "preset", "attention")
# Keys that change where, how fast or how loudly a run goes, not what it computes (``attention.l2norm_kernel``: the
# same map, another kernel; ``compile``: the same step, compiled; each equal to float rounding): left out of the hash.
UNHASHED = ("output_dir", "cache_dir", "threads", "attention.l2norm_kernel", "compile", "trainer.enable_progress_bar",
            "logging", "progress")


def _load(path: Path, what: str) -> DictConfig:
    if not path.exists():
        raise ConfigError(f"{what} config {path} does not exist")
    try:
        return OmegaConf.load(path)
    except Exception as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None


def refuse_interpolation(value: Any, where: str) -> None:
    """A ``ConfigError`` if a string in ``value`` (scalar, list or mapping, keys included) holds ``${``."""
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_interpolation(key, where)
            refuse_interpolation(item, f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            refuse_interpolation(item, where)
    elif isinstance(value, str) and "${" in value:
        raise ConfigError(f"{where}: {value!r} holds an interpolation ${{...}}; values given on the command line "
                          "or in a sweep file are data and are not resolved")


class Text(str):
    """A value as typed on the command line, read once the schema says which type its key takes."""


def parse_overrides(args: list[str]) -> tuple[dict[str, str], list[tuple[str, Text]]]:
    """Split ``key=value`` arguments into group choices (domain, preset, attention) and dotted overrides,
    whose values stay the ``Text`` typed (``apply_override`` reads them by the key's type)."""
    groups, dotted = {}, []
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {arg!r} is not of the form key=value")
        refuse_interpolation(raw, key)
        if key in GROUPS:
            groups[key] = raw
        else:
            dotted.append((key, Text(raw)))
    return groups, dotted


def read_text(key: str, raw: str, default: Any) -> Any:
    """The value of ``raw`` for a key whose schema default is ``default``: YAML, but a string as typed
    (YAML would cut a path at `` #``); quotes make a string of anything."""
    if raw == "":
        return ""
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    except Exception as err:  # unbalanced brackets, a stray colon
        raise ConfigError(f"config key {key!r}: cannot read {raw!r} ({str(err).splitlines()[0]})") from None
    quoted = len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\""
    if value is not None and not quoted and (isinstance(default, str) or isinstance(value, str)):
        return str(raw)
    return value


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def apply_override(cfg: DictConfig, key: str, value: Any, source: str, schema: DictConfig | None = None) -> None:
    """Set ``key`` of ``cfg`` to ``value`` (``Text`` from the command line is read first), checked against
    ``schema`` (default: ``cfg``): the key must be there, and the value of its default's type."""
    schema = cfg if schema is None else schema
    node, parts = schema, key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "top level"
        if not isinstance(node, DictConfig) or part not in node:
            valid = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else "(not a section)"
            near = closest_key(key, schema)
            raise ConfigError(f"unknown config key {key!r} ({source}); valid keys at {where}: {valid}"
                              + (f"; did you mean {near}?" if near else ""))
        if depth < len(parts) - 1:
            node = node[part]
    default = OmegaConf.to_container(node, resolve=False)[parts[-1]] if isinstance(node, DictConfig) else None
    if isinstance(default, str) and default.startswith("${"):  # a config file's reference to another key
        default = None  # typed as YAML reads it, as a null default
    if isinstance(value, Text):
        value = read_text(key, value, default)
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} ({source}) is a section; set its keys, e.g. {key}.{next(iter(default), 'x')}=...")
        for sub, sub_value in value.items():
            apply_override(cfg, f"{key}.{sub}", sub_value, source, schema)
        return
    if not _type_ok(default, value):
        raise ConfigError(f"config key {key!r} ({source}) expects {type(default).__name__} like {default!r}, got {value!r}")
    OmegaConf.update(cfg, key, value, merge=False)


def closest_key(key: str, schema: DictConfig) -> str | None:
    """The schema's key nearest to an unknown ``key``: among the keys ending in the same name, else among all,
    the most alike (``difflib``); None when nothing is close."""
    keys = [path for path, _ in _leaves(OmegaConf.to_container(schema, resolve=False))]
    same_name = [path for path in keys if path.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
    found = difflib.get_close_matches(key, same_name, n=1, cutoff=0) or difflib.get_close_matches(key, keys, n=1)
    return found[0] if found else None


def _leaves(tree: dict, prefix: str = ""):
    for name, value in tree.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def _apply(cfg: DictConfig, update: dict, source: str, schema: DictConfig) -> None:
    for key, value in update.items():
        apply_override(cfg, str(key), value, source, schema)


BOUNDS = {"min": (">=", operator.ge), "max": ("<=", operator.le), "above": (">", operator.gt)}  # of ranges.yaml


def check_ranges(cfg: DictConfig) -> None:
    """Each key of ``configs/ranges.yaml`` that ``cfg`` has, set to a number, within its range."""
    for key, bounds in OmegaConf.to_container(_load(CONFIG_DIR / "ranges.yaml", "ranges")).items():
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not all(BOUNDS[kind][1](value, bound) for kind, bound in bounds.items()):
            allowed = " and ".join(f"{BOUNDS[kind][0]} {bound}" for kind, bound in bounds.items())
            raise ConfigError(f"config key {key!r} must be {allowed}, got {value!r}")


def compose(args: list[str]) -> DictConfig:
    """The resolved, validated config of one run from command-line style ``key=value`` arguments."""
    groups, dotted = parse_overrides(args)
    cfg = _load(CONFIG_DIR / "base.yaml", "base")
    if "domain" not in groups:
        raise ConfigError("no domain given; pass domain=<name> (see `quest list`)")
    name = groups["domain"]
    domain_cfg = _domain_config(name)
    presets = domain_cfg.pop("presets", OmegaConf.create({}))
    cfg = OmegaConf.merge(cfg, domain_cfg)
    cfg.domain = name
    schema = cfg.copy()  # the types every later layer is checked against

    preset = groups.get("preset", cfg.preset)
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for domain {name!r}; choose from {', '.join(presets) or '(none)'}")
    cfg.preset = preset
    _apply(cfg, OmegaConf.to_container(presets[preset]), f"preset {preset}", schema)

    cfg.attention.variant = variant = groups.get("attention", cfg.attention.variant)
    settings = CONFIG_DIR / "attention" / f"{variant}.yaml"
    if settings.exists():
        _apply(cfg, OmegaConf.to_container(_load(settings, "attention")), f"attention {variant}", schema)

    for key, value in dotted:
        apply_override(cfg, key, value, "command line", schema)
    check_ranges(cfg)
    _check_choices(cfg)
    try:
        OmegaConf.resolve(cfg)
    except Exception as err:
        raise ConfigError(f"config does not resolve: {str(err).splitlines()[0]}") from None
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _domain_config(name: str) -> DictConfig:
    """A domain's default config. A project domain's YAML is read without importing the domain, so a
    mistyped key is answered before torch loads; other domains are imported for theirs."""
    path = CONFIG_DIR / "domain" / f"{name}.yaml"
    if name in package_domains() and path.exists():
        return _load(path, f"domain {name!r}")
    try:
        domain = get_domain(name)
    except KeyError as err:
        raise ConfigError(err.args[0]) from None
    if isinstance(domain.config, dict):
        return OmegaConf.create(domain.config)
    return _load(domain.config or path, f"domain {name!r}")


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def _check_choices(cfg: DictConfig) -> None:
    """The names a config picks: compile mode, attention variant and dataset (the last two need torch and the
    domain)."""
    from common.attention import ABLATIONS, VARIANTS

    if cfg.compile.mode not in COMPILE_MODES:
        raise ConfigError(f"unknown compile.mode={cfg.compile.mode!r}; choose from {', '.join(COMPILE_MODES)}")

    if cfg.attention.variant not in {**VARIANTS, **ABLATIONS}:
        raise ConfigError(f"unknown attention variant {cfg.attention.variant!r}; choose from "
                          f"{', '.join([*VARIANTS, *ABLATIONS])}")
    domain = get_domain(cfg.domain)
    if "dataset" in cfg.get("data", {}) and cfg.data.dataset not in domain.datasets:
        raise ConfigError(f"unknown dataset {cfg.data.dataset!r} for domain {domain.name!r}; "
                          f"choose from {', '.join(domain.datasets)}")


def config_hash(cfg: DictConfig) -> str:
    """Ten hex digits of the config minus where-and-how-loud keys: equal for DDP ranks and reruns."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in UNHASHED:
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
    return hashlib.sha1(OmegaConf.to_yaml(OmegaConf.create(data)).encode()).hexdigest()[:10]


def run_directory(cfg: DictConfig) -> Path:
    return Path(cfg.output_dir) / cfg.domain / cfg.attention.variant / f"seed{cfg.seed}-{config_hash(cfg)}"
