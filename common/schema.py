"""The schema of a run's config: one typed section per model (``common.typed.Model``: pydantic, strict, closed),
each field with its type, default, range or choices and, below it, what it means.

``RunConfig`` holds the sections every run has. A domain subclasses it (``domains/<name>/config.py``): it types
its own ``data``, ``model``, ``task`` (and ``robustness``) sections, from the keys domains share where it has them
(``common.sections``), and sets its defaults of the shared ones (``optim = Optim(name="adam")``); its presets stay
in ``configs/domain/<name>.yaml``.

A subclass keeps its parent's field order, and a section's defaults, dumped in field order, start every composed
config, over which a run's hash is taken (``runners.config.config_hash``; a domain's ``data`` and ``model`` keys in
the order ``configs/key_order.yaml`` keeps): a field added or moved changes every run's hash, and a new default
that of every run that does not set it, unless ``runners.config.UNHASHED`` leaves the key out. Defaults are not
validated (``validate_default=False``), so a default is dumped as written.

This module needs only the standard library, pydantic and the variants as data (``common.attention.variants``): a
mistyped key or name is answered before torch loads.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from common.attention.variants import ABLATIONS, VARIANTS
from common.errors import ConfigError
from common.typed import Model, first_problem

MAX_SEED = 2**32 - 1  # numpy's seeds, which Lightning's seed_everything passes on, stop here

# The ranges several sections share, written once.
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Positive = Annotated[int, Field(ge=1)]  # a size or a count: at least one
Count = Annotated[int, Field(ge=0)]  # zero allowed: "none" or "every"
Fraction = Annotated[float, Field(ge=0, le=1)]  # a probability, a dropout, a ratio of a whole
NonNegative = Annotated[float, Field(ge=0)]
Rate = Annotated[float, Field(gt=0)]
Budgets = list[Annotated[float, Field(gt=0)]]  # L-inf attack budgets, in input units (common.perturbations)
Severities = list[Annotated[int, Field(ge=1, le=5)]]  # the corruption benchmarks' five levels


def follows(key: str) -> Any:
    """A default that takes the value of a sibling ``key`` of its section, as composed (an OmegaConf reference
    in the defaults, resolved when the config is; never in a value given by the user, which is data)."""
    return Field(f"${{.{key}}}", validate_default=False)


def known_variant(name: str) -> str:
    """``name``, if a variant or an ablation has it: looked up when a config is read, so that a variant added to
    ``VARIANTS`` (a test's, a plugin's) is one too."""
    if name in VARIANTS or name in ABLATIONS:
        return name
    raise PydanticCustomError("choice", "choose from {names}", {"names": ", ".join([*VARIANTS, *ABLATIONS])})


class Attention(Model):
    """Keyword arguments of ``common.attention.MultiheadAttention`` (``common.attention.attention_layer``)."""

    variant: Annotated[str, AfterValidator(known_variant)] = "quest"
    """A variant of ``common.attention.VARIANTS``, or an ablation (``ABLATIONS``); ``quest list`` shows them."""
    qk_gain_init: float | None = None
    """qknorm / qknorm_hs: the initial logit gain; null: log2(L^2 - L) from the model's typical length."""
    l2norm_kernel: Literal["fused", "formula"] = "fused"
    """How q and k are L2-normalised on CPU: fused kernels, or the formula (the same map to float rounding; the
    formula reproduces runs recorded before the fused kernels, to the bit)."""


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


class Compile(Model):
    """torch.compile of each training step's forward and backward (``common.task.Task.compile_training``);
    evaluation, attacks and probe steps stay eager. Left out of the run's hash: a compiled run equals an eager one
    to float rounding (tests/test_compile.py)."""

    enabled: bool = False
    mode: Literal[COMPILE_MODES] = "default"


OPTIMIZER_NAMES = ("adamw", "adam", "sgd", "lamb")  # common.task.OPTIMIZERS: lamb is timm's, as DeiT-III
SCHEDULES = ("cosine", "poly", "constant")
Beta = Annotated[float, Field(ge=0, lt=1)]


