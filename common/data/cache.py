"""An on-disk cache for generated or featurised datasets, keyed by ``short_hash`` (``cached``)."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.errors import DataError
from common.files import regular_file

log = logging.getLogger(__name__)


def short_hash(content: Any, length: int = 10) -> str:
    """A short, stable hex digest of JSON-able ``content`` (anything else by its ``repr``): cache keys."""
    text = json.dumps(content, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:length]


UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG)  # a folder the user gave
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def refused_global(err: pickle.UnpicklingError) -> str | None:
    """The global that ``torch.load(weights_only=True)`` refused to build (a file that would have run code),
    or None where the file is simply not one torch wrote."""
    # torch's wordings: "Unsupported global: GLOBAL os.system", "unsupported GLOBAL posix.system whose module ..."
    found = re.search(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)", str(err))
    return found[1] if found else None


def cached(path: str | Path, build: Callable[[], Any]) -> Any:
    """What ``build()`` returns, kept at ``path``: read back when the file is there, else built and saved
    atomically, through a temporary file beside it, so concurrent runs never read half a file (a folder that
    cannot be written, or a full disk, is the user's to fix: ``cache_dir``, named in one line). Delete the file
    to rebuild.

    A cache folder may be shared (a cluster's), so its files are data, never code: they hold tensors and
    plain containers only, are read with ``weights_only=True``, and carry the file's own name as their key
    (the callers' names hold a hash of what went into them). A file that does not load, or whose key is
    another file's, is rebuilt with a logged line, never trusted."""
    path = Path(path)
    if path.exists():
        try:
            saved = torch.load(regular_file(path, "cache file"), map_location="cpu", weights_only=True)
            if isinstance(saved, dict) and saved.get("key") == path.name and "value" in saved:
                return saved["value"]
            problem = "made for another key"
        except Exception as err:  # truncated by a killed run, an older format, objects other than tensors, a FIFO
            problem = f"unreadable: {type(err).__name__}"
        log.warning("rebuilding the cache %s (%s)", path, problem)
    obj = build()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as file:  # torch writes through Python's file: a full disk is an OSError here
            torch.save({"key": path.name, "value": obj}, file)
        os.replace(tmp, path)
    except OSError as err:
        if err.errno not in UNWRITABLE + FULL:
            raise
        raise DataError(f"cannot write the cache file {path} ({err.strerror}); point cache_dir= at a writable "
                        "folder with space") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return obj
