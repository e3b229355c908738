"""Starting a model from the weights of a finished run (pre-training, then fine-tuning elsewhere); each refusal is a
one-line ``ConfigError`` naming the config key that pointed at the run.

A checkpoint is data, never code: ``read_checkpoint`` is the one way the project reads one. A Lightning checkpoint
of this project holds nothing but tensors and plain containers: its loop and callback states are dicts, lists,
numbers and strings, and its tasks save no hyper-parameters (the run's ``config.yaml`` holds them), so no class
needs allowing.
"""
from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from common.data import refused_global
from common.errors import ConfigError, error_line
from common.files import FileError, MiB, interpolation, read_yaml
from common.registry import get_domain, read_config
from common.schema import RunConfig

log = logging.getLogger(__name__)  # its info line (which weights a run starts from) is shown by runners.console

CHECKPOINTS = ("best.ckpt", "last.ckpt")  # a run directory's checkpoints, in order of preference
MAX_CONFIG_BYTES = MiB  # a run's config.yaml takes a few KiB


@dataclass(frozen=True)
class FinishedRun:
    config: RunConfig  # the run's config, typed
    checkpoint: Path
    state: dict[str, Tensor]  # the network's tensors: the task's state_dict without its ``net.`` prefix


def locate(path: Path, key: str) -> tuple[Path, Path]:
    """(run directory, checkpoint) of a run directory (its best, else last checkpoint) or of a checkpoint
    file in a run's ``checkpoints/`` folder or directly in the run directory."""
    if path.is_file():
        return (path.parent.parent if path.parent.name == "checkpoints" else path.parent), path
    if not path.is_dir():
        raise ConfigError(f"{key}: {path} is neither a run directory nor a checkpoint file")
    found = [path / "checkpoints" / name for name in CHECKPOINTS if (path / "checkpoints" / name).is_file()]
    if not found:
        raise ConfigError(f"{key}: {path} has no checkpoints/{' or '.join(CHECKPOINTS)} (did the run finish?)")
    return path, found[0]


