"""Every file the project reads back is data, read here with limits: a regular file only (a FIFO would hang the
reader, a link to /dev/zero fill memory), at most a size given per kind of file, UTF-8 text, JSON or YAML of
plain values (mappings, lists, strings, numbers, booleans, null) nested at most ``MAX_NESTING`` deep, integers
of at most ``MAX_DIGITS`` digits, and YAML without aliases (a few lines of ``&a [*a, *a]`` expand into
gigabytes). Nothing read is interpolated: OmegaConf would resolve a ``${...}`` (``oc.env`` copies the
environment), so a caller that builds a config from a file refuses one first (``interpolation``).

A path read from a file (a report's figure, a record's snapshot, a selection's source) is resolved by ``inside``:
it must lie, links followed, within the folder it belongs to. Every output is written by ``write_atomic``: to a
temporary file beside it, then renamed over it, so that a signal or a full disk leaves the earlier file whole.

Each problem is a ``FileError`` (a ``DataError``: exit 2) naming the file and what is wrong, in one line.
Only the standard library and PyYAML: the CLI reads its inputs before torch loads."""
from __future__ import annotations

import errno
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from common.errors import DataError, error_line

MAX_NESTING = 32  # containers in containers: a record's go 5 deep (record > trajectory > layers > layer > stat)
MAX_DIGITS = 100  # an integer's digits: seeds and steps have at most 20; Python refuses more than 4,300 with a traceback
MiB = 1 << 20
MAX_DOCUMENT_BYTES = 4 * MiB  # a file written by hand: notes, an analysis plan, anchors, a study's report
MAX_TRAINING_LOG_BYTES = 256 * MiB  # a run's CSV training log (metrics.csv): a line per logged step

KINDS = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device",
         stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}


class FileError(DataError):
    """A file that cannot be read as the data it should hold: ``path`` and ``reason``, both kept in ``args`` so
    that the error survives pickling (sweep workers)."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason

    def __reduce__(self):
        return type(self), (self.path, self.reason)


def not_regular(mode: int) -> str | None:
    """What a file of ``mode`` (``os.stat``) is when it is not a regular file: "a FIFO", "a folder", ...; else None."""
    return None if stat.S_ISREG(mode) else next((kind for test, kind in KINDS.items() if test(mode)), "a special file")


def os_reason(err: OSError, what: str) -> str:
    """An ``OSError`` on a path, in words: "no such <what>", else the system's own (Permission denied, ...)."""
    return f"no such {what}" if err.errno == errno.ENOENT else f"cannot be read ({err.strerror or err})"


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a regular file (links followed), for a library that opens it itself (PIL, soundfile,
    open3d); else a ``FileError`` saying what it is."""
    path = Path(path)
    try:
        _check(path, os.stat(path), what, None)
    except OSError as err:
        raise FileError(path, os_reason(err, what)) from None
    return path


def inside(folder: str | Path, name: str, what: str) -> Path:
    """``folder / name`` for a ``name`` read from a file, if it resolves (every link followed) inside ``folder``
    resolved; else a ``FileError``: an absolute path, a ``..`` or a link out of it is refused, never followed."""
    folder = Path(folder)
    path = folder / name
    try:
        resolved, root = path.resolve(), folder.resolve()
    except (OSError, RuntimeError, ValueError) as err:  # a link loop (RuntimeError before Python 3.13), a NUL byte
        raise FileError(path, f"cannot be resolved ({err})") from None
    if Path(name).is_absolute() or not resolved.is_relative_to(root):
        raise FileError(path, f"a {what} must lie inside {folder}; it names a path outside it")
    return path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all: into a temporary file in its folder, then
    renamed over it. A signal or a full disk leaves the earlier file as it was and no temporary file; the
    ``OSError`` names ``path``, not the temporary file."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data.encode("utf-8", "backslashreplace") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; an output is as readable as open() makes it
        os.replace(tmp, path)
    except BaseException as err:  # a signal (Stopped, KeyboardInterrupt) too: no temporary file is left behind
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _check(path: Path, info: os.stat_result, what: str, max_bytes: int | None) -> None:
    if kind := not_regular(info.st_mode):
        raise FileError(path, f"is {kind}, not a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise FileError(path, f"is {info.st_size:,} bytes; a {what} is at most {max_bytes:,}")


def read_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The contents of the regular file ``path``, at most ``max_bytes`` of them (``what`` names the kind of file in
    the errors). Opened without blocking, so a FIFO is refused at once rather than waited on."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise FileError(path, os_reason(err, what)) from None
    try:
        _check(path, os.fstat(fd), what, max_bytes)  # before a file object, which refuses a folder in its own words
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        try:
            data = file.read(max_bytes + 1)  # one more: a file that grew since it was measured
        except OSError as err:
            raise FileError(path, os_reason(err, what)) from None
    if len(data) > max_bytes:
        raise FileError(path, f"is more than {max_bytes:,} bytes; a {what} is at most that")
    return data


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """``read_bytes`` decoded as UTF-8."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileError(path, f"not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})") from None


