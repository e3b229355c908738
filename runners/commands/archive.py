"""`quest archive <runs dir> <folder>`: a sweep's records, launch log and choices, small enough to commit.

Each ``record.json`` is copied with its probe trajectory thinned to 17 steps (the first, the initial sharpness,
and the last included); the launch logs (``launches.jsonl``) and a tuned protocol's ``selection.json`` are copied
as they are, all in the same layout, so ``quest aggregate <folder>`` and ``quest select <folder>`` read the copy
as they read the runs. Checkpoints, training logs and caches are not copied. A run whose lock another process
holds is left out: its record may not be finished (a sweep adds robustness to a record after training);
archive again once the sweep has moved on. A file that is a link out of the runs folder is left out and named
(counted with the damaged records): an archive is committed, and holds only what lies in the folder. Each file
is written whole (``common.files.write_atomic``), so an archive stopped or out of disk keeps its earlier copy.
"""
from __future__ import annotations

from pathlib import Path

from common.arguments import CommandParser
from common.errors import Stopped
from runners.runs.export import archive


def main(argv: list[str]) -> int:
    parser = CommandParser("quest archive", __doc__)
    parser.add_argument("runs", type=Path, help="a sweep's output folder")
    parser.add_argument("folder", type=Path, help="where the copy goes (e.g. RESULTS/records/<sweep>)")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        parser.error(f"{args.runs} is not a folder")
    if args.folder.exists() and not args.folder.is_dir():
        parser.error(f"{args.folder} is a file; the copy goes into a folder")
    with Stopped.on_signals():  # a signal stops it in one line, each file copied whole or not at all
        records, others, busy, damaged = archive(args.runs, args.folder)
    print(f"archive: {records} records and {others} launch logs and choices -> {args.folder}")
    if busy:
        print(f"archive: {busy} runs still in progress left out; archive again once they finish")
    if damaged:
        print(f"archive: {damaged} damaged records left out (each named above)")
    return 0
