"""Data helpers every domain shares, one file per job:

    splits.py   SPLITS, Split and the rules that draw one: random or grouped from a split seed, or as shipped
    files.py    a dataset on disk: its root, class-per-folder trees, shipped split folders, images, finite values
    cache.py    short_hash and ``cached``: generated or featurised data kept on disk as tensors only
    mnist.py    load_mnist: the digits the vision and segmentation domains build on
    module.py   SplitDataModule, which every domain's datamodule derives from

Domains import from here; each name lives in one file.
"""
from common.data.cache import atomic_save, cached, refused_global, short_hash
from common.data.files import (
    check_finite,
    check_finite_array,
    class_folder_files,
    class_folder_splits,
    data_root,
    named,
    read_csv,
    read_image,
    require_path,
    split_folders,
)
from common.data.mnist import load_mnist
from common.data.module import SplitDataModule
from common.data.splits import (
    SPLITS,
    Grouping,
    Split,
    carve_validation,
    check_fractions,
    grouped_split,
    grouping,
    name_groups,
    seeded_split,
    shipped_split,
    split_names,
)
from common.errors import DataError

__all__ = [
    "SPLITS", "DataError", "Grouping", "Split", "SplitDataModule", "atomic_save", "cached", "carve_validation",
    "check_finite", "check_finite_array", "check_fractions", "class_folder_files", "class_folder_splits", "data_root",
    "grouped_split", "grouping", "load_mnist", "name_groups", "named", "read_csv", "read_image", "refused_global", "require_path",
    "seeded_split", "shipped_split", "short_hash", "split_folders", "split_names",
]
