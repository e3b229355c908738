"""Data helpers every domain shares, one file per job (splits, a dataset on disk, the tensor cache, MNIST, the
datamodule); domains import them from here."""
from common.data.cache import cached, refused_global, short_hash
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
    "SPLITS", "DataError", "Grouping", "Split", "SplitDataModule", "cached", "carve_validation",
    "check_finite", "check_finite_array", "check_fractions", "class_folder_files", "class_folder_splits", "data_root",
    "grouped_split", "grouping", "load_mnist", "name_groups", "named", "read_csv", "read_image", "refused_global", "require_path",
    "seeded_split", "shipped_split", "short_hash", "split_folders", "split_names",
]
