"""The language domain's config: its typed ``data`` and ``model`` sections and its defaults of the shared ones, its
trainer with the one Lightning argument it adds. Its presets are in configs/domain/language.yaml."""
from typing import Literal

from common.schema import Fraction, Optim, Positive, RunConfig, Trainer
from common.sections import EvalLoader, Transformer

# dataset name -> loader of its corpus (corpus.py)
DATASETS = ("stdlib", "text", "enwik8", "text8", "wikitext103")  # their loaders: data.LOADERS

ARCHS = ("llama", "qwen3", "gpt_neox", "gpt2")  # transformers model types (domains/language/hf.py); "gpt" is ours
INITS = ("gpt2", "torch")  # GPT-2 / nanoGPT's | PyTorch's module defaults (embeddings as GPT-2's)


class Data(EvalLoader):
    """The corpus, its tokens and its windows."""

    dataset: Literal[DATASETS] = "stdlib"
    """stdlib (embedded: Python's standard library sources), text, enwik8, text8 or wikitext103."""
    root: str | None = None
    """text: a UTF-8 file or folder of files; enwik8/text8: the file or its folder; wikitext103: the folder with
    wiki.train.raw, wiki.valid.raw, wiki.test.raw."""
    tokens: Literal["byte", "char"] = "byte"
    """byte (vocabulary 256) or char (the train split's characters; others map to <unk>)."""
    split: list[Fraction] = [0.9, 0.05, 0.05]
    """stdlib and text: train/val/test fractions, by document (hash of the relative path; no seed) or, for one text
    file, by position; enwik8/text8 always 90/5/5."""
    max_train_bytes: Positive | None = None
    """Read at most this many bytes of the train split (null: all of it)."""
    max_eval_bytes: Positive | None = None
    """... of the val split and of the test split each."""
    context: Positive = 256
    """Tokens per window (nanoGPT's block_size), also the size of the position table."""


class Net(Transformer):
    """The network: our GPT's keyword arguments (``domains.language.model.GPT``), or a transformers one's."""

    arch: Literal[("gpt", *ARCHS)] = "gpt"
    """gpt (ours, on common.blocks), or llama, qwen3, gpt_neox, gpt2: that transformers causal LM built from a
    config at this size (the hf extra; domains/language/hf.py)."""
    tie_weights: bool = True
    """The output layer is the token embedding (GPT-2)."""
    init: Literal[INITS] = "gpt2"
    """gpt2: N(0, 0.02²) weights, residual projections / √(2·depth); torch: PyTorch's defaults (Xavier q/k/v). It
    sets every variant's initial attention sharpness."""


class LanguageTrainer(Trainer):
    val_check_interval: Positive | None = 250
    """Validate and checkpoint every N training steps (an int), whatever the epoch length."""


class LanguageConfig(RunConfig):
    """Causal language modelling with a decoder-only GPT (GPT-2 / nanoGPT layout: pre-norm, learned positions, tied
    embeddings). Loss in nats per token; bits per byte (or char) and perplexity beside it."""

    optim: Optim = Optim(name="adamw", lr=1.0e-3, betas=(0.9, 0.95), weight_decay=0.1, warmup_steps=100,
                         min_lr_ratio=0.1)
    """Weight decay on matrices and embeddings only; cosine decay to lr × min_lr_ratio at trainer.max_steps."""
    trainer: LanguageTrainer = LanguageTrainer(max_epochs=-1, max_steps=2000, check_val_every_n_epoch=None,
                                               gradient_clip_val=1.0)
    """The training length is trainer.max_steps (max_epochs -1); validation every val_check_interval steps."""
    data: Data = Data(eval_batch_size=64)
    model: Net = Net()
