"""The "Paper anchors" section of RESULTS.md: the paper's reported numbers beside what this framework measured on the
nearest setting it can run. The anchors file (``RESULTS/anchors.yaml``) is written by hand; the cells it marks
``measured`` are computed from the runs, so that no number is copied by hand."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import pandas as pd
from pydantic import Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from common.errors import ConfigError
from common.files import MAX_DOCUMENT_BYTES, read_yaml
from common.typed import Model, first_problem, said
from runners.results.frame import GROUP, variant_order
from runners.results.stats import estimate, half_width


class Measured(Model):
    """An anchor's cells computed from the runs."""

    table: str
    """The table of RESULTS.md: ``domain/dataset/preset``, then its protocol where it has one."""
    metrics: Annotated[list[str], Field(min_length=1)]
    variants: list[str] | None = None
    """The variants shown, in this order; None: every variant of the table."""


class Anchor(Model):
    """One entry of the anchors file: the paper's numbers beside this framework's on the nearest setting."""

    experiment: str
    paper: str
    """The paper's numbers, transcribed by hand."""
    nearest: str
    """The setting here that comes nearest."""
    agreement: str
    """How they compare, written after the numbers came out."""
    measured: Annotated[Measured | None, said(
        "is {table: <domain/dataset/preset>, metrics: [names], variants: [names] (optional)}")] = None
    see: str | None = None
    """A section of RESULTS.md with its own report, in place of ``measured``."""

    @model_validator(mode="after")
    def _one_source(self) -> Anchor:
        if (self.measured is None) == (self.see is None):
            raise PydanticCustomError("rule", "needs one of measured or see")
        return self


def read_anchors(path: Path) -> list[Anchor]:
    """The entries of an anchors file (``anchor_section``), read as data (``common.files``) and validated, else a
    ``ConfigError`` naming the file and the entry."""
    found = read_yaml(path, "anchors file", MAX_DOCUMENT_BYTES)
    try:
        return TypeAdapter(list[Anchor]).validate_python(found)
    except ValidationError as err:
        key, why, _ = first_problem(err)
        index, _, field = key.partition(".")
        if not field and err.errors()[0]["type"] in ("list_type", "model_type"):
            raise ConfigError(f"{path}: the anchors are a YAML list of mappings (experiment, paper, nearest, "
                              "agreement, and measured or see)") from None
        name = found[int(index)].get("experiment", "?")
        raise ConfigError(f"{path}: anchor {name!r}: {f'{field} {why}' if field else why}") from None


def anchor_section(runs: pd.DataFrame | None, anchors: Sequence[Anchor], source: str) -> list[str]:
    """"Paper anchors": per entry of ``anchors``, the paper's numbers beside this framework's on the nearest setting
    it runs, the measured cells computed here from the runs so that no number is copied by hand; a table or metric
    the runs lack is a ``ConfigError``."""
    rows = [{"paper experiment": anchor.experiment, "paper": anchor.paper, "nearest setting here": anchor.nearest,
             "measured here": (f"see “{anchor.see}”" if anchor.see is not None else _measured(runs, anchor.measured, source)),
             "agreement": anchor.agreement} for anchor in anchors]
    return ["## Paper anchors", "", f"The paper's reported numbers beside what this framework measured on the nearest "
            f"setting it can run (entries: `{source}`; measured cells computed from the runs above).", "",
            pd.DataFrame(rows).to_markdown(index=False), ""]


def _measured(runs: pd.DataFrame | None, where: Measured, source: str) -> str:
    key = tuple(where.table.split("/"))
    key += ("",) * (len(GROUP) == len(key) + 1)  # domain/dataset/preset[/protocol]
    group = None if runs is None or len(key) != len(GROUP) else runs[(runs[GROUP] == pd.Series(key, index=GROUP)).all(axis=1)]
    if group is None or group.empty:
        raise ConfigError(f"{source}: no runs make the table {where.table!r}")
    ok = group[group["status"] == "ok"]
    if lacking := [m for m in where.metrics if m not in ok or ok[m].isna().all()]:
        raise ConfigError(f"{source}: table {where.table!r} has no metric {', '.join(lacking)}")
    cells = []
    for variant in where.variants or variant_order(ok["variant"]):
        values = ok[ok["variant"] == variant]
        cells.append(f"{variant}: " + ", ".join(f"{m} {estimate(values[m].mean(), half=half_width(values[m]))}"
                                                for m in where.metrics))
    return "<br>".join(cells)
