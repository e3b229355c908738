"""A dataset as found on disk: its root, class-per-folder trees and the split folders it ships, images read
within limits, and numbers checked to be finite before use; each problem a ``DataError`` that names the file
(and the first bad value)."""
from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from common.data.splits import SPLITS
from common.errors import DataError, error_line
from common.files import not_regular, read_table, regular_file
from common.typed import Model

MAX_TABLE_BYTES = 1 << 30  # a dataset's CSV file, read whole into memory


def require_path(path: str | Path, what: str = "dataset root") -> Path:
    """``path`` if it is a folder or a regular file, else a ``DataError`` naming it: a FIFO, socket or device
    would hang its reader or never end."""
    path = Path(path).expanduser()
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(f"{what} {path} does not exist") from None
    except OSError as err:  # permission denied, a name too long
        raise DataError(f"{what} {path} cannot be read ({err.strerror})") from None
    if not stat.S_ISDIR(mode) and not_regular(mode):
        raise DataError(f"{what} {path} is {not_regular(mode)}; data is read from files and folders")
    return path


def data_root(data: Model, what: str, *, folder: bool = False) -> Path:
    """``data.root`` of a dataset read from disk: given, existing and, with ``folder``, a folder, else a
    ``DataError`` naming it; ``what`` says what it should be ("a folder of class folders")."""
    if data.root is None:
        raise DataError(f"dataset {data.dataset!r} needs data.root=<{what}>")
    root = require_path(data.root, "data.root")
    if folder and not root.is_dir():
        raise DataError(f"data.root {root} is a file; dataset {data.dataset!r} needs {what}")
    return root


def class_folder_files(root: str | Path, extensions: Iterable[str]) -> tuple[list[tuple[Path, int]], list[str]]:
    """Files under ``root/<class>/`` (searched recursively) with one of ``extensions`` (e.g. ".wav"),
    labelled by their class folder in sorted order. A missing root, no class folders, or a class folder
    without such files is a ``DataError``."""
    root = require_path(root)
    exts = {e.lower() for e in extensions}
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
    if not classes:
        raise DataError(f"{root} has no class folders")
    files = []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in exts)
        if not found:
            raise DataError(f"class folder {root / name} has no {'/'.join(sorted(exts))} files")
        files += [(p, label) for p in found]
    return files, classes


def read_image(path: Path, mode: str | None):
    """The image file at ``path`` as a PIL image converted to ``mode`` ("RGB", "L"; None: as stored). Not a
    regular file, not an image, or more pixels than PIL's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``,
    89 million: a small file that would decode into gigabytes) is a ``DataError`` naming it."""
    from PIL import Image  # here: only the image domains need it

    regular_file(path, "image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # PIL only warns up to twice its limit
            with Image.open(path) as raw:
                return raw.convert(mode) if mode else raw.copy()
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise DataError(f"{path}: more than {Image.MAX_IMAGE_PIXELS:,} pixels, the limit against decompression "
                        "bombs") from None
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: unreadable image ({error_line(err)})") from None


def check_finite_array(values: np.ndarray, source: str | Path, what: str = "sample",
                       error: type[DataError] = DataError) -> None:
    """An ``error`` naming ``source`` and the first row of ``values`` (a ``what``: a sample, a vertex) holding NaN
    or ±inf: input that is not finite is a fault of the data, which training would report as a divergence."""
    bad = ~np.isfinite(values).reshape(len(values), -1).all(1)
    if bad.any():
        row = int(bad.argmax())
        raise error(f"{source}: {what} {row} is {np.asarray(values[row]).tolist()} (the first that is not "
                        "finite); data must be finite numbers")


def read_csv(path: Path, what: str, **options):
    """A dataset's CSV file as a pandas frame (``common.files.read_table``: a regular file of at most
    ``MAX_TABLE_BYTES``, readable as CSV, else a ``DataError`` naming it); ``options`` are ``pandas.read_csv``'s."""
    return read_table(path, what, MAX_TABLE_BYTES, **options)


def check_finite(frame, columns, source: str, *, allow_missing: bool = False) -> None:
    """A ``DataError`` naming the file, the column and the first line holding NaN (unless ``allow_missing``)
    or ±inf in ``columns`` of a pandas frame read from a CSV with a header line."""
    for name in columns:
        values = frame[name].to_numpy(dtype=float)
        bad = np.isinf(values) if allow_missing else ~np.isfinite(values)
        if bad.any():
            row = int(bad.argmax())
            raise DataError(f"{source}: column {name!r} holds {values[row]} at line {row + 2} (its first non-finite value)")


def named(items: Iterable[tuple], root: Path) -> dict[str, tuple]:
    """Items whose first element is a file under ``root`` (``(path, label)``, ``(image, mask)``), keyed by
    that file's path relative to ``root``: the sample ids a ``Split`` lists."""
    return {item[0].relative_to(root).as_posix(): item for item in items}


def split_folders(root: Path) -> dict[str, Path]:
    """The split folders ``root`` ships, by split: ``train/`` with ``val/`` and/or ``test/`` beside it;
    empty when it has no ``train/`` or nothing beside it."""
    found = {split: root / split for split in SPLITS if (root / split).is_dir()}
    return found if "train" in found and len(found) > 1 else {}


def class_folder_splits(root: Path, extensions: Iterable[str]) -> tuple[dict[str, list[tuple[Path, int]]], list[str]]:
    """``class_folder_files`` of each of ``root``'s split folders (``split_folders``), labelled by the class
    folders of train/; a class folder of val/ or test/ that train/ lacks is a ``DataError``."""
    folders = split_folders(root)
    files, classes = class_folder_files(folders["train"], extensions)
    splits = {"train": files}
    for split, folder in folders.items():
        if split != "train":
            found, names = class_folder_files(folder, extensions)
            if unknown := sorted(set(names) - set(classes)):
                raise DataError(f"{folder} has class folders that train/ lacks: {', '.join(unknown)}")
            splits[split] = [(path, classes.index(names[label])) for path, label in found]
    return splits, classes
