"""The schema of a run's config: each section as a dataclass, whose fields are its keys, with their types,
defaults and allowed values (``bounded``: a numeric range, ``one_of``: a set of names, both as field metadata).
``RunConfig`` is the whole of it; ``runners.config`` composes a run's config on top of its defaults and checks
every key against it (``check_section``), and ``Optim`` checks itself the same way when built.

The per-domain sections (``data``, ``model``, ``task``, ``robustness``) differ from domain to domain. Their
schema stays the domain's config file: its keys and their defaults' types. A dataclass per domain would either
repeat each file's defaults or take them away from the presets beside them, and would ask a plugin domain,
which may ship only a YAML file or a dict (``common.registry.register_domain``), for Python it does not need.
What several domains share is here: ``DataKeys``, ``ModelKeys`` and ``RobustnessKeys`` give the ranges (and
types) of the common keys of ``data``, ``model`` and ``robustness`` wherever a domain has them. A domain file
may also add Lightning arguments to ``trainer`` (language's ``val_check_interval``), typed by its default there.

The fields, in their order and with their defaults, are the start of every composed config, over which a run's
hash is taken (``runners.config.config_hash``): a field added or moved changes every run's hash, and a new
default that of every run that does not set it, unless ``runners.config.UNHASHED`` leaves the key out.

This module needs only the standard library: a mistyped key is answered before torch loads.
"""
import dataclasses
import operator
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError

BOUNDS = {"min": (">=", operator.ge), "max": ("<=", operator.le), "above": (">", operator.gt),
          "below": ("<", operator.lt)}
MAX_SEED = 2**32 - 1  # numpy's seeds, which Lightning's seed_everything passes on, stop here


def bounded(default: Any = dataclasses.MISSING, **limits: float) -> Any:
    """A field whose number (or each number of its list) must lie within ``limits``: ``min`` / ``max``
    inclusive, ``above`` / ``below`` exclusive."""
    return field(default=default, metadata={"bounds": limits})


def one_of(default: str, *choices: str, what: str = "") -> Any:
    """A field that names one of ``choices``; ``what`` says what a name is, in the error."""
    return field(default=default, metadata={"choices": choices, "what": what})


@dataclass(frozen=True)
class Attention:
    """Keyword arguments of ``common.attention.MultiheadAttention`` (``common.attention.attention_layer``)."""

    variant: str = "quest"  # any name in common.attention.VARIANTS or ABLATIONS (`quest list`)
    qk_gain_init: float | None = None  # qknorm/qknorm_hs: null = log2(L^2 - L) from the model's typical length
    # How q and k are L2-normalised on CPU: fused kernels, or formula (the same map to float rounding; formula
    # reproduces runs recorded before the fused kernels, to the bit).
    l2norm_kernel: str = "fused"


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


@dataclass(frozen=True)
class Compile:
    """torch.compile of each training step's forward and backward (common.task.Task.compile_training);
    evaluation, attacks and probe steps stay eager. Left out of the run's hash: a compiled run equals an eager one
    to float rounding (tests/test_compile.py)."""

    enabled: bool = False
    mode: str = one_of("default", *COMPILE_MODES)


OPTIMIZER_NAMES = ("adamw", "adam", "sgd", "lamb")  # common.task.OPTIMIZERS: lamb is timm's, as DeiT-III
SCHEDULES = ("cosine", "poly", "constant")


@dataclass(frozen=True)
class Optim:
    """The optimiser and its schedule: ``schedule`` after ``warmup_steps`` of linear warm-up, ending at
    ``min_lr_ratio`` × ``lr`` and held there for ``cooldown_steps``; ``momentum`` and ``nesterov`` for SGD,
    ``betas`` for the others. Built once a run is (``common.registry.build_config``), checked as it is built."""

    name: str = one_of("adamw", *OPTIMIZER_NAMES, what="optimiser")
    lr: float = bounded(1.0e-3, above=0)
    weight_decay: float = bounded(0.05, min=0)
    betas: tuple[float, float] = bounded((0.9, 0.999), min=0, below=1)  # torch's Adam takes no other
    momentum: float = bounded(0.9, min=0, max=1)  # sgd only
    nesterov: bool = True  # sgd only: Nesterov's momentum (false: the classical heavy ball, as Segmenter)
    schedule: str = one_of("cosine", *SCHEDULES, what="schedule")
    warmup_steps: int = bounded(0, min=0)
    min_lr_ratio: float = bounded(0.0, min=0, max=1)  # where the schedule ends, as a fraction of lr
    cooldown_steps: int = bounded(0, min=0)  # the last steps held at lr x min_lr_ratio (DeiT's cool-down epochs)
    poly_power: float = bounded(0.9, min=0)  # poly: lr x (1 - progress) ** poly_power

    def __post_init__(self):
        check_section(Optim, vars(self), "optim")
        object.__setattr__(self, "betas", tuple(self.betas))  # YAML gives a list


