"""Dataclasses from TOML / JSON tables, with one error style for both command lines.

A table (a dict) becomes a dataclass instance; an unknown key, or a value whose type does not
match the field's annotation, is one error naming the dotted key and what was expected:

    unknown key(s) optim.stpes (known in [optim]: lr, steps, ...)
    optim.lr: expected a number, got 'fast'

Checked annotations: bool, int, float (an int is accepted and converted), str and
`tuple[T, ...]` (a list is accepted); others pass unchecked.

A numeric field may also carry a range (`limited(default, gt=0)` as its default): NaN and the
infinities are refused wherever a range is given, so every config table states its limits next
to its fields and one function (`check_limits`) enforces them:

    config key 'train.lr': must be a finite number > 0, got inf
"""

from __future__ import annotations

import dataclasses
import math
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
    cls: type[T],
    table: Any,
    name: str,
    error: type[Exception] = ValueError,
    *,
    label: str = "{key}",
) -> T:
    """`cls(**table)` with every key known, every value of its field's type and within its
    field's `limited` range, else `error`.

    name: the table's dotted name in messages ("optim", "model.stage2"); label: how a range
    error names the key (see `check_limits`). Errors raised by the dataclass itself (its own
    checks) pass through unchanged.
    """
    if not isinstance(table, dict):
        raise error(f"[{name}] must be a table, got {table!r}")
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    check_keys(table, fields, name, error)
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(f"{name}.{k}", v, hints[k], error) for k, v in table.items()}
    # Ranges first: the dataclass's own checks may divide by, or allocate from, these values.
    _check_values(cls, values, name, error, label)
    obj = cls(**values)
    check_limits(obj, name, error, label=label)
    return obj


# ------------------------------------------------------------------ ranges
@dataclasses.dataclass(frozen=True)
class Limits:
    """The allowed range of a numeric field (any bound may be None). A value outside it, NaN
    or an infinity is refused: a range says the field is a real quantity."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def violation(self, value: Any) -> str | None:
        """Why `value` is out of range (None: it is in range)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None  # the type check names wrong types
        ok = isinstance(value, int) or math.isfinite(value)
        ok = ok and (self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
        ok = ok and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le)
        return None if ok else self.describe(isinstance(value, float))

    def describe(self, real: bool) -> str:
        low = ("(", self.gt) if self.gt is not None else ("[", self.ge)
        high = (")", self.lt) if self.lt is not None else ("]", self.le)
        if low[1] is not None and high[1] is not None:
            return f"must be in {low[0]}{_num(low[1])}, {_num(high[1])}{high[0]}"
        what = "a finite number " if real else ""
        if low[1] is not None:
            return f"must be {what}{'>' if low[0] == '(' else '>='} {_num(low[1])}"
        if high[1] is not None:
            return f"must be {what}{'<' if high[0] == ')' else '<='} {_num(high[1])}"
        return "must be a finite number"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def limited(
    default: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A dataclass field with `default` and a range that `check_limits` enforces."""
    return dataclasses.field(default=default, metadata={"limits": Limits(gt, ge, lt, le)})


def check_limits(
    obj: Any, name: str, error: type[Exception] = ValueError, *, label: str = "{key}"
) -> None:
    """Raise `error` for the first field of dataclass `obj` outside its `limited` range.

    label: how the key appears in the message, a format string of `key` (the dotted
    `name.field`), e.g. "config key '{key}'".
    """
    _check_values(
        obj, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, name, error, label
    )


def _check_values(cls: Any, values: dict, name: str, error: type[Exception], label: str) -> None:
    """Raise `error` for the first of `values` outside its field's `limited` range."""
    for f in dataclasses.fields(cls):
        lim = f.metadata.get("limits")
        if lim is None or f.name not in values:
            continue
        value = values[f.name]
        why = lim.violation(value)
        if why is not None:
            raise error(f"{label.format(key=f'{name}.{f.name}')}: {why}, got {value!r}")
