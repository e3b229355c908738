"""Train/val/test splits: random or grouped from a split seed, or as a dataset ships them, each described as
a ``Split`` that a run's record names (``SplitDataModule.describe_split``)."""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import torch

from common.errors import DataError
from common.sections import GroupedSplit

SPLITS = ("train", "val", "test")


def check_fractions(fractions, key: str = "data.split") -> tuple[float, float, float]:
    """Train/val/test fractions as given in a config: three numbers >= 0 that sum to 1."""
    values = tuple(fractions)
    if len(values) != 3 or min(values) < 0 or abs(sum(values) - 1) > 1e-6:
        raise DataError(f"{key} must be three train/val/test fractions >= 0 that sum to 1, got {list(values)}")
    return values


def seeded_split(n: int, fractions, seed: int) -> tuple[list[int], list[int], list[int]]:
    """A fixed random train/val/test partition of range(n) with the given fractions (test takes the rest)."""
    fractions = check_fractions(fractions)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_train, n_val = int(round(fractions[0] * n)), int(round(fractions[1] * n))
    return order[:n_train], order[n_train:n_train + n_val], order[n_train + n_val:]


class Split(NamedTuple):
    """How a dataset was split, as ``SplitDataModule.describe_split`` takes it, ``members`` in the order its dataset
    holds them."""

    source: str
    rule: str
    members: dict[str, list[str]]


class Grouping(NamedTuple):
    """A grouped split as asked for (``grouping``): ``pattern`` names each sample's group (``name_groups``);
    ``val`` and ``test`` say which groups those splits take, as a count (drawn from the split seed) or a list
    of group names, or None: as many as the split fractions give them."""

    pattern: str
    val: int | list[str] | None = None
    test: int | list[str] | None = None

    def test_only(self) -> Grouping:
        """For a first cut that holds out the test set alone (val is carved from train later): no val groups."""
        return self._replace(val=None if self.val is None else 0)

    def val_as_test(self) -> Grouping:
        """For carving val out of train (``carve_validation``): val's groups, asked for as that cut's test."""
        return Grouping(self.pattern, None if self.val is None else 0, self.val)


def grouping(data: GroupedSplit) -> Grouping | None:
    """The grouped split a data section asks for (``common.sections.GroupedSplit``); None for a random one."""
    pattern, val, test = data.group_pattern, data.val_groups, data.test_groups
    if pattern is None:
        if val is not None or test is not None:
            raise DataError("data.val_groups and data.test_groups need data.group_pattern, which says what a group is")
        return None
    return Grouping(pattern, [str(v) for v in val] if isinstance(val, list) else val,
                    [str(v) for v in test] if isinstance(test, list) else test)


def _how(seed: int, groups: Grouping | None) -> str:
    if groups is None:
        return f"at random, split seed {seed}"
    counts = "".join(f", {split}: {_asked(asked)}" for split, asked in (("val", groups.val), ("test", groups.test))
                     if asked is not None)
    return f"grouped by '{groups.pattern}'{counts}, split seed {seed}"


def _asked(asked: int | list[str]) -> str:
    return f"{asked} group{'s' * (asked != 1)}" if isinstance(asked, int) else f"groups {', '.join(asked)}"


def name_groups(names: list[str], pattern: str) -> list[str]:
    """The group of each name: the named group ``group`` of the regular expression ``pattern`` (e.g.
    ``_(?P<group>[^_/]+)_\\d+\\.wav$`` for the speaker of ``<class>/<digit>_<speaker>_<index>.wav``),
    searched in the name. A bad pattern or a name it does not match is a ``DataError``."""
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise DataError(f"data.group_pattern '{pattern}' is not a regular expression ({err})") from None
    if "group" not in regex.groupindex:
        raise DataError(f"data.group_pattern '{pattern}' has no named group (?P<group>...) saying what to group by")
    groups = []
    for name in names:
        match = regex.search(name)
        if match is None or match["group"] is None:
            raise DataError(f"{name} does not match data.group_pattern '{pattern}'")
        groups.append(match["group"])
    return groups


def grouped_split(groups: list[str], fractions, seed: int, val: int | list[str] | None = None,
                  test: int | list[str] | None = None) -> tuple[list[int], list[int], list[int]]:
    """A train/val/test partition of range(len(groups)) that keeps every group in one split. The distinct
    groups are shuffled (from ``seed``). Asked for in groups (``val``, ``test``: a count or names, see
    ``Grouping``), test takes its named groups or the first ``test`` of that order, val the next, and train
    the rest. Otherwise each group goes to the split its middle item falls in when the items are counted
    in that order, so the splits hold about ``fractions`` of the items; a split with a positive fraction
    that gets no group then takes the last group train got (few, large groups: 6 speakers at 80/10/10).
    Train must keep a group; a split asked for neither in groups nor by a positive fraction stays empty."""
    fractions = check_fractions(fractions)
    items: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        items.setdefault(group, []).append(index)
    distinct = sorted(items)
    order = [distinct[g] for g in torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed)).tolist()]
    by_fractions = val is None and test is None
    chosen = _by_fractions(order, items, fractions) if by_fractions else _by_groups(order, {"test": test, "val": val}, fractions)
    if not chosen["train"]:
        raise DataError(f"a grouped split of {len(distinct)} groups leaves no group to train on; ask for fewer "
                        "val/test groups (data.val_groups, data.test_groups) or use more groups")
    return tuple([index for group in chosen[split] for index in items[group]] for split in SPLITS)


