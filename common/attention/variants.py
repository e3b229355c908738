"""The variants, as data: a variant is one ``Variant`` entry in ``VARIANTS``. No torch here, so that listing
variants and checking a config's ``attention=<name>`` stay fast; the fold classes that hold the learnable
scales live in ``folds.py`` and are named here (``folds.make_fold`` builds one)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One attention variant as data.

    Args:
        name: Its key in ``VARIANTS`` or ``ABLATIONS`` (the ``attention=<name>`` setting).
        norm_q: Whether q is L2-normalised over head_dim.
        norm_k: Whether k is L2-normalised over head_dim.
        scaled: Whether the logit is divided by sqrt(head_dim).
        elliptical: Whether q is weighted by the metric m from the previous layer's values.
        fold: Name of the class in ``folds.FOLDS`` that folds it into (q, k) and owns its learnable scales, if any.
    """

    name: str
    norm_q: bool
    norm_k: bool
    scaled: bool  # divide the logit by sqrt(head_dim)
    elliptical: bool = False  # q weighted by m from the previous layer's values
    fold: str = "QKFold"  # the class in folds.py that owns the learnable scales, if any

    @property
    def learnable(self) -> bool:
        """Whether its fold owns learnable scales (``FOLD_SCALES``): a fold without any, such as the uniform
        ablation's ``ZeroQuery``, runs statelessly wherever a parameter-free variant does.

        Raises:
            ValueError: If the variant names a fold that ``FOLD_SCALES`` does not list.
        """
        if self.fold not in FOLD_SCALES:
            raise ValueError(f"variant {self.name!r} names fold {self.fold!r}; the folds are {', '.join(FOLD_SCALES)}")
        return bool(FOLD_SCALES[self.fold])


# Each fold class of folds.py (its ``FOLDS``) -> the learnable scales it creates, by attribute name: declared here,
# without torch, so that whether a variant is learnable is known without building it. A new fold is a class in
# folds.py, its entry in ``FOLDS`` and its line here (docs/guides/add-a-variant.md); the tests check that each class
# creates what its line says.
FOLD_SCALES: dict[str, tuple[str, ...]] = {"QKFold": (), "LayerGain": ("gain",), "HeadGain": ("gain",),
                                           "DimScale": ("q_scale", "k_scale"),
                                           "QKLayerNorm": ("q_gain", "k_gain"), "ZeroQuery": ()}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("standard", norm_q=False, norm_k=False, scaled=True),
        Variant("quest", norm_q=False, norm_k=True, scaled=False),
        Variant("qnorm", norm_q=True, norm_k=False, scaled=False),
        Variant("qknorm", norm_q=True, norm_k=True, scaled=False, fold="LayerGain"),
        Variant("qknorm_hs", norm_q=True, norm_k=True, scaled=False, fold="HeadGain"),
        Variant("qknorm_ds", norm_q=True, norm_k=True, scaled=False, fold="DimScale"),
        Variant("qk_layernorm", norm_q=False, norm_k=False, scaled=True, fold="QKLayerNorm"),
        Variant("elliptical", norm_q=False, norm_k=False, scaled=True, elliptical=True),
        Variant("elliptical_quest", norm_q=False, norm_k=True, scaled=False, elliptical=True),
    )
}

# Ablations run like variants (``attention=uniform``) but are not compared with them: ``variants: all`` in
# a sweep leaves them out, and ``quest aggregate`` reports them beside standard without ranking them.
ABLATIONS: dict[str, Variant] = {"uniform": Variant("uniform", norm_q=False, norm_k=False, scaled=True, fold="ZeroQuery")}


def get_variant(variant: str | Variant) -> Variant:
    """The ``Variant`` of a name, looked up in ``VARIANTS`` and then ``ABLATIONS``.

    Args:
        variant: A variant's or ablation's name (``"quest"``, ``"uniform"``, ...), or a ``Variant``, returned as is.

    Returns:
        The ``Variant``.

    Raises:
        ValueError: If ``variant`` names no variant or ablation.
    """
    if isinstance(variant, Variant):
        return variant
    spec = VARIANTS.get(variant) or ABLATIONS.get(variant)
    if spec is None:
        raise ValueError(f"unknown attention variant {variant!r}; choose from {', '.join([*VARIANTS, *ABLATIONS])}")
    return spec