@dataclass(frozen=True)
class Trainer:
    """Passed straight to pytorch_lightning.Trainer. ``data.batch_size`` is the global batch: each device loads
    batch_size / (devices x num_nodes x accumulate_grad_batches) per step."""

    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = bounded(1, min=1)
    accumulate_grad_batches: int = bounded(1, min=1)
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: int | None = bounded(10, min=-1)
    max_steps: int = bounded(-1, min=-1)  # -1: as many as max_epochs make
    gradient_clip_val: float | None = bounded(1.0, min=0)
    limit_train_batches: float | None = bounded(1.0, min=0)
    limit_val_batches: float | None = bounded(1.0, min=0)
    limit_test_batches: float | None = bounded(1.0, min=0)
    check_val_every_n_epoch: int | None = bounded(1, min=1)
    log_every_n_steps: int = bounded(10, min=1)
    enable_progress_bar: bool = True
    deterministic: bool = False


@dataclass(frozen=True)
class MLflow:
    """MLflow (pip install 'quest-study[tracking]'); runners/runs/trackers.py."""

    enabled: bool = False
    tracking_uri: str = "file:./mlruns"  # a local file store (relative to where quest runs); http(s)://<server> online
    experiment: str = "quest"


@dataclass(frozen=True)
class Wandb:
    """Weights & Biases (pip install 'quest-study[tracking]')."""

    enabled: bool = False
    project: str = "quest"
    mode: str = "offline"  # offline (upload later: wandb sync <dir>/wandb/offline-run-*) | online
    dir: str = "."  # runs are written under <dir>/wandb/


@dataclass(frozen=True)
class Logging:
    """Where a run's metrics go besides its record (not part of its identity)."""

    csv: bool = True
    tensorboard: bool = False  # TensorBoard events in the run directory
    mlflow: MLflow = field(default_factory=MLflow)
    wandb: Wandb = field(default_factory=Wandb)


PROGRESS_STYLES = ("auto", "bar", "lines", "none")


@dataclass(frozen=True)
class Progress:
    """What a run shows while it trains (not part of its identity)."""

    # auto: Lightning's bar on an interactive terminal, lines on a log file or pipe
    style: str = one_of("auto", *PROGRESS_STYLES)
    every_n_steps: int = bounded(100, min=0)  # lines: one per this many training steps (0: none between), one at the end


@dataclass(frozen=True)
class Divergence:
    """A run that blows up ends as ``status: diverged``: a result (exit code 0), not a failure."""

    loss_ratio: float | None = bounded(1.0e3, min=0)  # training loss above this x max(first training loss, 1); null disables
    max_loss: float | None = bounded(1.0e6, min=0)  # training loss above this; null disables (non-finite losses always diverge)


@dataclass(frozen=True)
class Probes:
    every_n_steps: int = bounded(25, min=0)  # 0 disables probing
    max_samples: int = bounded(4, min=1)  # samples of the batch the explicit logits are formed for
    max_logit_bound: float | None = bounded(1.0e4, min=0)  # a larger (or non-finite) max logit ends the run as diverged


@dataclass(frozen=True)
class RunConfig:
    """Every run's config: these sections, then the domain's (``data``, ``model``, ...; see the module's
    docstring). The fields' order is the config's, which the run hash depends on."""

    domain: str
    preset: str = "demo"
    seed: int = bounded(0, min=0, max=MAX_SEED)
    output_dir: str = "runs"  # runs land in <output_dir>/<domain>/<variant>/seed<seed>-<config hash>
    cache_dir: str = ".cache/quest"  # generated and featurised datasets, reused across runs
    threads: int | None = bounded(None, min=1)  # torch intra-op threads; null leaves torch's default
    attention: Attention = field(default_factory=Attention)
    compile: Compile = field(default_factory=Compile)
    task: dict = field(default_factory=dict)  # the domain's task settings (loss, label smoothing, perturbations)
    optim: Optim = field(default_factory=Optim)
    trainer: Trainer = field(default_factory=Trainer)
    logging: Logging = field(default_factory=Logging)
    progress: Progress = field(default_factory=Progress)
    divergence: Divergence = field(default_factory=Divergence)
    probes: Probes = field(default_factory=Probes)


@dataclass(frozen=True)
class DataKeys:
    """The ``data`` keys several domains share, wherever a domain has them."""

    batch_size: int = bounded(min=1)
    eval_batch_size: int = bounded(min=1)
    num_workers: int = bounded(min=0)
    context: int = bounded(min=1)
    answer_kappa: float = bounded(min=1)
    split_seed: int = bounded(min=0, max=MAX_SEED)


