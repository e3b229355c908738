"""A run on disk: its directory, the lock that claims it, and the directory it is built in.

Locking. A run is claimed with ``fcntl.flock`` on ``.<run>.lock`` beside its directory, by ``quest train``
and by each worker of a sweep, so no two processes ever build one run at once. The kernel drops the lock
when its holder exits, however it dies, so a lock left by a killed process never blocks a rerun and
nothing has to take a stale lock over (an unlink-and-recreate takeover can let two processes in). Lock
files are never deleted: a process that opened the old file could lock it while another locks a new one.
Across hosts, Linux implements flock on NFS with NFS byte-range locks, so SLURM array tasks on different
nodes exclude each other too, and the server drops the locks of a dead node when its lease runs out
(mounted with ``nolock`` or ``local_lock``, NFS locks within one node only, as Lustre does with
``localflock``; Lustre needs its ``flock`` mount option). A filesystem that refuses locks is a one-line
error (exit 2) rather than runs made unlocked. flock belongs to an open file: a process that holds a run's
lock must not claim it again.

Building. A run is built in ``.<run>.partial`` beside its directory and ``publish``-ed when its record
is written: the finished run replaces the earlier one in two renames. A rerun that is killed, stopped or
refused therefore leaves an earlier result exactly as it was; what it built is wiped by the next attempt.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import ConfigError


def lock_path(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.lock"


def build_path(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.partial"


def final_path(build_dir: Path) -> Path:
    """The run directory that ``build_dir`` (a ``build_path``) becomes."""
    return build_dir.parent / build_dir.name.removeprefix(".").removesuffix(".partial")


@contextmanager
def claimed(run_dir: Path, wait: bool = False) -> Iterator[bool]:
    """Whether this process holds the run's lock for the ``with`` block: False when another one holds it,
    or, with ``wait``, once it has let go."""
    lock = lock_path(run_dir)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)  # written to: NFS grants exclusive locks on writable files
    except OSError as err:  # the lock file is the first thing a run writes
        raise ConfigError(f"cannot write the run directory {run_dir}: {err.strerror}") from None
    try:
        yield _lock(fd, lock, wait)
    finally:
        os.close(fd)  # drops the lock


def _lock(fd: int, lock: Path, wait: bool) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError as err:
        raise ConfigError(f"cannot lock {lock} ({err.strerror}): runs need file locks where output_dir is "
                          "(NFS with its lock service, Lustre mounted with -o flock)") from None
    return True


def in_progress(run_dir: Path) -> bool:
    """Whether another process holds the run's lock now: the run is being built, or its record is still being
    added to (a sweep's robustness step writes into it after training). Probed with a shared lock taken and
    let go at once, without creating the lock file; a worker that tries to claim the run in that instant
    finds it busy and leaves it to the sweep's next launch, which is all such a collision costs."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as err:
        raise ConfigError(f"cannot probe the lock {lock_path(run_dir)} ({err.strerror})") from None
    finally:
        os.close(fd)
    return False


def publish(build_dir: Path, run_dir: Path) -> None:
    """Put the run built in ``build_dir`` in ``run_dir``'s place, and remove the run it replaces."""
    old = run_dir.parent / f".{run_dir.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if run_dir.exists():
        run_dir.rename(old)
    build_dir.rename(run_dir)
    shutil.rmtree(old, ignore_errors=True)
