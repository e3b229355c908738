"""The shared split helpers of common.data: random and grouped splits drawn from a split seed, a shipped
split completed (val carved out of train, or val doubling as test), split folders, class folders per
split, and the membership hashes a run record carries. Each domain's tests check its own loaders."""
import random

import pytest

from common.data import (
    SPLITS,
    DataError,
    Grouping,
    Split,
    SplitDataModule,
    carve_validation,
    class_folder_splits,
    grouped_split,
    name_groups,
    seeded_split,
    shipped_split,
    split_folders,
    split_names,
)


def clips(speakers: int = 12, seed: int = 0) -> list[str]:
    """Spoken-digit file names ``<digit>/<digit>_<speaker>_<index>.wav``, 1 to 20 clips per speaker."""
    rng = random.Random(seed)
    return [f"{i % 10}/{i % 10}_spk{s}_{i}.wav" for s in range(speakers) for i in range(rng.randint(1, 20))]


SPEAKER = r"_(?P<group>spk\d+)_\d+\.wav$"
BY_SPEAKER = Grouping(SPEAKER)


@pytest.mark.parametrize("seed", range(5))
def test_a_grouped_split_never_puts_one_group_in_two_splits(seed):
    names = clips(speakers=30, seed=seed)
    split = split_names(names, (0.7, 0.15, 0.15), seed, BY_SPEAKER)
    speakers = {s: {name.split("_")[1] for name in split.members[s]} for s in SPLITS}
    assert sum(map(len, speakers.values())) == len(set().union(*speakers.values()))  # no speaker in two splits
    assert sorted(sum(split.members.values(), [])) == sorted(names)  # a partition: every clip once
    assert split.source == "grouped" and SPEAKER in split.rule
    share = len(split.members["train"]) / len(names)
    assert 0.55 < share < 0.85  # about the fraction asked for, in whole speakers
    assert split_names(names, (0.7, 0.15, 0.15), seed, BY_SPEAKER) == split  # the split seed alone decides


