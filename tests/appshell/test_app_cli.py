"""appshell.cli: expected errors -> one line + exit 2, bugs keep their traceback; options."""

import json

import pytest
import torch
from typer.testing import CliRunner

from appshell.cli import App, JsonFlag, UserError, choice_enum, parse_device, print_json

app = App(help="test app")
Colour = choice_enum("Colour", ["red", "green"])


@app.command()
def run(what: str, colour: Colour = Colour.red, json_out: JsonFlag = False) -> None:
    """Raise what the test asks for."""
    if what == "user":
        raise UserError("bad input\nsecond line")
    if what == "oserror":
        open("/nonexistent/dir/file")  # noqa: SIM115
    if what == "bug":
        raise ValueError("a plain ValueError is a bug")
    if what == "keyerror":
        raise KeyError("bug")
    if what == "interrupt":
        raise KeyboardInterrupt
    if json_out:
        print_json({"colour": colour.value, "nan": float("nan")})


@app.command()
def other() -> None:
    """A second command, so `run` stays a sub-command."""


runner = CliRunner()


def test_expected_errors_are_one_line_exit_2():
    r = runner.invoke(app, ["run", "user"])
    assert r.exit_code == 2 and r.stderr == "error: bad input\n"
    r = runner.invoke(app, ["run", "oserror"])
    assert r.exit_code == 2
    assert r.stderr == "error: /nonexistent/dir/file: No such file or directory\n"


def test_bugs_keep_their_traceback():
    for what, exc in (("bug", ValueError), ("keyerror", KeyError)):
        r = runner.invoke(app, ["run", what])
        assert r.exit_code == 1 and isinstance(r.exception, exc)


def test_interrupt_exit_130():
    r = runner.invoke(app, ["run", "interrupt"])
    assert r.exit_code == 130 and "interrupted" in r.stderr


def test_choices_as_enum_and_json():
    r = runner.invoke(app, ["run", "--help"])
    assert "<red|green>" in r.stdout and "--json" in r.stdout
    r = runner.invoke(app, ["run", "ok", "--colour", "blue"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["run", "ok", "--colour", "green", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"colour": "green", "nan": None}


def test_parse_device():
    assert parse_device("cpu") == torch.device("cpu")
    for bad in ("bogus", "cuda:x", "meta"):
        with pytest.raises(UserError, match="device"):
            parse_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="CUDA is not available"):
            parse_device("cuda")
    else:
        with pytest.raises(UserError, match="CUDA device"):
            parse_device(f"cuda:{torch.cuda.device_count()}")


def test_first_line_of_any_message():
    from appshell.errors import first_line

    assert first_line(ValueError("\n  bad input  \nmore detail")) == "bad input"
    assert first_line(ValueError("")) == "ValueError"  # no message: its type, never an IndexError
    assert first_line(RuntimeError(" \n \n")) == "RuntimeError"
