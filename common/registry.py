"""Domain plugins: ``@register_domain`` and discovery.

A domain is a build function ``RunConfig -> (LightningDataModule, Task)`` (the domain's own ``RunConfig`` subclass)
plus what ``register_domain`` is given. The config check takes the valid ``data.dataset`` values from its dataset
names, so naming them (``quest list``, the config check) loads no data code; the domain's datamodule maps each name
to its loader itself. Domains come from a package scanned by ``discover`` (the project's ``domains/``), from the
``quest.domains`` entry-point group (an entry point names a module that registers on import), or from code that
calls ``register_domain``.

A domain package is ``__init__.py`` (registers: cheap to import, heavy imports inside ``build``),
``config.py`` (its typed config: a ``common.schema.RunConfig`` subclass, pydantic only), ``data.py`` (datamodule
and loaders, ``LOADERS``) and ``model.py`` (network and task), with its presets in ``configs/domain/<name>.yaml``.
"""
from __future__ import annotations

import copy
import importlib
import logging
import pkgutil
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from omegaconf import OmegaConf

from common.errors import ConfigError
from common.files import MAX_DOCUMENT_BYTES, read_text
from common.schema import RunConfig, missing_keys, section

ENTRY_POINT_GROUP = "quest.domains"
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Domain:
    """A registered domain: what ``register_domain`` was given (its Args say what each field is)."""

    name: str
    build: Callable[[RunConfig], tuple[Any, Any]]
    metric: str
    mode: str  # "min" or "max"
    config: type[RunConfig]
    presets: Path | None  # None: configs/domain/<name>.yaml
    commands: Mapping[str, str]  # `quest <command>` -> the module whose main(argv) runs it

    def primary_of(self, task) -> tuple[str, str]:
        """The (metric, ``"min"`` | ``"max"``) a run of this domain is judged on: its ``task``'s ``primary``, where it
        names one (graph: values or classes), else the domain's."""
        return task.primary or (self.metric, self.mode)

    @property
    def datasets(self) -> tuple[str, ...]:
        """The names ``data.dataset`` may take: its config's ``Literal``."""
        return dataset_names(self.config)


def dataset_names(config: type[RunConfig]) -> tuple[str, ...]:
    """The names a config's ``data.dataset: Literal[...]`` allows; () where it has none."""
    data = config.model_fields.get("data")
    field = getattr(data.annotation, "model_fields", {}).get("dataset") if data else None
    if field is None or typing.get_origin(field.annotation) is not Literal:
        return ()
    return typing.get_args(field.annotation)


_DOMAINS: dict[str, Domain] = {}
_PACKAGES: list[str] = []


def register_domain(name: str, *, metric: str, mode: str, config: type[RunConfig], presets: str | Path | None = None,
                    commands: Mapping[str, str] | None = None):
    """Register the decorated function as the build function of the domain ``name``.

    Args:
        name: The domain's name (``domain=<name>``).
        metric: Its primary metric (logged as ``val/<metric>`` and ``test/<metric>``): what checkpoints, selection and tables go by.
        mode: ``"min"`` or ``"max"``: which way ``metric`` is better.
        config: Its ``RunConfig`` subclass: its own sections and its defaults of the shared ones; its ``data``
            section names the datasets it loads in ``dataset: Literal[...]``.
        presets: The YAML file of its presets. None: ``configs/domain/<name>.yaml``.
        commands: ``quest <command>`` -> the module whose ``main(argv)`` runs it.

    Returns:
        The decorator, which registers the build function and returns it unchanged.

    Raises:
        ValueError: ``mode`` is neither, or ``config`` is not a ``RunConfig`` subclass whose ``data.dataset`` is a
            ``Literal`` of names.
    """
    if mode not in ("min", "max"):
        raise ValueError(f"domain {name!r}: mode must be 'min' or 'max', not {mode!r}")
    if not (isinstance(config, type) and issubclass(config, RunConfig)):
        raise ValueError(f"domain {name!r}: config must be its common.schema.RunConfig subclass, not {config!r}")
    if not dataset_names(config):
        raise ValueError(f"domain {name!r}: its config's data section must name its datasets, "
                         "dataset: Literal['<name>', ...]")

    def decorate(build):
        _DOMAINS[name] = Domain(name, build, metric, mode, config,
                                Path(presets) if presets else None, dict(commands or {}))
        return build

    return decorate


def unregister_domain(name: str) -> None:
    """Forget the registered domain ``name`` (a plugin's test cleaning up); an unknown name is no error."""
    _DOMAINS.pop(name, None)