def test_grouped_split_assigns_whole_groups_by_their_middle_item():
    # Four groups of 5 items, shuffled by the seed; 0.5/0.25/0.25 of 20 items: the middles 2.5 and 7.5
    # fall in train, 12.5 in val, 17.5 in test.
    groups = [g for g in "abcd" for _ in range(5)]
    parts = grouped_split(groups, (0.5, 0.25, 0.25), seed=0)
    assert [len(part) for part in parts] == [10, 5, 5]
    assert all(len({groups[i] for i in part}) == len(part) // 5 for part in parts)
    with pytest.raises(DataError, match="a grouped split of 2 groups leaves the val split empty"):
        grouped_split(["a", "a", "b"], (0.5, 0.25, 0.25), seed=0)
    assert grouped_split(groups, (0.75, 0.0, 0.25), seed=0)[1] == []  # a zero fraction may stay empty


@pytest.mark.parametrize("seed", range(5))
def test_few_large_groups_give_every_split_with_a_fraction_at_least_one(seed):
    """Six speakers at 80/10/10: no speaker's middle clip may fall in val or test; each then takes one."""
    names = clips(speakers=6, seed=seed)
    split = split_names(names, (0.8, 0.1, 0.1), seed, BY_SPEAKER)
    speakers = speakers_of(split)
    assert all(speakers.values()) and len(speakers["val"]) == len(speakers["test"]) == 1
    assert sorted(sum(split.members.values(), [])) == sorted(names)


def speakers_of(split: Split) -> dict[str, set[str]]:
    return {s: {name.split("_")[1] for name in split.members[s]} for s in SPLITS}


def test_a_grouped_split_asked_for_in_groups_by_count_or_by_name():
    names = clips(speakers=8)
    counted = split_names(names, (0.8, 0.1, 0.1), 0, Grouping(SPEAKER, val=2, test=3))
    assert [len(speakers_of(counted)[s]) for s in SPLITS] == [3, 2, 3]
    assert counted == split_names(names, (0.8, 0.1, 0.1), 0, Grouping(SPEAKER, val=2, test=3))  # the split seed decides
    assert counted.rule == f"grouped by '{SPEAKER}', val: 2 groups, test: 3 groups, split seed 0"
    listed = split_names(names, (0.8, 0.1, 0.1), 0, Grouping(SPEAKER, val=["spk1"], test=["spk2", "spk5"]))
    assert speakers_of(listed) == {"train": {"spk0", "spk3", "spk4", "spk6", "spk7"}, "val": {"spk1"},
                                   "test": {"spk2", "spk5"}}
    mixed = speakers_of(split_names(names, (0.8, 0.1, 0.1), 0, Grouping(SPEAKER, val=1, test=["spk0"])))
    assert mixed["test"] == {"spk0"} and len(mixed["val"]) == 1 and "spk0" not in mixed["val"] | mixed["train"]
    asked = Grouping(SPEAKER, val=2, test=1)  # test held out first, val carved from train afterwards
    carved = carve_validation(split_names(names, (0.8, 0.0, 0.2), 0, asked.test_only()), 0.1, 0, asked)
    assert [len(speakers_of(carved)[s]) for s in SPLITS] == [5, 2, 1]


@pytest.mark.parametrize("groups, message", [
    (Grouping(SPEAKER, val=["spk9"], test=1), r"data.val_groups names spk9, which no sample's group is \(groups: spk0"),
    (Grouping(SPEAKER, val=["spk1"], test=["spk1"]), "groups spk1 are asked for in both"),
    (Grouping(SPEAKER, val=5, test=4), r"data.val_groups=5 asks for more groups than the 4 left \(of 8\)"),
    (Grouping(SPEAKER, val=2, test=None), "data.test_groups is not set while data.val_groups is"),
    (Grouping(SPEAKER, val=4, test=4), "leaves no group to train on"),
])
def test_groups_asked_for_wrongly_are_one_line_data_errors(groups, message):
    with pytest.raises(DataError, match=message):
        split_names(clips(speakers=8), (0.8, 0.1, 0.1), 0, groups)


def test_groups_without_a_pattern_are_a_data_error_and_of_the_wrong_kind_a_config_error():
    """``grouping`` reads a typed data section: the domain's types refuse a negative count before it runs."""
    from common.data import grouping
    from common.errors import ConfigError
    from domains.segmentation.config import Data
    from runners.config import compose

    assert grouping(Data(group_pattern=None)) is None
    assert grouping(Data(group_pattern=SPEAKER, val_groups=[1], test_groups=2)) == Grouping(SPEAKER, ["1"], 2)
    with pytest.raises(DataError, match="need data.group_pattern"):
        grouping(Data(group_pattern=None, val_groups=2))
    with pytest.raises(ConfigError, match=r"'data.test_groups' must be >= 0"):
        compose(["domain=segmentation", "data.test_groups=-1"])


def test_a_random_split_is_the_seeded_split_of_the_names():
    names = [f"img{i}.png" for i in range(50)]
    split = split_names(names, (0.8, 0.1, 0.1), seed=3)
    parts = seeded_split(50, (0.8, 0.1, 0.1), 3)
    assert split == Split("random", "fractions 0.8/0.1/0.1 at random, split seed 3",
                          {s: [names[i] for i in part] for s, part in zip(SPLITS, parts)})
    assert split_names(names, (0.8, 0.1, 0.1), seed=4).members != split.members


def test_group_pattern_errors_are_one_line():
    with pytest.raises(DataError, match="is not a regular expression"):
        name_groups(["a.wav"], "(?P<group>")
    with pytest.raises(DataError, match=r"has no named group \(\?P<group>"):
        name_groups(["a.wav"], r"_(\w+)_")
    with pytest.raises(DataError, match="0/0_jackson.wav does not match"):
        name_groups(["0/0_jackson.wav"], SPEAKER)
    assert name_groups(["3/3_spk7_12.wav"], SPEAKER) == ["spk7"]


def test_shipped_split_completes_what_the_dataset_lacks():
    train, val, test = [f"train/{i}" for i in range(10)], ["val/0", "val/1"], ["test/0", "test/1", "test/2"]
    full = shipped_split({"train": train, "val": val, "test": test}, "split folders", (0.8, 0.1, 0.1), 0)
    assert full == Split("shipped", "split folders", {"train": train, "val": val, "test": test})
    imagenet = shipped_split({"train": train, "val": val}, "train/ val/", (0.8, 0.1, 0.1), 0)
    assert imagenet.members["test"] == val and "val is also the test set" in imagenet.rule
    carved = shipped_split({"train": train, "test": test}, "train/ test/", (0.6, 0.2, 0.2), 0)
    assert carved.members["test"] == test and len(carved.members["val"]) == 2  # 0.2 / (0.6 + 0.2) of 10, rounded
    assert sorted(carved.members["train"] + carved.members["val"]) == sorted(train)
    assert carved.source == "shipped" and "val: a 0.25 share of train at random, split seed 0" in carved.rule


def test_carving_validation_keeps_test_and_groups():
    names = clips(speakers=20)
    held_out = split_names(names, (0.8, 0.0, 0.2), 1, BY_SPEAKER)
    carved = carve_validation(held_out, 0.25, 1, BY_SPEAKER)
    assert carved.members["test"] == held_out.members["test"] and carved.source == "grouped"
    speakers = {s: {name.split("_")[1] for name in carved.members[s]} for s in SPLITS}
    assert not speakers["train"] & speakers["val"]
    assert sorted(carved.members["train"] + carved.members["val"]) == sorted(held_out.members["train"])


def test_split_folders_and_their_class_folders(tmp_path):
    assert split_folders(tmp_path) == {}
    for split, classes in (("train", ("cat", "dog", "owl")), ("test", ("dog", "owl"))):
        for name in classes:
            (tmp_path / split / name).mkdir(parents=True)
            (tmp_path / split / name / f"{name}.png").write_bytes(b"")
    assert split_folders(tmp_path) == {"train": tmp_path / "train", "test": tmp_path / "test"}
    files, classes = class_folder_splits(tmp_path, (".png",))
    assert classes == ["cat", "dog", "owl"]
    assert [(path.parent.name, label) for path, label in files["test"]] == [("dog", 1), ("owl", 2)]  # train's labels
    (tmp_path / "test" / "emu").mkdir()
    (tmp_path / "test" / "emu" / "emu.png").write_bytes(b"")
    with pytest.raises(DataError, match="class folders that train/ lacks: emu"):
        class_folder_splits(tmp_path, (".png",))
    (tmp_path / "train" / "only").mkdir()
    assert split_folders(tmp_path / "train") == {}  # class folders, no split folders


def test_membership_hashes_ignore_order_and_tell_splits_apart():
    first, second = SplitDataModule(8), SplitDataModule(8)
    first.describe_split("random", "r", {"train": ["a", "b"], "test": ["c"]})
    second.describe_split("random", "r", {"train": ["b", "a"], "test": ["c"]})
    assert first.split_info == second.split_info
    second.describe_split("random", "r", {"train": ["a"], "test": ["b", "c"]})
    assert first.split_info["hash"]["test"] != second.split_info["hash"]["test"]
