"""Dataclasses from TOML / JSON tables, with one error style for both command lines.

A table (a dict) becomes a dataclass instance; an unknown key, or a value whose type does not
match the field's annotation, is one error naming the dotted key and what was expected:

    unknown key(s) optim.stpes (known in [optim]: lr, steps, ...)
    optim.lr: expected a number, got 'fast'

Checked annotations: bool, int, float (an int is accepted and converted), str and
`tuple[T, ...]` (a list is accepted); others pass unchecked.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

T = TypeVar("T")

_CHECKS: dict[Any, tuple[str, Any]] = {
    bool: ("a boolean", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _coerce(key: str, value: Any, tp: Any, error: type[Exception]) -> Any:
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise error(f"{key}: expected a list, got {value!r}")
        inner = typing.get_args(tp)[0]
        return tuple(_coerce(f"{key}[{i}]", v, inner, error) for i, v in enumerate(value))
    if tp not in _CHECKS:
        return value
    what, ok = _CHECKS[tp]
    if not ok(value):
        raise error(f"{key}: expected {what}, got {value!r}")
    return float(value) if tp is float else value


def check_keys(
    table: dict, known, name: str, error: type[Exception] = ValueError, *, header: str = ""
) -> None:
    """Refuse keys of `table` outside `known`, naming them as `name.key`.

    header: how the table is written in the file (default "[name]"; "[[phase]]" for an array).
    """
    unknown = sorted(set(table) - set(known))
    if unknown:
        keys = ", ".join(f"{name}.{k}" for k in unknown)
        where = header or f"[{name}]"
        raise error(f"unknown key(s) {keys} (known in {where}: {', '.join(sorted(known))})")


def dataclass_from_table(
    cls: type[T], table: Any, name: str, error: type[Exception] = ValueError
) -> T:
    """`cls(**table)` with every key known and every value of its field's type, else `error`.

    name: the table's dotted name in messages ("optim", "model.stage2").  Errors raised by the
    dataclass itself (its own range checks) pass through unchanged.
    """
    if not isinstance(table, dict):
        raise error(f"[{name}] must be a table, got {table!r}")
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    check_keys(table, fields, name, error)
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(f"{name}.{k}", v, hints[k], error) for k, v in table.items()})
