"""The base of every spec model: unknown keys refused, and no boolean read as a number."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _leaf_types(ann: Any) -> set:
    args = get_args(ann)
    return {ann} if not args else set().union(*(_leaf_types(a) for a in args if a is not ann))


def _has_bool(v: Any) -> bool:
    return isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(_has_bool(x) for x in v))


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
        return v