def run_config(path: str | Path, *, key: str, domain: str | None = None) -> tuple[Path, Path, RunConfig]:
    """(run directory, checkpoint, typed config: ``common.registry.read_config``) of the run at ``path`` (``locate``); with ``domain``, a
    run of another domain is a ``ConfigError``. ``key`` names what pointed at the run, for the messages.
    The config is data (``common.files``): a ``${...}`` in it is refused, never resolved, since a run
    directory may come from anyone and ``oc.env`` would read the environment into what the command writes."""
    run_dir, checkpoint = locate(Path(path).expanduser(), key)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{key}: {run_dir} is not a run directory (no config.yaml beside checkpoints/)")
    try:
        saved = read_yaml(config_path, "run config", MAX_CONFIG_BYTES)
    except FileError as err:  # truncated, not YAML, too large, not a file
        raise ConfigError(f"{key}: {config_path} is not a readable run config ({err.reason})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("domain"), str):
        raise ConfigError(f"{key}: {config_path} is not a run config (no domain: key)")
    if found := interpolation(saved, "config"):
        raise ConfigError(f"{key}: {config_path} is not a run config: {found[0]} holds an interpolation "
                          f"{found[1]!r}, which a run's resolved config never has (refused, not resolved)")
    if domain is not None and saved["domain"] != domain:
        raise ConfigError(f"{key}: {run_dir} is a {saved['domain']!r} run, not a {domain!r} run")
    return run_dir, checkpoint, read_config(saved, f"{key}: {config_path}")


def load_run(path: str | Path, *, key: str, domain: str, variant: str) -> FinishedRun:
    """The finished ``domain`` run at ``path`` (run directory or checkpoint), trained with attention
    ``variant``: every variant learns weights for its own attention logits, so a comparison of variants must start
    each one from its own pre-training. ``key`` is the config key that named it, for the error messages."""
    run_dir, checkpoint, config = run_config(path, key=key, domain=domain)
    trained = config.attention.variant
    if trained != variant:
        raise ConfigError(f"{key}: {run_dir} trained attention variant {trained!r}, this run uses {variant!r}; "
                          f"start each variant from a run of its own")
    saved = read_checkpoint(checkpoint, key=key)["state_dict"]
    state = {name.removeprefix("net."): tensor for name, tensor in saved.items() if name.startswith("net.")}
    return FinishedRun(config, checkpoint, state)


def read_checkpoint(path: Path, *, key: str) -> dict:
    """The contents of the Lightning checkpoint at ``path``, unpickling nothing but tensors and plain
    containers; a file that is truncated, not a checkpoint, or holds any other object (which a crafted file
    would have run as code) is a ``ConfigError`` naming it."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if unsafe := refused_global(err):
            raise ConfigError(f"{key}: {path} holds objects other than tensors and plain containers ({unsafe}); "
                              "refused, since loading them would run code") from None
        raise ConfigError(f"{key}: {path} is not a readable Lightning checkpoint (not a torch file)") from None
    except Exception as err:  # truncated, empty
        raise ConfigError(f"{key}: {path} is not a readable Lightning checkpoint ({error_line(err)})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("state_dict"), dict):
        raise ConfigError(f"{key}: {path} is not a Lightning checkpoint (no state_dict)")
    return saved


def restore(checkpoint: Path, cfg: RunConfig, device: str | None = None) -> tuple:
    """A finished run back in memory, for ``quest robustness``, ``quest curve`` and the domains' ``quest imagenet`` and
    ``quest generate``: its datamodule and its task with the ``checkpoint``'s weights, in eval mode, on ``device``
    (default: the GPU when the run asked for an accelerator and there is one)."""
    datamodule, task = get_domain(cfg.domain).build(cfg)  # an older run's config lacking a key: refused when read
    try:
        task.load_state_dict(read_checkpoint(checkpoint, key="run")["state_dict"])
    except RuntimeError as err:  # missing, unexpected or reshaped tensors: weights of another model
        raise ConfigError(f"run: {checkpoint} does not hold this run's model "
                          f"({str(err).strip().splitlines()[-1].strip()})") from None
    if device is None:
        device = "cuda" if torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda") else "cpu"
    return datamodule, task.to(device).eval()


def under(names, parts: tuple[str, ...]) -> list[str]:
    """The ``names`` that are one of the modules or parameters ``parts`` or inside one."""
    return [name for name in names if any(name == part or name.startswith(f"{part}.") for part in parts)]


def load_encoder(model: nn.Module, state: dict[str, Tensor], parts: tuple[str, ...], *, key: str,
                 source: Path) -> list[str]:
    """Copy the tensors of ``state`` under ``parts`` (module or parameter names of ``model``, e.g.
    ``("patch_embed", "encoder")``) into ``model``, which must hold exactly those names with the same
    shapes there: a partial or reshaped load would start the model from a mix of weights. ``state``
    beyond ``parts`` is left out. Logs what was loaded from ``source`` and returns the names loaded."""
    own = model.state_dict()
    wanted, given = under(own, parts), under(state, parts)
    missing, extra = sorted(set(wanted) - set(given)), sorted(set(given) - set(wanted))
    if missing or extra:
        problem = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which this model lacks"
        raise ConfigError(f"{key}: the checkpoint {problem} ({len(missing)} missing, {len(extra)} extra tensors "
                          f"under {', '.join(parts)})")
    for name in given:
        if state[name].shape != own[name].shape:
            raise ConfigError(f"{key}: {name} has shape {tuple(state[name].shape)} in the checkpoint, "
                              f"{tuple(own[name].shape)} in this model")
    model.load_state_dict({name: state[name] for name in given}, strict=False)
    counts = ", ".join(f"{part} {len(under(given, (part,)))}" for part in parts)
    log.info("%s: %s starts from %s: %d tensors loaded (%s); left out: %s", key, type(model).__name__, source,
             len(given), counts, ", ".join(sorted(set(state) - set(given))) or "nothing")
    return given
