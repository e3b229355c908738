"""Starting a model from the weights of a finished run (pre-training, then fine-tuning elsewhere).

``run_config`` finds a run's resolved ``config.yaml`` and its Lightning checkpoint from the run directory or
a checkpoint file inside it (``quest robustness``, ``imagenet`` and ``generate`` restore runs from it too);
``load_run`` adds the network's weights, and refuses a run of another domain or another attention variant: every
variant learns weights for its own attention logits, so a comparison of variants must start each one from
its own pre-training. ``load_encoder`` copies the tensors under some module names (the encoder) into a
model and refuses anything but an exact match of names and shapes there. Both raise ``ConfigError`` with
a one-line message naming the config key that pointed at the run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from common.errors import ConfigError

log = logging.getLogger(__name__)  # its info line (which weights a run starts from) is shown by runners.console

CHECKPOINTS = ("best.ckpt", "last.ckpt")  # a run directory's checkpoints, in order of preference


@dataclass(frozen=True)
class FinishedRun:
    config: DictConfig  # the run's resolved config
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


def run_config(path: str | Path, *, key: str, domain: str | None = None) -> tuple[Path, Path, DictConfig]:
    """(run directory, checkpoint, resolved config) of the run at ``path`` (``locate``); with ``domain``, a
    run of another domain is a ``ConfigError``. ``key`` names what pointed at the run, for the messages."""
    run_dir, checkpoint = locate(Path(path).expanduser(), key)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{key}: {run_dir} is not a run directory (no config.yaml beside checkpoints/)")
    config = OmegaConf.load(config_path)
    if domain is not None and config.get("domain") != domain:
        raise ConfigError(f"{key}: {run_dir} is a {config.get('domain')!r} run, not a {domain!r} run")
    return run_dir, checkpoint, config


def load_run(path: str | Path, *, key: str, domain: str, variant: str) -> FinishedRun:
    """The finished ``domain`` run at ``path`` (run directory or checkpoint), trained with attention
    ``variant``; ``key`` is the config key that named it, for the error messages."""
    run_dir, checkpoint, config = run_config(path, key=key, domain=domain)
    trained = OmegaConf.select(config, "attention.variant")
    if trained != variant:
        raise ConfigError(f"{key}: {run_dir} trained attention variant {trained!r}, this run uses {variant!r}; "
                          f"start each variant from a run of its own")
    try:
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    except Exception as err:  # truncated file, not a Lightning checkpoint, pickled objects
        raise ConfigError(f"{key}: {checkpoint} is not a readable Lightning checkpoint "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    state = {name.removeprefix("net."): tensor for name, tensor in saved.items() if name.startswith("net.")}
    return FinishedRun(config, checkpoint, state)


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
