"""Compose and validate a run's config: the schema's defaults <- preset <- overrides.

The schema is the domain's ``RunConfig`` (``common.schema``): each layer is set key by key into plain data (an unknown
key refused as it is set), and pydantic checks the values once, on the result; OmegaConf only reads a typed value and resolves
the references a default makes (``common.schema.follows``). Anything outside the schema is a one-line
``ConfigError`` naming the key and what is allowed. Values from the command line and sweep files are data: a
``${...}`` in them is refused, since OmegaConf would resolve it, and ``oc.env`` reads the environment into the config
and the run's record.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_omega_conf_dumper
from pydantic import ValidationError

from common.errors import ConfigError
from common.files import MAX_DOCUMENT_BYTES, interpolation, read_yaml
from common.registry import CONFIG_DIR as CONFIG_DIR  # where sweep files and domain presets live
from common.registry import discover, domain_schema
from common.schema import RunConfig, defaults, problem
from common.typed import Model, first_problem

discover("domains")  # the project's own domains; plugins add theirs through the entry-point group

GROUPS = ("domain", "preset", "attention")
# Keys that change where, how fast or how loudly a run goes, not what it computes (``attention.l2norm_kernel``: the
# same map, another kernel; ``compile``: the same step, compiled; each equal to float rounding): left out of the hash.
UNHASHED = ("output_dir", "cache_dir", "threads", "attention.l2norm_kernel", "compile", "trainer.enable_progress_bar",
            "logging", "progress")
# Keys added after runs were recorded, left out of the hash at the value those runs had, so that they keep their
# run directories and a sweep still finds them done.
UNHASHED_AT = {"model.arch": "gpt", "optim.min_lr": None, "optim.independent_weight_decay": False, "optim.z_loss": 0.0,
               "test_checkpoint": "best"}
# Each domain's data and model keys in the order its archived runs were recorded in: a key moved into a shared section
# keeps its place in a run's config.yaml, and in the text its hash is taken over.
KEY_ORDER = read_yaml(CONFIG_DIR / "key_order.yaml", "key order", MAX_DOCUMENT_BYTES)


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


def _strip(annotation: Any) -> Any:
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation


def _options(annotation: Any) -> tuple:
    annotation = _strip(annotation)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return tuple(map(_strip, typing.get_args(annotation))) if union else (annotation,)


def type_name(annotation: Any) -> str:
    """``float``, ``int or null``, ``list of 2 float``: what a key takes, in words."""
    names = []
    for option in _options(annotation):
        origin, args = typing.get_origin(option), [_strip(arg) for arg in typing.get_args(option)]
        if option is type(None):
            names.append("null")
        elif origin is tuple:
            names.append(f"list of {len(args)} {type_name(args[0])}")
        elif origin is list:
            names.append(f"list of {type_name(args[0])}" if args else "list")
        elif origin is typing.Literal:
            names.append("one of " + ", ".join(map(str, args)))
        else:
            names.append(getattr(option, "__name__", str(option)))
    return " or ".join(names)


def takes_text(annotation: Any) -> bool:
    """Whether a key of ``annotation`` takes a string, so that a value typed for it stays as typed."""
    return any(option in (str, Path) or (typing.get_origin(option) is typing.Literal
                                 and all(isinstance(arg, str) for arg in typing.get_args(option)))
               for option in _options(annotation))


def _section_type(annotation: Any) -> type[Model] | None:
    annotation = _strip(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, Model) else None


def apply_override(cfg: dict, key: str, value: Any, source: str, schema: type[Model], sources: dict[str, str]) -> None:
    """Set ``key`` of the plain config ``cfg`` to ``value`` (``Text`` from the command line read by the key's type),
    and note in ``sources`` where it came from: the key must be one of the ``schema``'s fields. Its value is checked
    once, with the whole config (``_typed``), where a cross-key rule can see the other keys too."""
    node, parts = schema, key.split(".")
    for depth, part in enumerate(parts):
        if node is None or part not in node.model_fields:
            where = ".".join(parts[:depth]) or "top level"
            valid = ", ".join(sorted(node.model_fields)) if node is not None else "(not a section)"
            near = closest_key(key, schema)
            raise ConfigError(f"unknown config key {key!r} ({source}); valid keys at {where}: {valid}"
                              + (f"; did you mean {near}?" if near else ""))
        field = node.model_fields[part]
        node = _section_type(field.annotation)
    if node is not None:  # a section
        if isinstance(value, Text):
            value = read_text(key, value, False)
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} ({source}) is a section; set its keys, e.g. "
                              f"{key}.{next(iter(node.model_fields), 'x')}=...")
        for sub, sub_value in value.items():
            apply_override(cfg, f"{key}.{sub}", sub_value, source, schema, sources)
        return
    if isinstance(value, Text):
        value = read_text(key, value, takes_text(field.annotation))
    parent, leaf = holder(cfg, key, make=True)
    parent[leaf] = value
    sources[key] = source


def _field(schema: type[Model], dotted: str) -> tuple[str, Any]:
    """The schema's key that a validation error's location starts with (pydantic adds list indices and union
    branches after it), and its field."""
    node, parts, field = schema, [], None
    for part in dotted.split("."):
        if node is None or part not in node.model_fields:
            break
        field = node.model_fields[part]
        node = _section_type(field.annotation)
        parts.append(part)
    return ".".join(parts), field


def _said(err: ValidationError, cfg: dict, schema: type[Model], sources: dict[str, str]) -> str:
    """The one line naming the first key whose value is wrong, the value as it was set, and where it came from."""
    where, reason, _ = first_problem(err)
    key, field = _field(schema, where)
    parent, leaf = holder(cfg, key)
    value = parent.get(leaf)
    if field is not None and reason.startswith("expects") and key in sources:
        quoted = " (a string: drop its quotes)" if isinstance(value, str) and _number(value) else ""
        return (f"config key {key!r} ({sources[key]}) expects {type_name(field.annotation)} like "
                f"{_default(schema, key)!r}, got {value!r}{quoted}")
    return problem(key or where, reason, value)


def _default(schema: type[Model], key: str) -> Any:
    """The domain's default of ``key``: a shared section's key takes the default its domain gives the section."""
    head, *rest = key.split(".")
    value = schema.model_fields[head].default
    for part in rest:
        value = getattr(value, part, None)
    return value


# Other libraries' names for this project's keys (nanoGPT's, Lightning's, timm's): what a user coming from them types.
SYNONYMS = {"learning_rate": "lr", "wd": "weight_decay", "epochs": "max_epochs", "max_iters": "max_steps",
            "warmup_iters": "warmup_steps", "grad_clip": "gradient_clip_val", "n_embd": "dim", "n_layer": "depth",
            "n_head": "heads", "block_size": "context", "num_heads": "heads", "embed_dim": "dim"}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def closest_key(key: str, schema: type[Model]) -> str | None:
    """The schema's key nearest to an unknown ``key``: among the keys ending in the same name (or in this project's
    name for it, ``SYNONYMS``), else among all, the most alike (``difflib``); None when nothing is close."""
    keys = list(_keys(schema))
    leaf = key.rsplit(".", 1)[-1]
    same_name = [path for path in keys if path.rsplit(".", 1)[-1] in (leaf, SYNONYMS.get(leaf))]
    found = difflib.get_close_matches(key, same_name, n=1, cutoff=0) or difflib.get_close_matches(key, keys, n=1)
    return found[0] if found else None


def _keys(schema: type[Model], prefix: str = ""):
    for name, field in schema.model_fields.items():
        nested = _section_type(field.annotation)
        if nested and nested.model_fields:
            yield from _keys(nested, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def compose(args: list[str]) -> RunConfig:
    """The validated config of one run, its domain's ``RunConfig``, from command-line style ``key=value`` arguments:
    the schema's defaults, then the preset, then the overrides, each key checked to be the schema's as it is set
    (``apply_override``); the references a default or a preset makes (``common.schema.follows``) resolved by
    OmegaConf; pydantic checks every value once, on the whole, and that one object is what the run, its hash and its
    record use. A wrong value is named with the layer that set it."""
    groups, dotted = parse_overrides(args)
    if "domain" not in groups:
        raise ConfigError("no domain given; pass domain=<name> (see `quest list`)")
    name = groups["domain"]
    schema, presets = domain_schema(name)
    cfg = defaults(schema, name)

    preset = groups.get("preset", cfg["preset"])
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for domain {name!r}; choose from {', '.join(presets) or '(none)'}")
    cfg["preset"] = preset
    sources: dict[str, str] = {}
    for key, value in presets[preset].items():
        apply_override(cfg, str(key), value, f"preset {preset}", schema, sources)

    cfg["attention"]["variant"] = groups.get("attention", cfg["attention"]["variant"])
    for key, value in dotted:
        apply_override(cfg, key, value, "command line", schema, sources)
    return _typed(schema, cfg, sources)


def _typed(schema: type[RunConfig], cfg: dict, sources: dict[str, str]) -> RunConfig:
    if interpolation(cfg, "config"):  # defaults and presets are the project's (or a plugin's) code: resolved
        try:
            cfg = OmegaConf.to_container(OmegaConf.create(cfg), resolve=True)
        except Exception as err:
            raise ConfigError(f"config does not resolve: {str(err).splitlines()[0]}") from None
    try:
        return schema.model_validate(cfg)
    except ValidationError as err:
        raise ConfigError(_said(err, cfg, schema, sources)) from None


def with_overrides(cfg: RunConfig, dotted: list[tuple[str, Any]], source: str = "command line") -> RunConfig:
    """``cfg`` with dotted ``key=value`` overrides (``parse_overrides``'s) set as ``compose`` sets them, and read
    again: a finished run's config with what one evaluation of it changes."""
    merged, sources = as_dict(cfg), {}
    for key, value in dotted:
        apply_override(merged, key, value, source, type(cfg), sources)
    return _typed(type(cfg), merged, sources)


def as_dict(cfg: RunConfig) -> dict:
    """The config as plain data, as a config file gives it (lists for tuples), in field order but where
    ``KEY_ORDER`` keeps a domain's earlier order: what a run's ``config.yaml`` and record hold, and what its hash
    is taken over."""
    data = cfg.model_dump(mode="json")
    for section, keys in KEY_ORDER.get(cfg.domain, {}).items():
        fields = data[section]
        data[section] = {key: fields[key] for key in keys if key in fields} | {
            key: value for key, value in fields.items() if key not in keys}
    return data


def as_yaml(cfg: RunConfig) -> str:
    return _yaml(as_dict(cfg))


def _yaml(data: dict) -> str:
    # OmegaConf.to_yaml's text (every run's hash is taken over it) without building a DictConfig first, which took
    # 13 times as long as the dump itself: its own YAML dumper, which quotes a string that would read as another type
    return yaml.dump(data, Dumper=get_omega_conf_dumper(), default_flow_style=False, allow_unicode=True, sort_keys=False)


def holder(data: dict, key: str, make: bool = False) -> tuple[dict, str]:
    """The section of ``data`` holding the dotted ``key`` (with ``make``, made where it is missing; else an empty
    one), and the key's last part."""
    *parents, leaf = key.split(".")
    for part in parents:
        data = data.setdefault(part, {}) if make else data.get(part, {})
    return data, leaf


def config_hash(cfg: RunConfig | Mapping[str, Any]) -> str:
    """Ten hex digits of the config (typed, or as a record saved it) minus where-and-how-loud keys: equal for DDP
    ranks and reruns."""
    data = copy.deepcopy(dict(cfg)) if isinstance(cfg, Mapping) else as_dict(cfg)
    for key in UNHASHED:
        node, leaf = holder(data, key)
        node.pop(leaf, None)
    for key, value in UNHASHED_AT.items():
        node, leaf = holder(data, key)
        if node.get(leaf, ...) == value:
            node.pop(leaf)
    return hashlib.sha1(_yaml(data).encode()).hexdigest()[:10]


def run_directory(cfg: RunConfig) -> Path:
    return Path(cfg.output_dir) / cfg.domain / cfg.attention.variant / f"seed{cfg.seed}-{config_hash(cfg)}"
