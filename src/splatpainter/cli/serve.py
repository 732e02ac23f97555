"""`splatpainter serve [ASSET]`: the browser editor (FastAPI + uvicorn, needs the `web` extra)."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import typer

from appshell.cli import fail, note, status
from appshell.errors import UserError
from splatpainter.cli.app import app
from splatpainter.cli.options import EditKind, EditMethod


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), so the printed URL is the real one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: cannot resolve ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror})") from None
    sock.listen(128)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@app.command()
def serve(
    asset: Path | None = typer.Argument(
        None, metavar="ASSET", help=".ply, .splat or .spz new sessions start from (default: demo)"
    ),
    host: str = typer.Option("127.0.0.1", help="interface to listen on (loopback by default)"),
    port: int = typer.Option(7860, min=0, max=65535, help="port (0: any free port)"),
    method: EditMethod = typer.Option(
        EditMethod.model, help="the editing method selected at first"
    ),
    kind: EditKind = typer.Option(EditKind.auto, help="the edit-kind hint selected at first"),
    weights: Path | None = typer.Option(
        None, help="editor weights (.safetensors or checkpoint); default: the shipped ones"
    ),
    workdir: Path | None = typer.Option(
        None, help="where sessions autosave (default: $XDG_DATA_HOME/splatpainter)"
    ),
    max_upload_mb: int = typer.Option(256, min=1, help="largest accepted upload, MiB"),
    optimize_steps: int = typer.Option(
        200, min=1, help="--method optimize: Adam steps an edit may take at most"
    ),
    optimize_seconds: float = typer.Option(
        60.0, min=0.0, help="--method optimize: seconds an edit may take at most"
    ),
    max_sessions: int = typer.Option(
        100, min=1, help="sessions kept on disk; the least recently used idle ones are deleted"
    ),
    max_disk_mb: int = typer.Option(
        10240, min=1, help="disk the sessions may use, MiB; the least recently used go first"
    ),
    allow_host: list[str] = typer.Option(
        [],
        metavar="NAME",
        help="a Host name to answer to besides the address and localhost (e.g. behind a "
        "proxy); repeatable. Other names get 421 (DNS rebinding)",
    ),
) -> None:
    """Serve the browser editor: orbit, paint, recolour, apply, undo, export."""
    try:
        import uvicorn

        from splatpainter.web import EditorBackend, ServerConfig, create_app
        from splatpainter.web.store import default_workdir
    except ImportError as e:
        raise fail(
            f"the browser editor needs the web extra ({e.name} is missing): "
            "bash scripts/setup.sh knapformer,splatpainter,web,dev"
        ) from None

    config = ServerConfig(
        workdir=workdir if workdir is not None else default_workdir(),
        asset_path=asset,
        weights=weights,
        default_method=method.value,
        default_kind=kind.value,
        max_upload_bytes=max_upload_mb << 20,
        optimize_steps=optimize_steps,
        optimize_seconds=optimize_seconds,
        max_sessions=max_sessions,
        max_disk_bytes=max_disk_mb << 20,
        allowed_hosts=tuple(allow_host),
    )
    sock = bind_socket(host, port)
    try:
        with status("loading the editor and the render kernels (compiled once, then cached)"):
            backend = EditorBackend(config)
            backend.warm_up()
        if not backend.model.trained:
            note("warning: the editor model has untrained weights; --method model edits are noise")
        web_app = create_app(config, backend)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        if not _is_loopback(bound_host):
            note(f"warning: listening on {bound_host}: anyone who can reach it can edit and upload")
        if backend.store.removed_temps:
            note(
                f"removed {len(backend.store.removed_temps)} unfinished save(s) a stopped server "
                "left behind"
            )
        typer.echo(f"serving SplatPainter on http://{shown}:{bound_port}/", err=False)
        typer.echo(f"sessions autosave to {config.workdir / 'sessions'}; Ctrl-C stops")
        server = uvicorn.Server(
            uvicorn.Config(web_app, log_level="warning", access_log=False, lifespan="off")
        )
        server.run(sockets=[sock])
    finally:
        sock.close()
