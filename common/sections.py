"""The sections several domains' ``data`` and ``model`` share, written once: a domain's section subclasses them
(``class Data(EvalLoader, GroupedSplit)``) and sets its own defaults where its config holds the section
(``data: Data = Data(batch_size=64)``). An inherited key comes first in the section's fields; a domain's config.yaml
and run hash keep their earlier order (``configs/key_order.yaml``)."""
from __future__ import annotations

from common.schema import Count, Fraction, Positive, Rate, Seed
from common.typed import Model


class Loader(Model):
    """How the training split is batched."""

    batch_size: Positive = 32
    """Samples per training step (the global batch; see ``trainer``)."""
    num_workers: Count = 0
    """DataLoader worker processes; 0 loads in the training process."""


class EvalLoader(Loader):
    """A loader whose evaluation batches differ from its training ones."""

    eval_batch_size: Positive = 256
    """Samples per validation and test step (no gradients held: larger than batch_size fits)."""


# A list of group names, or how many groups to draw; a name may read as a number (a video numbered 7).
Groups = Count | list[str | int] | None


class GroupedSplit(Model):
    """How files that ship no split are split: at random, or by groups (``common.data.splits``)."""

    split_seed: Seed = 0
    """Draws every random or grouped split, and generated data; the training seed never changes either."""
    group_pattern: str | None = None
    """Folder data: a regex with a (?P<group>...) group, searched in each file's path relative to root (as
    <class>/<file>), e.g. '(?P<group>[^/]+)_frame\\d+\\.png$': one group (a video, a speaker, an object)
    never straddles two splits."""
    val_groups: Groups = None
    """With group_pattern: the val split's groups, a count (drawn from split_seed) or a list of group names; null: as
    many as the fractions give (each split at least one)."""
    test_groups: Groups = None
    """As val_groups, for the test split."""


class Encoder(Model):
    """A transformer's size."""

    dim: Positive = 128
    """The residual stream's width."""
    depth: Positive = 4
    """Blocks."""
    heads: Positive = 4
    """Attention heads (dim / heads each)."""
    dropout: Fraction = 0.0
    """Dropout on the embeddings and inside every block."""


class Transformer(Encoder):
    """A transformer's size, its MLP's and the dropout on its attention weights."""

    mlp_ratio: Rate = 4.0
    """The MLP's hidden width over dim."""
    attn_dropout: Fraction = 0.0
    """On the attention weights."""
