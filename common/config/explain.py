"""Every field of the experiment file with its description, default and allowed values
(`rlfleet config --explain [FIELD]`), read from the pydantic models themselves."""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlfleet.common.algorithms.registry import config_classes
from rlfleet.common.config.experiment import Experiment


class UnknownField(ValueError):
    """No field has that name; the message lists the closest ones."""


@dataclass(frozen=True)
class FieldDoc:
    path: str  # dotted, as --set takes it; list items as N (replay.tables.N.capacity), the algorithm's by name
    default: str
    allowed: str
    description: str

    def text(self) -> str:
        lines = [self.path, f"  default: {self.default}", f"  allowed: {self.allowed}"]
        if self.description:
            lines.insert(1, f"  {self.description}")
        return "\n".join(lines)


def _models(ann: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, its Optional's, a list's items."""
    args = typing.get_args(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in args for m in _models(a)]


def _is_list(ann: Any) -> bool:
    origin = typing.get_origin(ann)
    return origin in (list, tuple) or any(_is_list(a) for a in typing.get_args(ann)
                                          if typing.get_origin(ann) in (typing.Union, types.UnionType))


def _allowed(info: FieldInfo) -> str:
    ann = info.annotation
    bounds = []
    for m in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign} {getattr(m, attr)}")
        if getattr(m, "pattern", None):
            bounds.append(f"matching {m.pattern}")
    name = _type_name(ann)
    return name + (f" ({', '.join(bounds)})" if bounds else "")


def _type_name(ann: Any) -> str:
    """int, float | null, barrier | async, list[int], ..."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.default is not PydanticUndefined:
        value = info.default
    elif info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    else:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(a section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} item(s): {', '.join(str(getattr(v, 'name', '?')) for v in value)}"
    return "null" if value is None else repr(value)


def describe(model: type[BaseModel], prefix: str = "") -> list[FieldDoc]:
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        if model is Experiment and name == "algorithm":
            for cls in config_classes():
                out += describe(cls, f"algorithm[{cls.model_fields['name'].default}].")
            continue
        out.append(FieldDoc(path, _default(info), _allowed(info), info.description or ""))
        for sub in _models(info.annotation):
            out += describe(sub, f"{path}.N." if _is_list(info.annotation) else f"{path}.")
    return out


def explain(field: str | None = None) -> list[FieldDoc]:
    """Every field, or those of ``field`` (a field, or a section: every field under it). ``algorithm.lr``
    matches each algorithm's ``lr``; UnknownField names the closest fields."""
    docs = describe(Experiment)
    if field is None:
        return docs

    def plain(path: str) -> str:  # algorithm[dqn].lr -> algorithm.lr
        return path.split("[", 1)[0] + path.split("]", 1)[1] if "[" in path else path

    want = field.strip(".")
    hits = [d for d in docs if want in (d.path, plain(d.path)) or d.path.startswith(want + ".")
            or plain(d.path).startswith(want + ".")]
    if not hits:
        close = difflib.get_close_matches(want, sorted({plain(d.path) for d in docs}), n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `rlfleet config --explain` lists every field"
        raise UnknownField(f"no config field {want!r}{hint}")
    return hits
