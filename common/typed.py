"""The one way the project types and checks what it reads: pydantic models, strict and closed.

Configs, sweep files, plans and records are data (``common.files`` reads them, nothing is interpolated or
executed); each is then validated as a ``Model``: every key declared with its type, default, range and meaning,
an unknown key refused (``extra="forbid"``), no coercion of a string into a number or a number into a bool
(``strict``). ``runners.config`` composes a run's config from its layers; the models here say what the result may
hold.

pydantic reports every problem at once, in its own words; the project answers with one line naming the first
(``first_problem``), in the words of the thing read (a config key, a record field, a sweep key).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, WrapValidator
from pydantic_core import PydanticCustomError

BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
LIMITS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}
TYPES = {"int": "int", "float": "float", "bool": "bool", "string": "str", "list": "list", "tuple": "list",
         "dict": "mapping", "model": "mapping", "none_required": "null", "literal": "one of its names"}


class Model(BaseModel):
    """A closed, strict, immutable model: the base of every typed thing the project reads."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=False,
                              use_attribute_docstrings=True)  # the string under a field is its description


def lookup(model: BaseModel, key: str) -> Any:
    """The value at the dotted ``key`` of ``model`` (``optim.lr``); None where it has no such key."""
    for part in key.split("."):
        model = getattr(model, part, None)
    return model


def reason(error: dict[str, Any]) -> str:
    """What is wrong, in a few words: ``must be > 0``, ``expects int``, ``choose from cosine, poly``,
    ``is not a known key``, ``is missing``."""
    kind = error["type"]
    if kind in BOUNDS:
        bound = error["ctx"][LIMITS[kind]]
        return f"must be {BOUNDS[kind]} {bound:g}" if isinstance(bound, float) else f"must be {BOUNDS[kind]} {bound}"
    if kind == "literal_error":
        return f"choose from {error['ctx']['expected'].replace(' or ', ', ').replace(chr(39), '')}"
    if kind == "extra_forbidden":
        return "is not a known key"
    if kind == "missing":
        return "is missing"
    if kind.endswith("_type") and kind.removesuffix("_type") in TYPES:
        return f"expects {TYPES[kind.removesuffix('_type')]}"
    return error["msg"][0].lower() + error["msg"][1:]


def first_problem(err: ValidationError) -> tuple[str, str, Any]:
    """The first problem of a failed validation: its dotted key (``optim.lr``; a list item's index as ``seeds.3``),
    what is wrong, and the value given there."""
    error = err.errors(include_url=False)[0]
    return ".".join(str(part) for part in error["loc"]), reason(error), error.get("input")


def said(phrase: str) -> WrapValidator:
    """A field whose every problem is said as what it takes (``phrase``: ``{key}`` and the keys validated before
    it may be filled in), rather than as the part pydantic found wrong."""
    def check(value, handler, info: ValidationInfo):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("said", phrase, {"key": info.field_name, **(info.data or {})}) from None
    return WrapValidator(check)