@dataclass(frozen=True)
class ModelKeys:
    """The ``model`` keys several domains share, wherever a domain has them."""

    dim: int = bounded(min=1)
    depth: int = bounded(min=1)
    heads: int = bounded(min=1)
    dropout: float = bounded(min=0, max=1)
    input_dropout: float = bounded(min=0, max=1)
    attn_dropout: float = bounded(min=0, max=1)


@dataclass(frozen=True)
class RobustnessKeys:
    """The ``robustness`` keys (``common.perturbations``) of the domains that have the section."""

    eps: list[float] = bounded(above=0)  # L-inf budgets, in input units
    severities: list[int] = bounded(min=1, max=5)  # the corruption benchmarks' five levels
    max_samples: int | None = bounded(min=1)
    seed: int = bounded(min=0, max=MAX_SEED)


DOMAIN_SECTIONS = {"data": DataKeys, "model": ModelKeys, "robustness": RobustnessKeys}


def defaults(domain: str) -> dict:
    """The config every run of ``domain`` starts from, before its domain's file: ``RunConfig``'s defaults, with
    lists where a field holds a tuple (``optim.betas``), as a config file gives them."""
    return dataclasses.asdict(RunConfig(domain=domain), dict_factory=lambda items: {
        name: list(value) if isinstance(value, tuple) else value for name, value in items})


def find_field(key: str) -> tuple[dataclasses.Field, Any] | None:
    """The schema's field of a dotted ``key`` and its type; None for a key of a domain's sections (see
    ``DOMAIN_SECTIONS`` for their shared keys) or a key the schema does not know."""
    section, *parts = key.split(".")
    cls = DOMAIN_SECTIONS.get(section)
    if cls is None:
        cls, parts = RunConfig, [section, *parts]
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return None
        found = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        if found is None:
            return None
        annotation = typing.get_type_hints(cls)[part]
        if depth == len(parts) - 1:
            return found, annotation
        cls = annotation
    return None


def type_name(annotation: Any) -> str:
    """``float``, ``int or null``, ``list of 2 float``: what a key takes, in words."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    names = []
    for option in options:
        if option is type(None):
            names.append("null")
        elif typing.get_origin(option) is tuple:
            names.append(f"list of {len(typing.get_args(option))} {typing.get_args(option)[0].__name__}")
        elif typing.get_origin(option) is list:
            names.append(f"list of {typing.get_args(option)[0].__name__}")
        else:
            names.append(option.__name__)
    return " or ".join(names)


def accepts(annotation: Any, value: Any) -> bool:
    """Whether ``value`` (as YAML reads it) is of the type ``annotation``; an int passes for a float."""
    if isinstance(annotation, types.UnionType):
        return any(accepts(option, value) for option in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if typing.get_origin(annotation) is tuple:
        items = typing.get_args(annotation)
        return (isinstance(value, (list, tuple)) and len(value) == len(items)
                and all(accepts(item, v) for item, v in zip(items, value)))
    if typing.get_origin(annotation) is list:
        return isinstance(value, (list, tuple)) and all(accepts(typing.get_args(annotation)[0], v) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, Mapping)
    return isinstance(value, annotation)


def check_value(key: str, spec: dataclasses.Field, value: Any) -> None:
    """A one-line ``ConfigError`` unless ``value`` is one of ``spec``'s choices and within its bounds."""
    choices, limits = spec.metadata.get("choices"), spec.metadata.get("bounds", {})
    if choices and value not in choices:
        what = spec.metadata["what"]
        raise ConfigError(f"unknown {what + ' ' if what else ''}{key}={value!r}; choose from {', '.join(choices)}")
    numbers = [v for v in (value if isinstance(value, (list, tuple)) else [value])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]  # null, where a key may be null, has no range
    if not all(BOUNDS[kind][1](v, bound) for v in numbers for kind, bound in limits.items()):
        allowed = " and ".join(f"{BOUNDS[kind][0]} {bound}" for kind, bound in limits.items())
        raise ConfigError(f"config key {key!r} must be {allowed}, got {value!r}")


def check_section(cls: type, values: Mapping, prefix: str) -> None:
    """Each key of ``values`` that the dataclass ``cls`` declares (nested sections too): of its type, one of its
    choices, within its bounds; a one-line ``ConfigError`` naming the first that is not."""
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        if spec.name not in values:
            continue
        key = f"{prefix}.{spec.name}" if prefix else spec.name
        value, annotation = values[spec.name], hints[spec.name]
        if dataclasses.is_dataclass(annotation) and isinstance(value, Mapping):
            check_section(annotation, value, key)
            continue
        if not accepts(annotation, value):
            raise ConfigError(f"config key {key!r} expects {type_name(annotation)}, got {value!r}")
        check_value(key, spec, value)
