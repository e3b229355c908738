"""Compose and validate a run's config: the schema's defaults <- domain <- preset <- overrides.

The schema is ``common.schema``: a dataclass per section, whose fields give each key's type, default and
allowed values; a domain's own sections (``data``, ``model``, ...) take their keys and types from the
domain's file, and their common keys' ranges from the schema (its docstring says why). A key outside the
schema, a value of another type, one outside its range or not among its choices, is a one-line
``ConfigError`` naming the key and what is allowed; an unknown key names the closest known one.
``attention=<name>`` takes any variant of ``common.attention.VARIANTS`` (or an ablation).

Values from the command line and sweep files are data. A value is read as YAML (numbers, lists, null)
except where the schema or the reading says it is a string, which is then taken as typed (a path may hold
`` #``); and a ``${...}`` in it is refused, since OmegaConf would resolve it, and ``oc.env`` reads the
environment into the config and the run's record.
"""
from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.files import interpolation
from common.registry import discover, get_domain, package_domains
from common.schema import DOMAIN_SECTIONS, RunConfig, accepts, check_section, defaults, find_field, type_name

discover("domains")  # the project's own domains; plugins add theirs through the entry-point group

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("domain", "preset", "attention")
# Keys that change where, how fast or how loudly a run goes, not what it computes (``attention.l2norm_kernel``: the
# same map, another kernel; ``compile``: the same step, compiled; each equal to float rounding): left out of the hash.
UNHASHED = ("output_dir", "cache_dir", "threads", "attention.l2norm_kernel", "compile", "trainer.enable_progress_bar",
            "logging", "progress")
# Keys added after runs were recorded, left out of the hash at the value those runs had, so that they keep their
# run directories and a sweep still finds them done.
UNHASHED_AT = {"model.arch": "gpt"}


def _load(path: Path, what: str) -> DictConfig:
    if not path.exists():
        raise ConfigError(f"{what} config {path} does not exist")
    try:
        return OmegaConf.load(path)
    except Exception as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None


def refuse_interpolation(value: Any, where: str) -> None:
    """A ``ConfigError`` if a string in ``value`` (scalar, list or mapping, keys included) holds ``${``."""
    found = interpolation(value, where)
    if found:
        raise ConfigError(f"{found[0]}: {found[1]!r} holds an interpolation ${{...}}; values given on the command "
                          "line or in a sweep file are data and are not resolved")


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


def read_text(key: str, raw: str, text: bool) -> Any:
    """The value of ``raw`` for a key that takes a string (``text``) or not: YAML, but a string as typed
    (YAML would cut a path at `` #``); quotes make a string of anything."""
    if raw == "":
        return ""
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    except Exception as err:  # unbalanced brackets, a stray colon
        raise ConfigError(f"config key {key!r}: cannot read {raw!r} ({str(err).splitlines()[0]})") from None
    quoted = len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\""
    if value is not None and not quoted and (text or isinstance(value, str)):
        return str(raw)
    return value


def _like_default(default: Any, value: Any) -> bool:
    """Whether ``value`` may stand for ``default`` of a domain's key: of its type (an int for a float), or null."""
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def apply_override(cfg: DictConfig, key: str, value: Any, source: str, schema: DictConfig | None = None) -> None:
    """Set ``key`` of ``cfg`` to ``value`` (``Text`` from the command line is read first), checked against
    ``schema`` (default: ``cfg``): the key must be there, and the value of its type, the schema's
    (``common.schema``) or, for a domain's key, its default's there."""
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
    found = find_field(key)
    annotation = found[1] if found else None
    if isinstance(value, Text):
        value = read_text(key, value, accepts(annotation, "") if found else isinstance(default, str))
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} ({source}) is a section; set its keys, e.g. {key}.{next(iter(default), 'x')}=...")
        for sub, sub_value in value.items():
            apply_override(cfg, f"{key}.{sub}", sub_value, source, schema)
        return
    if found and not accepts(annotation, value):
        raise ConfigError(f"config key {key!r} ({source}) expects {type_name(annotation)} like {default!r}, got {value!r}")
    if not found and not _like_default(default, value):
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


def check_config(cfg: DictConfig) -> None:
    """Every key the schema declares, as the domain's file, its preset and the overrides left it: of its type,
    among its choices, within its range."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    check_section(RunConfig, plain, "")
    for section, keys in DOMAIN_SECTIONS.items():
        check_section(keys, plain.get(section, {}), section)


def compose(args: list[str]) -> DictConfig:
    """The resolved, validated config of one run from command-line style ``key=value`` arguments."""
    groups, dotted = parse_overrides(args)
    if "domain" not in groups:
        raise ConfigError("no domain given; pass domain=<name> (see `quest list`)")
    name = groups["domain"]
    domain_cfg = _domain_config(name)
    presets = domain_cfg.pop("presets", OmegaConf.create({}))
    cfg = OmegaConf.merge(OmegaConf.create(defaults(name)), domain_cfg)
    schema = cfg.copy()  # the types every later layer is checked against

    preset = groups.get("preset", cfg.preset)
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for domain {name!r}; choose from {', '.join(presets) or '(none)'}")
    cfg.preset = preset
    _apply(cfg, OmegaConf.to_container(presets[preset]), f"preset {preset}", schema)

    cfg.attention.variant = groups.get("attention", cfg.attention.variant)
    for key, value in dotted:
        apply_override(cfg, key, value, "command line", schema)
    try:
        OmegaConf.resolve(cfg)
    except Exception as err:
        raise ConfigError(f"config does not resolve: {str(err).splitlines()[0]}") from None
    check_config(cfg)
    _check_choices(cfg)
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


def _check_choices(cfg: DictConfig) -> None:
    """The names a config picks that the schema cannot list: attention variant and dataset (they need
    ``common.attention`` and the domain)."""
    from common.attention import ABLATIONS, VARIANTS

    if cfg.attention.variant not in {**VARIANTS, **ABLATIONS}:
        raise ConfigError(f"unknown attention variant {cfg.attention.variant!r}; choose from "
                          f"{', '.join([*VARIANTS, *ABLATIONS])}")
    domain = get_domain(cfg.domain)
    if "dataset" in cfg.get("data", {}) and cfg.data.dataset not in domain.datasets:
        raise ConfigError(f"unknown dataset {cfg.data.dataset!r} for domain {domain.name!r}; "
                          f"choose from {', '.join(domain.datasets)}")


def _parent(data: dict, key: str) -> tuple[dict, str]:
    """The section of ``data`` holding the dotted ``key`` (empty where it has none), and the key's last part."""
    *parents, leaf = key.split(".")
    for part in parents:
        data = data.get(part, {})
    return data, leaf


def config_hash(cfg: DictConfig) -> str:
    """Ten hex digits of the config minus where-and-how-loud keys: equal for DDP ranks and reruns."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in UNHASHED:
        node, leaf = _parent(data, key)
        node.pop(leaf, None)
    for key, value in UNHASHED_AT.items():
        node, leaf = _parent(data, key)
        if node.get(leaf) == value:
            node.pop(leaf)
    return hashlib.sha1(OmegaConf.to_yaml(OmegaConf.create(data)).encode()).hexdigest()[:10]


def run_directory(cfg: DictConfig) -> Path:
    return Path(cfg.output_dir) / cfg.domain / cfg.attention.variant / f"seed{cfg.seed}-{config_hash(cfg)}"
