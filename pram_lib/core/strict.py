"""The base of every spec model: unknown keys refused, and no boolean read as a number."""

from __future__ import annotations

import re
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _leaf_types(ann: Any) -> set:
    args = get_args(ann)
    return {ann} if not args else set().union(*(_leaf_types(a) for a in args if a is not ann))


DECIMAL = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"   # a number a spec may write


def _has_bool(v: Any) -> bool:
    return isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(_has_bool(x) for x in v))


def _texts(v: Any) -> list[str]:
    return [v] if isinstance(v, str) else [t for x in v for t in _texts(x)] if isinstance(v, (list, tuple)) else []


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1.0 for a float (YAML 1.1 also reads yes/no/on/off as booleans): `alpha: true`
        # would be a level nobody wrote. Every field that takes numbers (and not booleans) refuses them.
        if _has_bool(v):
            leaves = _leaf_types(cls.model_fields[info.field_name].annotation)
            if leaves & {float, int} and bool not in leaves:
                raise ValueError("true/false is not a number (YAML reads unquoted yes/no/on/off/true/false as "
                                 "booleans)")
        leaves = _leaf_types(cls.model_fields[info.field_name].annotation)
        if leaves & {float, int} and str not in leaves:
            # pydantic would read the text '1_000', 'inf', 'nan' or 'Infinity' as a number: decimal literals only
            odd = [t for t in _texts(v) if not re.fullmatch(DECIMAL, t)]
            if odd:
                raise ValueError(f"{odd[0]!r} is not a valid number: numbers are decimal literals such as 90, "
                                 "-2.5, 0.001 or 1e-3")
        if leaves <= {bool, type(None)} and not isinstance(v, (bool, type(None))):
            # pydantic would read 1, 'yes', 'on' or 'y' as true
            raise ValueError(f"{v!r} is not a boolean: write true or false")
        return v
