"""What the console shows: the project's own warnings through ``logging``; known noise silenced at its source.

Lightning's info lines (accelerator banners, tips, loop notices) and warnings about choices the presets make
on purpose (no loader workers on CPU, short epochs) or about third-party internals would bury the lines
that matter (a skipped file, a failed run). Importing this module loads nothing heavy."""
from __future__ import annotations

import io
import logging
import sys
import warnings

LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric")
KNOWN_NOISE = (
    r"Experiment logs directory .* exists",  # the run directory also holds the record and config
    r".*does not have many workers.*",
    r"The number of training batches .* is smaller than the logging interval",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",  # Lightning on torch 2.14
    r"`torch\.jit\.script` is deprecated.*",  # PyG's pooling modules, at import
    r"`training_step` returned `None`.*",  # a non-finite loss skips its step on purpose: the run ends as diverged
)
# The project's info lines that belong on the console beside its warnings: which weights a run starts from.
SHOWN_INFO = ("common.checkpoint",)


def quiet() -> None:
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message)


def show_project_warnings() -> None:
    """The CLI's logging: warnings and errors, named by the module that raised them, and ``SHOWN_INFO``'s info."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in SHOWN_INFO:
        logging.getLogger(name).setLevel(logging.INFO)


def escape_unencodable() -> None:
    """A name the system holds in bytes that are not UTF-8 (a run folder, a sweep file) reaches Python as surrogates
    (``\\udcff``), which stdout refuses under a UTF-8 locale with a ``UnicodeEncodeError``: stdout, and stderr as
    Python's own already does, print what they cannot encode as a backslash escape, so such a name is shown, never a
    traceback."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # a test's StringIO encodes nothing
            stream.reconfigure(errors="backslashreplace")
