"""The FastAPI app behind `splatpainter serve`: the page, frames rendered by the project's
renderer, edits, history, uploads and downloads.

Every frame is rendered on the server with `splatpainter.render` (the compiled numba kernels,
compiled once and reused) and sent as JPEG while the user drags and as PNG when the view rests;
the page paints on that exact PNG, and an edit names the view by the same orbit parameters, so
the server fits it on the very pixels the user painted on.  Bad requests get a 4xx whose JSON
`detail` is one readable sentence; the server keeps running.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response

from appshell.errors import first_line
from appshell.inputs import InputFileError, loads_json
from splatpainter import __version__
from splatpainter.web.store import METHODS, Busy, NotFound, SessionError, SessionStore
from splatpainter.web.views import (
    OrbitView,
    WebInputError,
    decode_data_url,
    decode_image,
    encode_image,
    orbit_camera,
)

STATIC = Path(__file__).resolve().parent / "static"
MiB = 1 << 20
APPLY_BODY_LIMIT = 64 * MiB  # two 2048x2048 PNGs (at most ~12.6 MB each) as base64, and more


@dataclass
class ServerConfig:
    """What `splatpainter serve` passes in (see its --help)."""

    workdir: Path
    asset_path: Path | None = None  # new sessions start from it; None: the shipped demo asset
    weights: Path | None = None
    default_method: str = "model"
    default_kind: str = "auto"
    max_upload_bytes: int = 256 * MiB
    max_gaussians: int = 4_000_000
    optimize_steps: int = 200
    optimize_seconds: float = 60.0
    max_live_sessions: int = 8


class EditorBackend:
    """The loaded model, the default asset and the session store (one per app)."""

    def __init__(self, config: ServerConfig) -> None:
        from splatpainter.io import load_asset
        from splatpainter.model.editor import load_editor
        from splatpainter.model.stage2 import EDIT_HINTS

        if config.default_method not in METHODS:
            raise WebInputError(
                f"method must be one of {', '.join(METHODS)}, got {config.default_method!r}"
            )
        if config.default_kind not in EDIT_HINTS:
            raise WebInputError(
                f"kind must be one of {', '.join(EDIT_HINTS)}, got {config.default_kind!r}"
            )
        self.config = config
        self.kinds = EDIT_HINTS
        if config.asset_path is None:
            from splatpainter.assets.demo import demo_ply_path

            self.asset_name = "demo.ply"
            self.asset = load_asset(demo_ply_path())
        else:
            self.asset_name = Path(config.asset_path).name
            self.asset = load_asset(config.asset_path)
        self.model = load_editor(config.weights)
        self.store = SessionStore(
            config.workdir, self.model_method, max_live=config.max_live_sessions
        )
        self.render_slots = threading.BoundedSemaphore(2)  # stale frames wait, never pile up

    def model_method(self):
        from splatpainter.edit import ModelMethod

        return ModelMethod(self.model, kind=self.config.default_kind)

    def method_for(self, live, name: str, kind: str):
        """The method an apply request names (the model is the session's own, with its state)."""
        from splatpainter.edit import BackprojectMethod, OptimizeMethod

        if name == "model":
            live.session.method.kind = kind  # the hint may change between edits
            return live.session.method
        if name == "backproject":
            return BackprojectMethod()
        return OptimizeMethod(
            steps=self.config.optimize_steps, time_budget=self.config.optimize_seconds
        )

    def render(self, live, view: OrbitView) -> torch.Tensor:
        from splatpainter.render import render

        cam = orbit_camera(view, live.centre, live.radius)
        asset = live.session.asset  # one reference: an edit finishing meanwhile swaps it whole
        with self.render_slots, torch.no_grad():
            return render(asset, cam, background=live.session.method.background).rgb

    def warm_up(self) -> None:
        """Compile (first run) or load the cached render kernels before the first request."""
        from splatpainter.camera import orbit_cameras
        from splatpainter.render import render

        small = self.asset.subset(slice(0, min(2000, self.asset.num_gaussians)))
        with torch.no_grad():
            render(small, orbit_cameras(small, 1, width=32, height=32)[0])


def parse_asset_bytes(data: bytes, filename: str, max_gaussians: int):
    """An uploaded .ply/.splat, checked as any asset file is (then validated)."""
    from splatpainter.io import AssetFormatError, ply_from_bytes, splat_from_bytes

    ext = Path(filename).suffix.lower()
    if ext not in (".ply", ".splat"):
        raise WebInputError(f"{filename!r}: unknown asset format; upload a .ply or .splat file")
    source = Path(filename).name
    asset = ply_from_bytes(data, source)[0] if ext == ".ply" else splat_from_bytes(data, source)
    try:
        asset.validate()
    except ValueError as e:
        raise AssetFormatError(f"{source}: {e}") from None
    if asset.num_gaussians == 0:
        raise WebInputError(f"{source}: the asset has no Gaussians")
    if asset.num_gaussians > max_gaussians:
        raise WebInputError(
            f"{source}: {asset.num_gaussians} Gaussians; this server takes at most {max_gaussians}"
        )
    return asset


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise HTTPException(413, f"upload too large: over the {limit // MiB} MiB limit")
        except ValueError:
            raise HTTPException(400, "invalid Content-Length header") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"upload too large: over the {limit // MiB} MiB limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = loads_json(body, source="request body")
    except InputFileError as e:
        raise WebInputError(str(e)) from None
    if not isinstance(data, dict):
        raise WebInputError("request body must be a JSON object")
    return data


def create_app(config: ServerConfig, backend: EditorBackend | None = None) -> FastAPI:
    """The app; `backend` may be shared (tests build it once)."""
    be = backend or EditorBackend(config)
    store = be.store
    app = FastAPI(title="SplatPainter", version=__version__, docs_url=None, redoc_url=None)
    app.state.backend = be

    # ------------------------------------------------------------------ errors -> 4xx
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "path"))
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: NotFound):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Busy)
    async def _busy(request: Request, exc: Busy):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(SessionError)
    async def _session(request: Request, exc: SessionError):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, exc: ValueError):
        # AssetFormatError, CameraError, EditInputError, RenderError, WebInputError
        return JSONResponse({"detail": first_line(exc)}, status_code=400)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError):
        # e.g. the work directory is full or read-only: say so; the edit is kept in memory
        where = f"{exc.filename}: " if exc.filename else ""
        return JSONResponse(
            {"detail": f"server file error: {where}{exc.strerror or exc}"}, status_code=500
        )

    # ------------------------------------------------------------------ page and health
    @app.get("/", include_in_schema=False)
    def index():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        files = {p.name: p for p in STATIC.iterdir() if p.is_file()}
        if name not in files:
            raise HTTPException(404, "no such file")
        return FileResponse(files[name])

    @app.get("/api/health")
    def health():
        return {"status": "ok", "version": __version__, "live_sessions": len(store)}

    @app.get("/api/config")
    def config_info():
        return {
            "methods": list(METHODS),
            "kinds": list(be.kinds),
            "default_method": be.config.default_method,
            "default_kind": be.config.default_kind,
            "asset": be.asset_name,
            "max_upload_bytes": be.config.max_upload_bytes,
            "model_trained": bool(getattr(be.model, "trained", True)),
        }

    # ------------------------------------------------------------------ sessions
    @app.post("/api/sessions")
    async def create_session(request: Request, name: str | None = Query(None, max_length=200)):
        """Empty body: a session on the server's asset; else the body is a .ply/.splat file."""
        body = await read_body(request, be.config.max_upload_bytes)
        if not body:
            live = await run_in_threadpool(store.create, be.asset, be.asset_name)
            return live.info()
        if not name:
            raise WebInputError("an uploaded asset needs ?name=FILE.ply or FILE.splat")
        asset = await run_in_threadpool(parse_asset_bytes, body, name, be.config.max_gaussians)
        live = await run_in_threadpool(store.create, asset, Path(name).name)
        return live.info()

    @app.get("/api/sessions/{sid}")
    def session_info(sid: str):
        return store.get(sid).info()

    def query_view(
        az: float = 30.0,
        el: float = 20.0,
        zoom: float = 1.0,
        pan_x: float = 0.0,
        pan_y: float = 0.0,
        w: int = 512,
        h: int = 512,
    ) -> OrbitView:
        """The orbit view named by a request's query parameters (shared by every GET of one)."""
        return OrbitView(az, el, zoom, pan_x, pan_y, w, h).validate()

    @app.get("/api/sessions/{sid}/render")
    def render_view(
        sid: str,
        view: OrbitView = Depends(query_view),
        fmt: str = Query("png", pattern="^(png|jpeg)$"),
        quality: int = Query(80, ge=10, le=95),
    ):
        live = store.get(sid)
        t0 = time.perf_counter()
        rgb = be.render(live, view)
        t1 = time.perf_counter()
        data = encode_image(rgb, fmt, quality)
        t2 = time.perf_counter()
        timing = f"render;dur={(t1 - t0) * 1e3:.1f}, encode;dur={(t2 - t1) * 1e3:.1f}"
        return Response(
            data,
            media_type=f"image/{fmt}",
            headers={"Cache-Control": "no-store", "Server-Timing": timing},
        )

    @app.get("/api/sessions/{sid}/camera")
    def camera_json(sid: str, view: OrbitView = Depends(query_view)):
        """The camera of a view as `splatpainter edit --view` reads it (edit elsewhere)."""
        live = store.get(sid)
        return orbit_camera(view, live.centre, live.radius).to_dict()

    @app.put("/api/sessions/{sid}/view")
    async def save_view(sid: str, request: Request):
        """Remember where the user looks, so a reload or a restart opens the same view."""
        data = _json_object(await read_body(request, 64 * 1024))
        live = store.get(sid)
        live.view = OrbitView.from_dict(data)
        await run_in_threadpool(store.save, live, meta_only=True)
        return {"view": live.view.to_dict()}

    @app.post("/api/sessions/{sid}/apply")
    async def apply_edit(sid: str, request: Request):
        """JSON: view (orbit parameters), image (PNG data URL of the edited view), optional
        mask (PNG data URL, white = edit), method, kind, label."""
        store.get(sid)  # 404 before reading a large body
        data = _json_object(await read_body(request, APPLY_BODY_LIMIT))
        unknown = sorted(set(data) - {"view", "image", "mask", "method", "kind", "label"})
        if unknown:
            raise WebInputError(f"unknown field(s): {', '.join(unknown)}")
        view = OrbitView.from_dict(data.get("view"))
        method = data.get("method", be.config.default_method)
        kind = data.get("kind", be.config.default_kind)
        if method not in METHODS:
            raise WebInputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if kind not in be.kinds:
            raise WebInputError(f"kind must be one of {', '.join(be.kinds)}, got {kind!r}")
        label = data.get("label") or ""
        if not isinstance(label, str) or len(label) > 200:
            raise WebInputError("label must be a string of at most 200 characters")
        if "image" not in data:
            raise WebInputError("missing field: image (the edited view as a PNG data URL)")
        image = decode_image(
            decode_data_url(data["image"], "image"), view.width, view.height, "image", "RGB"
        )
        mask = None
        if data.get("mask") is not None:
            mask = decode_image(
                decode_data_url(data["mask"], "mask"), view.width, view.height, "mask", "L"
            )

        def run(live) -> None:
            from splatpainter.edit import EditView

            cam = orbit_camera(view, live.centre, live.radius)
            m = be.method_for(live, method, kind)
            text = label or (f"{method} ({kind})" if method == "model" else method)
            live.session.apply(EditView(cam, image, mask, name="web"), text, method=m)

        t0 = time.perf_counter()
        info = await run_in_threadpool(store.mutate, sid, f"applying ({method})", run)
        info["seconds"] = round(time.perf_counter() - t0, 3)
        return info

    def _history_action(sid: str, action: str, index: int | None = None) -> dict[str, Any]:
        def run(live) -> None:
            s = live.session
            if action == "undo":
                s.undo()
            elif action == "redo":
                s.redo()
            elif action == "reset":
                s.reset()
            elif action == "reset_memory":
                s.reset_state()
            else:
                s.goto(index)

        return store.mutate(sid, action, run)

    @app.post("/api/sessions/{sid}/undo")
    def undo(sid: str):
        return _history_action(sid, "undo")

    @app.post("/api/sessions/{sid}/redo")
    def redo(sid: str):
        return _history_action(sid, "redo")

    @app.post("/api/sessions/{sid}/reset")
    def reset(sid: str):
        """Back to the asset as loaded (undoable)."""
        return _history_action(sid, "reset")

    @app.post("/api/sessions/{sid}/reset_memory")
    def reset_memory(sid: str):
        """Forget what earlier edits taught the model (the asset stays; undoable)."""
        return _history_action(sid, "reset_memory")

    @app.post("/api/sessions/{sid}/goto/{index}")
    def goto(sid: str, index: int):
        return _history_action(sid, "goto", index)

    @app.get("/api/sessions/{sid}/export")
    def export(sid: str, format: str = Query("ply", pattern="^(ply|splat)$")):
        from splatpainter.io import ply_to_bytes, splat_to_bytes

        live = store.get(sid)
        asset = live.session.asset.detach().to("cpu")
        data = ply_to_bytes(asset) if format == "ply" else splat_to_bytes(asset)
        stem = "".join(c for c in Path(live.name).stem if c.isalnum() or c in "-_") or "asset"
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{stem}-edited.{format}"'},
        )

    return app
