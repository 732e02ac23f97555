"""appshell.tables: one error style for every config table of both command lines."""

from dataclasses import dataclass

import pytest

from appshell.tables import check_keys, dataclass_from_table


class TableError(ValueError):
    pass


@dataclass
class Section:
    steps: int = 1
    lr: float = 1e-3
    name: str = "run"
    fast: bool = False
    kinds: tuple[str, ...] = ("a",)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("steps must be >= 1")


def test_values_are_checked_and_converted():
    s = dataclass_from_table(Section, {"steps": 3, "lr": 2, "kinds": ["x", "y"]}, "optim")
    assert s == Section(steps=3, lr=2.0, kinds=("x", "y"))
    assert isinstance(s.lr, float) and isinstance(s.kinds, tuple)
    assert dataclass_from_table(Section, {}, "optim") == Section()


@pytest.mark.parametrize(
    "table,message",
    [
        ({"stpes": 3, "lrr": 1}, "unknown key(s) optim.lrr, optim.stpes (known in [optim]: "),
        ({"steps": "many"}, "optim.steps: expected an integer, got 'many'"),
        ({"steps": True}, "optim.steps: expected an integer, got True"),
        ({"steps": 2.0}, "optim.steps: expected an integer, got 2.0"),
        ({"lr": "fast"}, "optim.lr: expected a number, got 'fast'"),
        ({"lr": False}, "optim.lr: expected a number, got False"),
        ({"name": 3}, "optim.name: expected a string, got 3"),
        ({"fast": 1}, "optim.fast: expected a boolean, got 1"),
        ({"kinds": "ab"}, "optim.kinds: expected a list, got 'ab'"),
        ({"kinds": ["a", 2]}, "optim.kinds[1]: expected a string, got 2"),
    ],
)
def test_every_problem_is_one_error_naming_the_key(table, message):
    with pytest.raises(TableError) as info:
        dataclass_from_table(Section, table, "optim", TableError)
    assert str(info.value).startswith(message), str(info.value)


def test_a_table_that_is_not_a_table_and_the_dataclass_own_checks():
    with pytest.raises(TableError, match=r"\[optim\] must be a table, got 3"):
        dataclass_from_table(Section, 3, "optim", TableError)
    with pytest.raises(ValueError, match="steps must be >= 1") as info:
        dataclass_from_table(Section, {"steps": 0}, "optim", TableError)
    assert type(info.value) is ValueError  # the dataclass's own error, unchanged


def test_check_keys_names_each_unknown_key_and_the_table_header():
    check_keys({"name": "x", "data": {}}, ("name", "data"), "phase[1]", TableError)
    with pytest.raises(TableError) as e:
        table = {"name": "x", "stpes": 3, "lr": 1}
        check_keys(table, ("name", "data"), "phase[2]", TableError, header="[[phase]]")
    want = "unknown key(s) phase[2].lr, phase[2].stpes (known in [[phase]]: data, name)"
    assert str(e.value) == want