def _by_fractions(order: list[str], items: dict[str, list[int]], fractions) -> dict[str, list[str]]:
    bounds = np.cumsum(fractions) * sum(len(members) for members in items.values())
    chosen: dict[str, list[str]] = {split: [] for split in SPLITS}
    counted = 0
    for group in order:
        middle = counted + len(items[group]) / 2
        chosen[SPLITS[min(int(np.searchsorted(bounds, middle, side="right")), 2)]].append(group)
        counted += len(items[group])
    for split, fraction in zip(SPLITS[1:], fractions[1:]):
        if fraction > 0 and not chosen[split] and len(chosen["train"]) > 1:
            chosen[split].append(chosen["train"].pop())
        elif fraction > 0 and not chosen[split]:
            raise DataError(f"a grouped split of {len(order)} groups leaves the {split} split empty "
                            f"(fractions {list(fractions)}); use more groups")
    return chosen


def _by_groups(order: list[str], asked: dict[str, int | list[str] | None], fractions) -> dict[str, list[str]]:
    named = {split: want for split, want in asked.items() if isinstance(want, list)}
    for split, names in named.items():
        if unknown := sorted(set(names) - set(order)):
            raise DataError(f"data.{split}_groups names {', '.join(unknown)}, which no sample's group is "
                            f"(groups: {', '.join(sorted(order)[:10])}{', ...' if len(order) > 10 else ''})")
    if len(named) == 2 and set(named["val"]) & set(named["test"]):
        raise DataError(f"groups {', '.join(sorted(set(named['val']) & set(named['test'])))} are asked for in "
                        "both data.val_groups and data.test_groups")
    free = [group for group in order if not any(group in names for names in named.values())]
    chosen = {"train": [], **{split: list(names) for split, names in named.items()}}
    for split, want in asked.items():
        if want is None:
            if fractions[SPLITS.index(split)] > 0:
                raise DataError(f"data.{split}_groups is not set while data.{'test' if split == 'val' else 'val'}"
                                f"_groups is; give both (0 for none)")
            want = 0
        if isinstance(want, int):
            if want > len(free):
                raise DataError(f"data.{split}_groups={want} asks for more groups than the {len(free)} left "
                                f"(of {len(order)})")
            chosen[split], free = free[:want], free[want:]
    chosen["train"] = free
    return chosen


def split_names(names: list[str], fractions, seed: int, groups: Grouping | None = None) -> Split:
    """``names`` (unique sample ids) split into train/val/test by ``fractions``: grouped as ``groups`` asks
    (``grouping``) when given, else at random, from ``seed``. Pass the data's split seed, never the
    training seed, so every run of a dataset sees the same split."""
    fractions = check_fractions(fractions)
    if groups is None:
        parts = seeded_split(len(names), fractions, seed)
    else:
        parts = grouped_split(name_groups(names, groups.pattern), fractions, seed, groups.val, groups.test)
    shares = "/".join(f"{fraction:.4g}" for fraction in fractions)
    rule = f"fractions {shares} {_how(seed, groups)}" if groups is None or groups.val is groups.test is None \
        else _how(seed, groups)
    return Split("grouped" if groups else "random", rule,
                 {split: [names[i] for i in part] for split, part in zip(SPLITS, parts)})


def carve_validation(split: Split, share: float, seed: int, groups: Grouping | None = None) -> Split:
    """``split`` with its val set taken out of its train set: a ``share`` of it (or, grouped, the val groups
    asked for), at random or grouped as ``split_names`` does; the test set stays as it is."""
    carved = split_names(split.members["train"], (1 - share, 0.0, share), seed, groups and groups.val_as_test())
    val = _asked(groups.val) if groups and groups.val is not None else f"a {share:g} share"
    return Split(split.source, f"{split.rule}; val: {val} of train {_how(seed, groups)}",
                 {"train": carved.members["train"], "val": carved.members["test"], "test": split.members["test"]})


def shipped_split(members: dict[str, list[str]], layout: str | None, fractions, seed: int,
                  groups: Grouping | None = None) -> Split:
    """The split a dataset ships: ``members`` of train and of val and/or test, as ``layout`` (where they
    come from, in words; None: split folders named by the splits) has them. Without test, val is also the
    test set (ImageNet and ADE20K keep their test labels private); without val, ``carve_validation`` takes
    the share of train that the train/val/test ``fractions`` give val beside train."""
    layout = layout or "split folders " + " ".join(f"{split}/" for split in members)
    if "val" not in members:
        train, val, _ = check_fractions(fractions)
        share = val / (train + val) if train + val > 0 else 0.0
        return carve_validation(Split("shipped", layout, {**members, "val": []}), share, seed, groups)
    if "test" not in members:
        return Split("shipped", f"{layout}; val is also the test set", {**members, "test": members["val"]})
    return Split("shipped", layout, {split: members[split] for split in SPLITS})
