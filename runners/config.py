"""Compose and validate a run's config: base <- domain <- preset <- attention variant <- overrides.

The keys of base.yaml and the domain file are the schema: a key outside it, or a value whose type
differs from the default's, is a one-line ``ConfigError`` naming the key and what is allowed.
``attention=<name>`` takes any variant of ``common.attention.VARIANTS``; a variant that carries
settings of its own may add ``configs/attention/<name>.yaml``, applied after the preset.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError
from common.registry import BuildConfig, discover, get_domain, package_domains

discover("domains")  # the project's own domains; plugins add theirs through the entry-point group

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("domain", "preset", "attention")
# Keys that change where or how loudly a run goes, not what it computes (``normalization``: the same map, another
# kernel, equal to float rounding): left out of the run's hash.
UNHASHED = ("output_dir", "cache_dir", "threads", "normalization", "trainer.enable_progress_bar", "logging")


def _load(path: Path, what: str) -> DictConfig:
    if not path.exists():
        raise ConfigError(f"{what} config {path} does not exist")
    try:
        return OmegaConf.load(path)
    except Exception as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None


def parse_overrides(args: list[str]) -> tuple[dict[str, str], list[tuple[str, Any]]]:
    """Split ``key=value`` arguments into group choices (domain, preset, attention) and dotted overrides."""
    groups, dotted = {}, []
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {arg!r} is not of the form key=value")
        value = OmegaConf.from_dotlist([f"v={raw}"]).v if raw else ""
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        if key in GROUPS and not isinstance(value, (dict, list)) and value is not None:
            groups[key] = str(value)
        else:
            dotted.append((key, value))
    return groups, dotted


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def apply_override(schema: DictConfig, key: str, value: Any, source: str) -> None:
    node, parts = schema, key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "top level"
        if not isinstance(node, DictConfig) or part not in node:
            valid = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else "(not a section)"
            raise ConfigError(f"unknown config key {key!r} ({source}); valid keys at {where}: {valid}")
        if depth < len(parts) - 1:
            node = node[part]
    default = OmegaConf.to_container(node, resolve=False)[parts[-1]] if isinstance(node, DictConfig) else None
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} ({source}) is a section; set its keys, e.g. {key}.{next(iter(default), 'x')}=...")
        for sub, sub_value in value.items():
            apply_override(schema, f"{key}.{sub}", sub_value, source)
        return
    if not _type_ok(default, value):
        raise ConfigError(f"config key {key!r} ({source}) expects {type(default).__name__} like {default!r}, got {value!r}")
    OmegaConf.update(schema, key, value, merge=False)


def _apply(schema: DictConfig, update: dict, source: str) -> None:
    for key, value in update.items():
        apply_override(schema, str(key), value, source)


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

    preset = groups.get("preset", cfg.preset)
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for domain {name!r}; choose from {', '.join(presets) or '(none)'}")
    cfg.preset = preset
    _apply(cfg, OmegaConf.to_container(presets[preset]), f"preset {preset}")

    cfg.attention.variant = variant = groups.get("attention", cfg.attention.variant)
    settings = CONFIG_DIR / "attention" / f"{variant}.yaml"
    if settings.exists():
        _apply(cfg, OmegaConf.to_container(_load(settings, "attention")), f"attention {variant}")

    for key, value in dotted:
        apply_override(cfg, key, value, "command line")
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


def _check_choices(cfg: DictConfig) -> None:
    """The names a config picks: attention variant and dataset (these need torch and the domain)."""
    from common.attention import ABLATIONS, VARIANTS

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


def build_config(cfg: DictConfig) -> BuildConfig:
    """The plain, resolved sections a domain's build function takes."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    return BuildConfig(data=plain.get("data", {}), model=plain.get("model", {}), task=plain["task"],
                       optim=plain["optim"], attention=plain["attention"], seed=plain["seed"],
                       cache_dir=Path(plain["cache_dir"]))