class Optim(Model):
    """The optimiser and its schedule: ``schedule`` after ``warmup_steps`` of linear warm-up, ending at
    ``min_lr_ratio`` × ``lr`` and held there for ``cooldown_steps``."""

    name: Literal[OPTIMIZER_NAMES] = "adamw"
    lr: Rate = 1.0e-3
    """The peak learning rate, reached after warmup_steps."""
    weight_decay: NonNegative = 0.05
    """On parameters of two or more dimensions (not biases, norms or gains): decoupled in adamw and lamb, an L2 term
    in the gradient in adam and sgd."""
    betas: Annotated[tuple[Beta, Beta], Field(strict=False)] = (0.9, 0.999)
    """Adam's, AdamW's and LAMB's (torch's Adam takes no other); a config file gives a list."""
    momentum: Fraction = 0.9
    """SGD only."""
    nesterov: bool = True
    """SGD only: Nesterov's momentum (false: the classical heavy ball, as Segmenter)."""
    schedule: Literal[SCHEDULES] = "cosine"
    """How the rate falls from lr after the warm-up, stepped every optimiser step."""
    warmup_steps: Count = 0
    """Linear warm-up to lr over this many optimiser steps (step t at lr × (t + 1) / warmup_steps)."""
    min_lr_ratio: Fraction = 0.0
    """Where the schedule ends, as a fraction of lr."""
    cooldown_steps: Count = 0
    """The last steps held at lr × min_lr_ratio (DeiT's cool-down epochs)."""
    poly_power: NonNegative = 0.9
    """poly: lr × (1 - progress) ** poly_power."""
    min_lr: Rate | None = None
    """Where the schedule ends as a rate, not a fraction of lr (Wortsman et al. 2023 decay every rate of a sweep to
    1e-5): set, it takes min_lr_ratio's place as min(min_lr / lr, 1)."""
    independent_weight_decay: bool = False
    """adamw: weight_decay is the fraction each weight shrinks per step at the schedule's peak, whatever lr is (Wortsman
    et al.'s independent decay; torch's AdamW, given weight_decay / lr, decays by lr_t × that). false: torch's own,
    lr_t × weight_decay, so a higher rate also decays more."""
    z_loss: NonNegative = 0.0
    """Adds z_loss × mean(log² Z) to the training loss, Z the softmax normaliser of the output logits (PaLM's z-loss,
    1e-4 in Wortsman et al.), so that the output logits cannot drift; only a task with output logits takes it."""

    @field_validator("independent_weight_decay")
    @classmethod
    def _independent_decay_is_adamw(cls, independent: bool, info: ValidationInfo) -> bool:
        if independent and info.data.get("name", "adamw") != "adamw":
            raise PydanticCustomError("rule", "needs optim.name=adamw (decoupled decay); {name} couples decay to its gradient",
                                      {"name": info.data["name"]})
        return independent


# Lightning reads a float as a fraction of the batches and an int as a count of them: an int stays an int.
Limit = Count | NonNegative | None


class Trainer(Model):
    """Passed straight to ``pytorch_lightning.Trainer``. ``data.batch_size`` is the global batch: each device
    loads batch_size / (devices × num_nodes × accumulate_grad_batches) per step."""

    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: Positive = 1
    accumulate_grad_batches: Positive = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: Annotated[int, Field(ge=-1)] | None = 10
    max_steps: Annotated[int, Field(ge=-1)] = -1
    """-1: as many as max_epochs make."""
    gradient_clip_val: NonNegative | None = 1.0
    limit_train_batches: Limit = 1.0
    limit_val_batches: Limit = 1.0
    limit_test_batches: Limit = 1.0
    check_val_every_n_epoch: Positive | None = 1
    log_every_n_steps: Positive = 10
    enable_progress_bar: bool = True
    deterministic: bool = False


class MLflow(Model):
    """MLflow (pip install 'quest-study[tracking]'); runners/runs/trackers.py."""

    enabled: bool = False
    tracking_uri: str = "file:./mlruns"
    """A local file store (relative to where quest runs), or http(s)://<server> online."""
    experiment: str = "quest"


class Wandb(Model):
    """Weights & Biases (pip install 'quest-study[tracking]')."""

    enabled: bool = False
    project: str = "quest"
    mode: Literal["offline", "online"] = "offline"
    """offline: upload later with ``wandb sync <dir>/wandb/offline-run-*``."""
    dir: str = "."
    """Runs are written under <dir>/wandb/."""


class Logging(Model):
    """Where a run's metrics go besides its record (not part of its identity)."""

    csv: bool = True
    tensorboard: bool = False
    """TensorBoard events in the run directory."""
    mlflow: MLflow = MLflow()
    wandb: Wandb = Wandb()


PROGRESS_STYLES = ("auto", "bar", "lines", "none")


class Progress(Model):
    """What a run shows while it trains (not part of its identity)."""

    style: Literal[PROGRESS_STYLES] = "auto"
    """auto: Lightning's bar on an interactive terminal, lines on a log file or pipe."""
    every_n_steps: Count = 100
    """lines: one per this many training steps (0: none between), one at the end."""


class Divergence(Model):
    """A run that blows up ends as ``status: diverged``: a result (exit code 0), not a failure."""

    loss_ratio: NonNegative | None = 1.0e3
    """Training loss above this × max(first training loss, 1); null disables."""
    max_loss: NonNegative | None = 1.0e6
    """Training loss above this; null disables (non-finite losses always diverge)."""