def discover(package: str) -> None:
    """Make the sub-packages of ``package`` (one per domain) known without importing them yet; ``package`` is an
    importable package's dotted name (the project's: ``"domains"``)."""
    if package not in _PACKAGES:
        _PACKAGES.append(package)


def package_domains() -> dict[str, str]:
    """The domain packages under every discovered package, found without importing them.

    Returns:
        Domain name -> its package's dotted name.
    """
    return {info.name: f"{package}.{info.name}" for package in _PACKAGES
            for info in pkgutil.iter_modules(importlib.import_module(package).__path__)
            if info.ispkg and not info.name.startswith("_")}


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def domain_names() -> list[str]:
    """Every domain known: registered, in a discovered package or behind an entry point.

    Returns:
        Their names, sorted.
    """
    return sorted(set(_DOMAINS) | set(package_domains()) | set(_entry_points()))


def get_domain(name: str) -> Domain:
    """The domain called ``name``, importing its module on first use.

    Returns:
        Its registration.

    Raises:
        KeyError: No domain is called ``name`` (the message lists those that are).
    """
    if name not in _DOMAINS:
        modules = package_domains()
        if name in modules:
            importlib.import_module(modules[name])
        elif name in (eps := _entry_points()):
            eps[name].load()
    if name not in _DOMAINS:
        raise KeyError(f"unknown domain {name!r}; choose from {', '.join(domain_names()) or '(none)'}")
    return _DOMAINS[name]


def domain_commands() -> dict[str, str]:
    """The commands every domain adds (importing each domain's registration; one that fails is skipped, logged).

    Returns:
        ``quest <command>`` -> the module whose ``main(argv)`` runs it.
    """
    found = {}
    for name in domain_names():
        try:
            found.update(get_domain(name).commands)
        except Exception as err:  # one broken plugin must not hide the others' commands
            log.warning("domain %r cannot load (%s: %s); its commands are not available", name, type(err).__name__, err)
    return found


def read_config(saved: Mapping[str, Any], where: str) -> RunConfig:
    """A run's config as saved (its ``config.yaml``, its record's ``config``) read back into its domain's
    ``RunConfig``. A config that lacks a key the domain has now is refused rather than filled with today's
    default, which would quietly make it another run.

    Args:
        saved: The config as plain data.
        where: What it was read from, for the one-line error.

    Raises:
        ConfigError: Not a config of a known domain, a key missing, or a value the domain's config does not take.
    """
    if not isinstance(saved, Mapping) or not isinstance(saved.get("domain"), str):
        raise ConfigError(f"{where} is not a run's config (no domain)")
    schema = domain_schema(saved["domain"])[0]
    if missing := missing_keys(schema, dict(saved)):
        raise ConfigError(f"{where} does not fit this version of the {saved['domain']!r} domain (it lacks "
                          f"{', '.join(missing)}); rerun the run with this version")
    try:
        return section(schema, dict(saved), "")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def domain_schema(name: str) -> tuple[type[RunConfig], dict]:
    """The typed config of the domain ``name`` and its presets.

    Returns:
        Its ``RunConfig`` subclass, and preset name -> the settings the preset changes.

    Raises:
        ConfigError: An unknown domain, or a presets file that is not YAML or holds more than presets.
    """
    try:
        domain = get_domain(name)
    except KeyError as err:
        raise ConfigError(err.args[0]) from None
    path = domain.presets or CONFIG_DIR / "domain" / f"{name}.yaml"
    presets = _read(path) if path.exists() else {}
    if others := set(presets) - {"presets"}:
        raise ConfigError(f"{path}: a domain's YAML file holds its presets only, not {', '.join(sorted(others))}")
    return domain.config, presets.get("presets", {})


def _read(path: Path) -> dict:
    """A presets file, as OmegaConf reads it (``1e-3`` a number), references left unresolved; read once per
    version of the file (compose reads it for every run of a sweep)."""
    stamp = path.stat()
    return copy.deepcopy(_parsed(path, stamp.st_mtime_ns, stamp.st_size))


@lru_cache(maxsize=64)
def _parsed(path: Path, *stamp) -> dict:
    # read within limits as every file is (common.files), parsed by OmegaConf's own YAML: a presets file is part of
    # the project or of a plugin (code, as trusted as it), and its anchors and aliases share sections between presets
    text = read_text(path, "presets file", MAX_DOCUMENT_BYTES)
    try:
        return OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    except Exception as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
