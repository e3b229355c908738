"""The public API the docs site's reference renders says what each of its arguments is: every public function,
class and method of common.attention, common.patch, common.registry and common.task has a docstring that names each
parameter, itself or through the thing it points to ("as for ``QKFold``") or the base method it overrides. A method
with a library's own signature (Lightning's hooks, torch's ``MultiheadAttention.forward``) is the library's to
document."""
import dataclasses
import importlib
import inspect
import pkgutil
import re

import pytest

import common.attention

MODULES = [f"common.attention.{m.name}" for m in pkgutil.iter_modules(common.attention.__path__)] + [
    "common.patch", "common.registry", "common.task"]
POINTER = re.compile(r"as for\s+``([\w.]+)``")


def public(module):
    """(qualified name, function, the class it is a method of or None) of every public callable defined here."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj, None
        elif inspect.isclass(obj) and not dataclasses.is_dataclass(obj):  # a dataclass's fields say its arguments
            if "__init__" in vars(obj):
                yield name, obj, None
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(inspect.unwrap(member)):
                    yield f"{name}.{attr}", member, obj


def own_project(cls) -> bool:
    return cls.__module__.split(".")[0] in ("common", "domains", "runners")


def library_signature(owner, name: str, params: list[str]) -> bool:
    """Whether ``owner.name`` overrides a library method of the same arguments, or a Lightning hook taking any."""
    for base in owner.__mro__[1:]:
        if own_project(base) or name not in vars(base):
            continue
        theirs = inspect.signature(vars(base)[name]).parameters
        if [p for p in theirs if p != "self"] == params:
            return True
        return name != "forward" and any(p.kind is p.VAR_POSITIONAL for p in theirs.values())
    return False


def docs(module, obj, owner) -> str:
    """The docstrings that may name ``obj``'s arguments: its own, its class's, the project base methods it
    overrides, and whatever they point to."""
    found = [inspect.getdoc(obj) or ""]
    if owner is not None:
        found.append(inspect.getdoc(owner) or "")
        found += [inspect.getdoc(vars(base)[obj.__name__]) or "" for base in owner.__mro__[1:]
                  if own_project(base) and obj.__name__ in vars(base)]
    for target in POINTER.findall(" ".join(found)):
        pointed = module
        for part in target.split("."):
            pointed = getattr(pointed, part, None)
        found.append(inspect.getdoc(pointed) or "" if pointed is not None else "")
    return " ".join(found)


@pytest.mark.parametrize("name", MODULES)
def test_every_public_argument_is_documented(name):
    module = importlib.import_module(name)
    missing = []
    for qualname, obj, owner in public(module):
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(f"{qualname}: no docstring")
            continue
        function = obj.__init__ if inspect.isclass(obj) else inspect.unwrap(obj)
        params = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
        if owner is not None and library_signature(owner, obj.__name__, params):
            continue
        text = docs(module, obj, owner)
        missing += [f"{qualname}({p})" for p in params if not re.search(rf"(?<!\w){re.escape(p)}(?!\w)", text)]
    assert not missing, f"{name}: undocumented: {', '.join(missing)}"
