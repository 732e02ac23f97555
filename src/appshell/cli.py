"""The CLI layer both command lines are built on.

- `App`: a typer app whose commands run inside `handle_errors`: an expected error (bad input,
  a file problem) becomes ``error: <one line>`` on stderr and exit code 2; anything else is a
  bug and keeps its traceback.
- `JsonFlag`, `DeviceOption`: shared options, declared once.
- `choice_enum`: choices as an Enum, so ``--help`` lists them and typer rejects others.
- `progress` / `status` (from `appshell.progress`): progress on stderr for anything that can
  take more than ~2 s.
- `print_json`: the ``--json`` output (one JSON document on stdout).
"""

from __future__ import annotations

import enum
import functools
import json
import math
from collections.abc import Callable, Iterable
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from appshell.errors import UserError
from appshell.progress import Bar, progress, status

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _click_exceptions(name: str) -> tuple[type[BaseException], ...]:
    """The class `name` of click and of typer's vendored click (typer >= 0.2x ships its own)."""
    import importlib

    found = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if cls is not None:
            found.append(cls)
    return tuple(found)


def is_expected(exc: BaseException) -> bool:
    """Expected errors: OS/file errors and the ValueError subclasses code raises for bad input.

    A plain ValueError, TypeError, IndexError, ... is treated as a bug and keeps its traceback.
    """
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, ValueError) and type(exc) is not ValueError


def one_line(exc: BaseException) -> str:
    """The message of an expected error on one line (OSErrors name their file)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        msg = f"{exc.filename}: {exc.strerror or exc}"
        if exc.filename2 is not None:
            msg += f" (-> {exc.filename2})"
        return msg
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` and return the Exit to raise (``raise fail(...)``)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: expected errors -> one line + exit 2; Ctrl-C -> exit 130; bugs re-raise."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            if isinstance(exc, _click_exceptions("ClickException")) or not is_expected(exc):
                raise
            raise fail(one_line(exc)) from None

    return wrapper


class OneLineErrorsGroup(TyperGroup):
    """A command group whose usage errors (bad option values, missing options) are one line.

    click prints usage, a hint and the error on three lines; this prints
    ``error: <message> (see 'CMD --help')`` with the same exit code (2).
    """

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:  # fmt: skip
        import sys

        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except _click_exceptions("ClickException") as e:
            if isinstance(e, _click_exceptions("NoArgsIsHelpError")):
                e.show()  # type: ignore[attr-defined]
                sys.exit(e.exit_code)  # type: ignore[attr-defined]
            msg = e.format_message()  # type: ignore[attr-defined]
            ctx = getattr(e, "ctx", None)
            if isinstance(e, _click_exceptions("UsageError")) and ctx is not None:
                msg += f" (see '{ctx.command_path} --help')"
            typer.echo(f"error: {msg}", err=True)
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        except _click_exceptions("Abort"):
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


class App(typer.Typer):
    """typer.Typer with the shared settings; every command runs inside `handle_errors`."""

    def __init__(self, *, help: str, **kwargs: Any) -> None:
        kwargs.setdefault("cls", OneLineErrorsGroup)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("rich_markup_mode", None)
        super().__init__(help=help, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        register = super().command(*args, **kwargs)

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            register(handle_errors(fn))
            return fn

        return decorator

    def add_version_command(self, version: str) -> None:
        """A ``version`` command (``--json`` too), the same in every program."""

        def show_version(json_out: JsonFlag = False) -> None:
            """Print the installed version."""
            if json_out:
                print_json({"version": version})
            else:
                typer.echo(version)

        self.command("version")(show_version)


# ------------------------------------------------------------------ shared options
JsonFlag = Annotated[
    bool,
    typer.Option(
        "--json", help="Print the result as JSON on stdout (progress and notes go to stderr)."
    ),
]
DeviceOption = Annotated[
    str, typer.Option(metavar="DEVICE", help="Torch device: cpu, cuda or cuda:N.")
]


def choice_enum(name: str, values: Iterable[str]) -> type[enum.Enum]:
    """A str Enum whose members are the given values, for typer options with fixed choices."""
    return enum.Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


def parse_device(text: str, option: str = "--device") -> Any:
    """torch.device for text; UserError for unknown devices or CUDA/MPS that is not there."""
    import torch

    try:
        dev = torch.device(text.strip())
    except (RuntimeError, ValueError):
        raise UserError(f"{option}: unknown device {text!r} (use cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = (
                "without CUDA" if torch.version.cuda is None else f"with CUDA {torch.version.cuda}"
            )
            raise UserError(
                f"{option} {text}: CUDA is not available (torch {torch.__version__} built {built})"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise UserError(f"{option} {text}: only {count} CUDA device(s) here")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise UserError(f"{option} {text}: MPS is not available on this machine")
    elif dev.type != "cpu":
        raise UserError(f"{option}: unsupported device {text!r} (use cpu, cuda or cuda:N)")
    return dev


# ------------------------------------------------------------------ output
def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def print_json(obj: Any, *, indent: int | None = 2) -> None:
    """The --json output: strict JSON (non-finite floats become null) on stdout."""
    typer.echo(json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False))


def note(message: str) -> None:
    """A human note on stderr (keeps stdout clean for --json)."""
    typer.echo(message, err=True)


__all__ = [
    "EXIT_USAGE",
    "App",
    "Bar",
    "DeviceOption",
    "JsonFlag",
    "UserError",
    "choice_enum",
    "fail",
    "handle_errors",
    "is_expected",
    "note",
    "one_line",
    "parse_device",
    "print_json",
    "progress",
    "status",
]
