"""Where the language domain's text comes from: each loader returns a ``Corpus``: per split, the byte
ranges of files (``Document``) whose concatenation is that split, not read yet (so a byte cap reads only
what it keeps), and how the split was made (``source`` and ``rule`` for the run record).

- ``stdlib`` (embedded default): the ``*.py`` sources of the running Python's standard library
  (``sysconfig.get_paths()["stdlib"]``), without ``site-packages``/``dist-packages`` (installed packages
  differ between machines) and without test folders (``test``, ``tests``, ``idle_test``: 19 of the 31 MB
  in Python 3.11, repetitive test code that would dominate the corpus): 734 files, 12.1 MB in 3.11.7. The
  same on every machine with the same Python version.
- ``text``: a UTF-8 file or a folder of files (searched recursively; hidden and empty files skipped).
- ``enwik8`` / ``text8``: the file itself or its folder, split as is standard (first 90%, next 5%,
  last 5% of its bytes: 90M/5M/5M for the 100M-byte file).
- ``wikitext103``: the folder holding ``wiki.train.raw``, ``wiki.valid.raw`` and ``wiki.test.raw``.

Folders (``stdlib`` and a ``text`` folder) are split by document with a rule that needs no seed: a
document's split is decided by the hash of its path relative to the root (``short_hash``, mapped to
[0, 1) and compared with ``data.split``), and a split's documents follow each other in hash order, so
a byte cap keeps a spread of documents instead of the first ones alphabetically. A single ``text``
file is split by position at the ``data.split`` fractions, each cut moved to the next line end.
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from common.data import SPLITS, DataError, check_fractions, data_root, require_path, short_hash

from .config import Data

STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
WIKITEXT_FILES = {"train": "wiki.train.raw", "val": "wiki.valid.raw", "test": "wiki.test.raw"}
Splits = dict[str, list["Document"]]


class Corpus(NamedTuple):
    splits: Splits
    source: str  # shipped | random | ordered, as common.data.Split has it
    rule: str


@dataclass(frozen=True)
class Document:
    """Bytes [start, stop) of a file (stop None: to its end). ``name`` identifies it in the run record's
    split membership: its path relative to the dataset root, and the range when it is part of a file."""

    path: Path
    name: str
    start: int = 0
    stop: int | None = None

    def read(self, limit: int | None = None) -> bytes:
        """At most ``limit`` bytes from the start of the range."""
        size = None if self.stop is None else self.stop - self.start
        if limit is not None:
            size = limit if size is None else min(size, limit)
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read(-1 if size is None else size)


def stdlib(data: Data) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in STDLIB_SKIP)
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return by_document(root, files, data.split)


def text(data: Data) -> Corpus:
    path = data_root(data, "a UTF-8 text file or a folder of text files")
    if path.is_file():
        return by_position(_non_empty(path), data.split)
    files = [p for p in path.rglob("*") if p.is_file() and p.stat().st_size > 0
             and not any(part.startswith(".") for part in p.relative_to(path).parts)]
    if not files:
        raise DataError(f"text data folder {path} has no non-empty files")
    return by_document(path, files, data.split)


def standard_split(data: Data) -> Corpus:
    """enwik8 or text8, as ``data.dataset`` names it: the file of that name (``root`` itself, or in the
    folder ``root``), 90/5/5% by position."""
    file_name = data.dataset
    path = data_root(data, f"the {file_name} file or its folder")
    path = _non_empty(require_path(path / file_name, f"{file_name} file") if path.is_dir() else path)
    size = path.stat().st_size
    held_out = size // 20
    cuts = (0, size - 2 * held_out, size - held_out, size)
    return Corpus(_ranges(path, cuts), "shipped", f"{file_name}: the benchmark's first 90% / next 5% / last 5% "
                  "of the bytes")


def wikitext103(data: Data) -> Corpus:
    root = data_root(data, "the folder holding wiki.train.raw, wiki.valid.raw, wiki.test.raw", folder=True)
    paths = {s: _non_empty(require_path(root / name, f"WikiText-103 {s} file")) for s, name in WIKITEXT_FILES.items()}
    return Corpus({s: [Document(p, p.name)] for s, p in paths.items()}, "shipped", "WikiText-103: "
                  + ", ".join(WIKITEXT_FILES.values()))


def by_document(root: Path, files: list[Path], fractions) -> Corpus:
    """Each file goes to the split that the hash of its relative path falls into; hash order within a split."""
    shares = check_fractions(fractions)
    names = {p: p.relative_to(root).as_posix() for p in files}
    keyed = sorted((int(short_hash(name, 8), 16) / 16**8, name, p) for p, name in names.items())
    splits: Splits = {s: [] for s in SPLITS}
    for u, name, path in keyed:
        split = "train" if u < shares[0] else "val" if u < shares[0] + shares[1] else "test"
        splits[split].append(Document(path, name))
    return Corpus(splits, "random", f"by document: short_hash of the path relative to {root.name}/ as a number in "
                  f"[0, 1) against fractions {'/'.join(f'{x:g}' for x in shares)} (no seed)")


def by_position(path: Path, fractions) -> Corpus:
    """One file cut at the fractions, each cut moved forward to just after the next newline."""
    content = path.read_bytes()
    cuts, total = [0], 0.0
    for fraction in check_fractions(fractions)[:2]:
        total += fraction
        line_end = content.find(b"\n", max(cuts[-1], int(total * len(content))))
        cuts.append(len(content) if line_end < 0 else line_end + 1)
    rule = f"{path.name}: fractions {'/'.join(f'{x:g}' for x in fractions)} of the bytes in order, cut at line ends"
    return Corpus(_ranges(path, (*cuts, len(content))), "ordered", rule)


def _ranges(path: Path, cuts: tuple[int, ...]) -> Splits:
    return {s: [Document(path, f"{path.name} bytes {a}-{b}", a, b)] for s, a, b in zip(SPLITS, cuts, cuts[1:])}


def _non_empty(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"{path} is not a file")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty")
    return path
