"""The commands' arguments (``quest <command>``, the domains' commands too): a parser whose errors are one line,
and argument types that hold their ranges, so that a wrong argument is answered as any wrong input is (exit 2,
one line) and never reaches the command as a value it cannot use (``--batches 0`` dividing by zero)."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from common.schema import MAX_SEED


class CommandParser(argparse.ArgumentParser):
    """A command's parser: ``--help`` shows its description as written (a module docstring); an error is the one
    line ``<prog>: error: <what>``, without the usage block argparse prints before it."""

    def __init__(self, prog: str, description: str | None = None):
        super().__init__(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def whole(least: int = 0, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``least`` to ``most`` (no limit when None)."""
    span = f">= {least}" if most is None else f"from {least} to {most}"

    def parse(text: str) -> int:
        digits = text.strip().removeprefix("-")
        if not digits.isdigit() or len(digits) > 20 or not least <= int(text) <= (most if most is not None else math.inf):
            raise argparse.ArgumentTypeError(f"must be a whole number {span}, got {text!r}")
        return int(text)

    return parse


positive_int = whole(1)
seed = whole(0, MAX_SEED)


def device(text: str) -> str:
    """An argparse type: where to run, as torch names it: ``cpu``, ``cuda`` or ``cuda:N`` (a GPU this machine has),
    or ``auto`` (the first GPU where there is one, else the CPU). Torch is imported only to look for a GPU."""
    kind, colon, index = text.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (colon and not (kind == "cuda" and index.isdigit() and len(index) < 4)):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")
    if kind == "cpu":
        return text
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "auto":
        return "cuda" if gpus else "cpu"
    if int(index or 0) >= gpus:
        raise argparse.ArgumentTypeError(f"{text!r} asks for a CUDA GPU that torch does not find here "
                                         f"({gpus or 'none'} found): give cpu or auto")
    return text


def number(least: float = 0.0) -> Callable[[str], float]:
    """An argparse type: a finite number of at least ``least``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < least:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {least:g}, got {text!r}")
        return value

    return parse


MAX_SHAPE_ELEMENTS = 1 << 31  # of one tensor of a benchmark's shape: 8 GiB in float32, q, k and v three times that


def shape(text: str, dims: int = 4) -> tuple[int, ...]:
    """An argparse type: ``dims`` whole numbers >= 1, comma-separated (batch,heads,tokens,head_dim), whose tensor
    holds at most ``MAX_SHAPE_ELEMENTS``."""
    parts = text.split(",")
    if len(parts) != dims or not all(part.strip().isdigit() and 0 < int(part) and len(part.strip()) <= 9 for part in parts):
        raise argparse.ArgumentTypeError(f"must be {dims} whole numbers >= 1 separated by commas "
                                         f"(batch,heads,tokens,head_dim), got {text!r}")
    found = tuple(int(part) for part in parts)
    if math.prod(found) > MAX_SHAPE_ELEMENTS:
        raise argparse.ArgumentTypeError(f"{text!r} is {math.prod(found):,} elements a tensor; at most {MAX_SHAPE_ELEMENTS:,}")
    return found


def shapes(text: str) -> list[tuple[int, ...]]:
    """An argparse type: ``shape``s separated by ';'."""
    return [shape(part) for part in text.split(";")]
