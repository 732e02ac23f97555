"""`splatpainter session show|undo|redo|export FILE`: inspect and rewind session files.

Works on any session file (`edit --session`, or the browser editor's autosaves) without loading
the editor model: undo/redo only move the file's pointer, as the session's own undo does.
"""

from __future__ import annotations

from pathlib import Path

import typer

from appshell.cli import App, JsonFlag, print_json, status
from splatpainter.cli.app import app
from splatpainter.cli.options import write_asset

session_app = App(help="Inspect and rewind edit sessions (history, undo, redo, export).")
app.add_typer(session_app, name="session")

FILE = typer.Argument(..., metavar="FILE", help="session file (edit --session, or the web's)")


def _print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{summary['num_gaussians']} Gaussians, method {summary['method']}")
    for col in ("#", "edit", "method", "views", "changed", "seconds", ""):
        table.add_column(col, justify="right" if col in ("#", "views", "changed") else "left")
    for e in summary["entries"]:
        mark = "current" if e["current"] else ("undone" if e["undone"] else "")
        table.add_row(
            str(e["index"]),
            e["label"] or "-",
            e["method"] or "-",
            str(e["views"]),
            str(e["changed_gaussians"]),
            f"{e['seconds']:.2f}",
            mark,
        )
    Console().print(table)


@session_app.command()
def show(path: Path = FILE, json_out: JsonFlag = False) -> None:
    """List the edits of a session and which one is current."""
    from splatpainter.edit.session import StoredSession

    with status(f"reading {path}"):
        summary = StoredSession.read(path).summary()
    if json_out:
        print_json(summary)
    else:
        _print_summary(summary)


def _move(path: Path, step: int, json_out: bool) -> None:
    from splatpainter.edit.session import StoredSession

    with status(f"reading {path}"):
        stored = StoredSession.read(path)
    index = stored.move(step)
    with status(f"writing {path}"):
        stored.write()
    summary = stored.summary()
    if json_out:
        print_json({"index": index, "entry": summary["entries"][index]})
    else:
        e = summary["entries"][index]
        typer.echo(f"now at entry {index} of {stored.num_entries - 1}: {e['label'] or '-'}")


@session_app.command()
def undo(path: Path = FILE, json_out: JsonFlag = False) -> None:
    """Step back one edit (the file keeps the undone edit for redo)."""
    _move(path, -1, json_out)


@session_app.command()
def redo(path: Path = FILE, json_out: JsonFlag = False) -> None:
    """Step forward one undone edit."""
    _move(path, +1, json_out)


@session_app.command()
def export(
    path: Path = FILE,
    out: Path = typer.Argument(..., metavar="OUT", help="output .ply or .splat"),
    index: int | None = typer.Option(None, help="history entry to export (default: current)"),
    json_out: JsonFlag = False,
) -> None:
    """Write the session's current asset (or entry --index) as .ply or .splat."""
    from splatpainter.edit.session import StoredSession, ply_extras

    with status(f"reading {path}"):
        stored = StoredSession.read(path)
        i = stored.index if index is None else index
        asset = stored.asset_at(i)
    write_asset(asset, out, **ply_extras(out, stored.extras))
    if json_out:
        print_json({"out": str(out), "index": i, "num_gaussians": asset.num_gaussians})
    else:
        typer.echo(f"wrote {out} (entry {i}, {asset.num_gaussians} Gaussians)")