def _digits(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"holds an integer of more than {MAX_DIGITS} digits")
    return int(text)


def parse_json(text: str, source: str | Path) -> Any:
    """The JSON value ``text`` holds (NaN and ±Infinity included, as Python writes them), plain and within the
    limits; ``source`` names where it came from in a ``FileError``."""
    try:
        value = json.loads(text, parse_int=_digits)
    except json.JSONDecodeError as err:
        raise FileError(source, f"not valid JSON ({err.msg}: line {err.lineno} column {err.colno})") from None
    except ValueError as err:  # an integer too long (_digits)
        raise FileError(source, str(err)) from None
    except RecursionError:
        raise FileError(source, f"nested more than {MAX_NESTING} deep") from None
    return plain(value, source)


def read_json(path: str | Path, what: str, max_bytes: int) -> Any:
    return parse_json(read_text(path, what, max_bytes), path)


class _Refused(yaml.YAMLError):
    """What the YAML reader refuses to build, in words."""


class _DataLoader(yaml.SafeLoader):
    """YAML's plain values, without aliases; a date stays the string it was written as (OmegaConf takes no dates)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise _Refused(f"holds a YAML alias (*{self.peek_event().anchor}); aliases are refused")
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node):
        try:
            _digits(node.value.replace("_", ""))
        except ValueError as err:
            raise _Refused(str(err)) from None
        return super().construct_yaml_int(node)


_DataLoader.add_constructor("tag:yaml.org,2002:int", _DataLoader.construct_yaml_int)
_DataLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def parse_yaml(text: str, source: str | Path) -> Any:
    """The plain value of one YAML document, within the limits (``parse_json``'s, and no aliases)."""
    try:
        value = yaml.load(text, Loader=_DataLoader)  # a safe loader: plain values only, and no aliases
    except _Refused as err:
        raise FileError(source, str(err)) from None
    except yaml.YAMLError as err:
        raise FileError(source, f"not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise FileError(source, f"nested more than {MAX_NESTING} deep") from None
    return plain(value, source)


def read_yaml(path: str | Path, what: str, max_bytes: int) -> Any:
    return parse_yaml(read_text(path, what, max_bytes), path)


def read_table(path: str | Path, what: str, max_bytes: int, **options):
    """A CSV file as a pandas frame (``options`` are ``pandas.read_csv``'s), read as ``read_bytes`` reads: a file
    that is empty, binary, not UTF-8 or not of the columns ``options`` ask for is a ``FileError`` naming it."""
    import pandas as pd  # here: the CLI's input checks run before pandas loads

    data = read_bytes(path, what, max_bytes)
    try:
        return pd.read_csv(io.BytesIO(data), **options)
    except ValueError as err:  # pandas' EmptyDataError and ParserError are ValueErrors, as is UnicodeDecodeError
        raise FileError(path, f"not a readable CSV file ({error_line(err)})") from None


SCALARS = (str, int, float, bool, type(None))


def plain(value: Any, source: str | Path, depth: int = 1) -> Any:
    """``value`` if it is made of mappings (scalar keys), lists and scalars, at most ``MAX_NESTING`` containers deep
    (``depth``: the containers ``value`` is in, itself included)."""
    if isinstance(value, (dict, list)) and depth > MAX_NESTING:
        raise FileError(source, f"nested more than {MAX_NESTING} deep")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, SCALARS):
                raise FileError(source, f"has a key of type {type(key).__name__}")
            plain(item, source, depth + 1)
    elif isinstance(value, list):
        for item in value:
            plain(item, source, depth + 1)
    elif not isinstance(value, SCALARS):
        raise FileError(source, f"holds a value of type {type(value).__name__}")
    return value


def interpolation(value: Any, where: str) -> tuple[str, str] | None:
    """Where in ``value`` (scalar, list or mapping, keys included) a string holds ``${``, and that string; None if
    nowhere. OmegaConf would resolve it: ``oc.env`` reads the environment into the config."""
    if isinstance(value, dict):
        return next(filter(None, (interpolation(key, where) or interpolation(item, f"{where}.{key}") for key, item in value.items())), None)
    if isinstance(value, list):
        return next(filter(None, (interpolation(item, where) for item in value)), None)
    return (where, value) if isinstance(value, str) and "${" in value else None