class Probes(Model):
    every_n_steps: Count = 25
    """0 disables probing."""
    max_samples: Positive = 4
    """Samples of the batch the explicit logits are formed for."""
    max_logit_bound: NonNegative | None = 1.0e4
    """A larger (or non-finite) max logit ends the run as diverged."""


class Pgd(Model):
    steps: Positive = 10
    rel_step_size: Rate = 0.25
    """Each step moves rel_step_size × eps."""
    random_start: bool = True


class AutoAttack(Model):
    max_samples: Count = 0
    """The first N test samples; 0 skips it (pyautoattack; 100 samples × 3 eps take about 3 CPU-minutes)."""
    version: str = "standard"


class Robustness(Model):
    """``quest robustness <run dir>``: a classifier's test split under L-inf attacks and corruptions
    (``common.perturbations.evaluate_robustness``), for the domains that have the section."""

    input_range: Annotated[tuple[float, float], Field(strict=False)] | None = (0.0, 1.0)
    """The valid range of the attacked input; null for unbounded features."""
    eps: Budgets = [0.02, 0.05, 0.1]
    pgd: Pgd = Pgd()
    corruptions: list[str] = []
    """imagecorruptions' names (images in [0, 1] only)."""
    severities: Severities = [1, 2, 3, 4, 5]
    autoattack: AutoAttack = AutoAttack()
    max_samples: Positive | None = 500
    """The first test samples evaluated; null for the whole test split."""
    seed: Seed = 0


class RunConfig(Model):
    """Every run's config: these sections, then the domain's own (``data``, ``model``, ...: its subclass, see the
    module's docstring). The fields' order is the config's, which the run hash depends on."""

    domain: str
    """The domain's name (``quest list``)."""
    preset: str = "demo"
    """One of the domain's presets (configs/domain/<domain>.yaml), set over these defaults."""
    seed: Seed = 0
    """The training seed: initialisation, shuffling, dropout; never a data split (``data.split_seed``)."""
    output_dir: str = "runs"
    """Runs land in <output_dir>/<domain>/<variant>/seed<seed>-<config hash>."""
    cache_dir: Annotated[Path, Field(strict=False)] = Path(".cache/quest")
    """Generated and featurised datasets, reused across runs."""
    threads: Positive | None = None
    """torch intra-op threads; null leaves torch's default."""
    attention: Attention = Attention()
    compile: Compile = Compile()
    task: Model = Model()
    """The domain's task settings (loss, label smoothing, perturbations)."""
    optim: Optim = Optim()
    trainer: Trainer = Trainer()
    logging: Logging = Logging()
    progress: Progress = Progress()
    divergence: Divergence = Divergence()
    probes: Probes = Probes()
    test_checkpoint: Literal["best", "last"] = "best"
    """The weights the test split scores: best (the best validation's, kept by the checkpoint) or last (the final
    ones, as a study of training stability reads a run: where it ended, not where it was best)."""

    @property
    def attn_layer(self) -> Callable:
        """What a model makes its attention layers with: ``common.attention.attention_layer`` of the ``attention``
        section (imported here, so that reading a config loads no torch)."""
        from common.attention import attention_layer

        return attention_layer(**dict(self.attention))


def defaults(schema: type[RunConfig], domain: str) -> dict:
    """The config every run of ``domain`` starts from: ``schema``'s defaults in field order, as a config file
    gives them (lists for tuples)."""
    return schema.model_construct(domain=domain).model_dump(mode="json", warnings=False)


def missing_keys(cls: type[Model], values: dict, prefix: str = "") -> list[str]:
    """The keys of ``cls`` (nested sections too) that ``values`` lacks: a config written before they existed,
    which validation would quietly fill with today's defaults."""
    missing = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        if name not in values:
            missing.append(key)
        elif isinstance(field.default, Model) and isinstance(values[name], dict):
            missing += missing_keys(type(field.default), values[name], f"{key}.")
    return missing


def section(cls: type[Model], values: Any, prefix: str) -> Model:
    """``values`` read as the section ``cls``; a one-line ``ConfigError`` naming the first key that is not of
    its type, among its choices or within its range."""
    try:
        return cls.model_validate(values)
    except ValidationError as err:
        key, reason, value = first_problem(err)
        raise ConfigError(problem(f"{prefix}.{key}" if prefix else key, reason, value)) from None


def problem(key: str, reason: str, value: Any) -> str:
    """The one line saying what is wrong with ``value`` at ``key``."""
    if reason.startswith("choose from"):
        names = {name.lower(): name for name in reason.removeprefix("choose from ").split(", ")}
        near = difflib.get_close_matches(str(value).lower(), names, n=1)
        return f"unknown {key}={value!r}; {reason}" + (f" (did you mean {names[near[0]]}?)" if near else "")
    if reason == "is not a known key":
        return f"unknown config key {key!r}"
    return f"config key {key!r} {reason}, got {value!r}"
