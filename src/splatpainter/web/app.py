"""The FastAPI app behind `splatpainter serve`: the page, frames rendered by the project's
renderer, edits, history, uploads and downloads.

The page draws the view itself with WebGL (see `viewport`): it loads the asset once
(`asset.ply`) and after each change only the changed colours (`delta`), so orbiting makes no
request.  The server still renders, with `splatpainter.render` (the compiled numba kernels,
compiled once and reused), the PNG of the view an edit is composed on, fetched when editing
starts; the page paints on that exact PNG, and an edit names the view by the same orbit
parameters, so the server fits it on the very pixels the user painted on.  Where WebGL or the
viewport library is missing, every frame comes from the server instead (JPEG while the user
drags, PNG when the view rests).  Bad requests get a 4xx whose JSON `detail` is one readable
sentence; the server keeps running.

Every request passes `check_request` first: a `Host` other than the address the connection
came in on, `localhost` or a `--allow-host` name (with the port) gets 421 (DNS rebinding), and
an `Origin` other than the server's own, or a cross-site fetch, gets 403 (another web page
driving the editor).  JSON endpoints take only `Content-Type: application/json` (415), which a
cross-site page cannot send without the browser asking first.  Every change to a session's
history carries the `revision` it was made on; a stale one gets 409 (see `store`).
"""

from __future__ import annotations

import json
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
from splatpainter.web.selection import (
    adjust_hsv,
    check_hsv,
    combine,
    delete,
    for_export,
    hidden_mask,
    hide,
    select_box,
    select_brush,
    select_sphere,
    tinted,
    unhide,
    visible_only,
)
from splatpainter.web.store import (
    METHODS,
    Busy,
    Cancelled,
    Full,
    NotFound,
    SessionError,
    SessionStore,
    Stale,
)
from splatpainter.web.viewport import (
    VENDOR_FILES,
    AssetTokens,
    DeltaRefused,
    asset_bytes,
    colour_delta,
    vendor_missing,
)
from splatpainter.web.views import (
    OrbitView,
    WebInputError,
    decode_data_url,
    decode_image,
    encode_image,
    orbit_camera,
    orbit_frame,
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
    max_sessions: int = 100  # on disk; the least recently used idle ones are deleted
    max_disk_bytes: int = 10 << 30
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides the address and localhost


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
            config.workdir,
            self.model_method,
            max_live=config.max_live_sessions,
            max_sessions=config.max_sessions,
            max_disk_bytes=config.max_disk_bytes,
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

    def render(self, live, view: OrbitView, highlight: bool = False) -> torch.Tensor:
        """The view of the current asset; `highlight`: the selection tinted (see `tinted`)."""
        from splatpainter.edit.signals import shown_frame
        from splatpainter.render import render

        cam = orbit_camera(view, live.centre, live.radius)
        asset = live.session.asset  # one reference: an edit finishing meanwhile swaps it whole
        sel = live.selection
        if highlight and sel is not None:
            cached = live.tint_cache  # (a tinted copy per asset and selection, not per frame)
            if cached is None or cached[0] is not asset or cached[1] is not sel:
                cached = live.tint_cache = (asset, sel, tinted(asset, sel))
            asset = cached[2]
        bg = live.session.method.background
        with self.render_slots, torch.no_grad():
            if asset is live.session.asset:  # a frame the user may paint on: remembered
                return shown_frame(asset, cam, bg)
            return render(asset, cam, background=bg).rgb

    def warm_up(self) -> None:
        """Compile (first run) or load the cached render kernels before the first request."""
        from splatpainter.camera import orbit_cameras
        from splatpainter.render import render

        small = self.asset.subset(slice(0, min(2000, self.asset.num_gaussians)))
        with torch.no_grad():
            render(small, orbit_cameras(small, 1, width=32, height=32)[0])


def parse_asset_bytes(data: bytes, filename: str, max_gaussians: int):
    """An uploaded .ply/.splat/.spz, checked as any asset file is (then validated)."""
    from splatpainter.io import AssetFormatError, ply_from_bytes, splat_from_bytes, spz_from_bytes

    ext = Path(filename).suffix.lower()
    if ext not in (".ply", ".splat", ".spz"):
        raise WebInputError(
            f"{filename!r}: unknown asset format; upload a .ply, .splat or .spz file"
        )
    source = Path(filename).name
    if ext == ".ply":
        asset = ply_from_bytes(data, source)[0]
    elif ext == ".spz":
        asset = spz_from_bytes(data, source)
    else:
        asset = splat_from_bytes(data, source)
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


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """A JSON object body, only as `Content-Type: application/json` (else 415): a cross-site
    page cannot send that type without a CORS preflight, which this server never grants."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        shown = f"got {ctype!r}" if ctype else "none was sent"
        raise HTTPException(415, f"this endpoint takes Content-Type: application/json ({shown})")
    return _json_object(await read_body(request, limit))


def take_revision(data: dict[str, Any]) -> int:
    """The `revision` a change was made on (required: without it a stale tab could not be told
    from a current one)."""
    rev = data.pop("revision", None)
    if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
        raise WebInputError(
            "missing field: revision (the session revision this change was made on, as "
            f"GET /api/sessions/ID gives it; got {rev!r})"
        )
    return rev


def _split_host(value: str) -> tuple[str, int | None] | None:
    """'name:port', '[v6]:port' or 'name' -> (name, port); None when it is not a host."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()) or len(port) > 5:
        return None
    return name, int(port) if port else None


def check_request(
    method: str,
    headers: dict[str, str],
    server: tuple[str, int | None] | None,
    allowed_hosts: tuple[str, ...] = (),
) -> tuple[int, str] | None:
    """(status, reason) refusing a request, or None to serve it.

    421: the `Host` names neither the address the connection came in on, nor `localhost`, nor
    an allowed name, at the server's port (a DNS-rebound name reaches a loopback server).
    403: an `Origin` other than the server's own, or a fetch the browser marks as coming from
    another site (another page in the user's browser driving the editor).
    """
    host = headers.get("host", "")
    parsed = _split_host(host)
    if server is not None:
        bound, port = server[0].lower(), server[1]
        names = {bound, "localhost", *(h.lower() for h in allowed_hosts)}
        if parsed is None or parsed[0] not in names or (parsed[1] or 80) != (port or 80):
            return 421, (
                f"this server answers only to Host {bound}:{port} or localhost:{port}, "
                f"not {host!r} (start it with --allow-host NAME to serve another name)"
            )
    origin = headers.get("origin")
    own = (f"http://{host.lower()}", f"https://{host.lower()}")
    if origin is not None and origin.lower() not in own:
        return 403, f"cross-origin request refused: Origin {origin!r} is not this server's"
    site = headers.get("sec-fetch-site", "")
    navigate = headers.get("sec-fetch-mode") == "navigate" and method in ("GET", "HEAD")
    if site in ("cross-site", "same-site") and not navigate:
        return 403, f"cross-site request refused (Sec-Fetch-Site: {site})"
    return None


class RequestGuard:
    """ASGI middleware applying `check_request` to every HTTP request before any route runs."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed_hosts = tuple(allowed_hosts)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            refused = check_request(
                scope["method"], headers, scope.get("server"), self.allowed_hosts
            )
            if refused is not None:
                status, detail = refused
                response = JSONResponse({"detail": detail}, status_code=status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: ServerConfig, backend: EditorBackend | None = None) -> FastAPI:
    """The app; `backend` may be shared (tests build it once)."""
    be = backend or EditorBackend(config)
    store = be.store
    app = FastAPI(title="SplatPainter", version=__version__, docs_url=None, redoc_url=None)
    app.state.backend = be
    tokens = AssetTokens()  # which asset each page's viewport holds
    app.add_middleware(RequestGuard, allowed_hosts=be.config.allowed_hosts)

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
        return JSONResponse({"detail": str(exc), "error": "busy"}, status_code=409)

    @app.exception_handler(Stale)
    async def _stale(request: Request, exc: Stale):
        body = {"detail": str(exc), "error": "stale", "revision": exc.revision}
        return JSONResponse(body, status_code=409)

    @app.exception_handler(Cancelled)
    async def _cancelled(request: Request, exc: Cancelled):
        return JSONResponse({"detail": str(exc), "error": "cancelled"}, status_code=409)

    @app.exception_handler(Full)
    async def _full(request: Request, exc: Full):
        return JSONResponse({"detail": str(exc)}, status_code=503)

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

    @app.get("/vendor/{name}", include_in_schema=False)
    def vendor(name: str):
        """The viewport's splat library, served from the npm install (never a CDN)."""
        path = VENDOR_FILES.get(name)
        if path is None or not path.is_file():
            raise HTTPException(404, vendor_missing() or "no such file")
        return FileResponse(path, media_type="text/javascript")

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
            "viewport_missing": vendor_missing(),  # None: the page renders with WebGL
        }

    # ------------------------------------------------------------------ sessions
    @app.post("/api/sessions")
    async def create_session(request: Request, name: str | None = Query(None, max_length=200)):
        """Empty body: a session on the server's asset; else a .ply/.splat/.spz file."""
        body = await read_body(request, be.config.max_upload_bytes)
        if not body:
            live = await run_in_threadpool(store.create, be.asset, be.asset_name)
            return live.info()
        if not name:
            raise WebInputError("an uploaded asset needs ?name=FILE.ply, FILE.splat or FILE.spz")
        asset = await run_in_threadpool(parse_asset_bytes, body, name, be.config.max_gaussians)
        live = await run_in_threadpool(store.create, asset, Path(name).name)
        return live.info()

    @app.get("/api/sessions")
    def list_sessions():
        """The sessions on disk, most recently used first, and the limits they live within."""
        return {
            "sessions": store.listing(),
            "max_sessions": store.max_sessions,
            "max_disk_bytes": store.max_disk_bytes,
        }

    @app.get("/api/sessions/{sid}")
    def session_info(sid: str):
        return store.get(sid).info()

    @app.delete("/api/sessions/{sid}")
    def delete_session(sid: str):
        store.get(sid)  # 404 for an unknown one
        store.delete(sid)
        return {"deleted": sid}

    @app.post("/api/sessions/{sid}/cancel")
    def cancel(sid: str):
        """Stop the session's running edit (an optimisation at its next step; a model pass
        when it ends) and drop its result; its apply request then gets 409."""
        return {"cancelled": store.cancel(sid)}

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
        highlight: bool = Query(False),
    ):
        """A frame of the view; `highlight=true` tints the selection (a frame to look at, never
        one to paint an edit on)."""
        live = store.get(sid)
        t0 = time.perf_counter()
        rgb = be.render(live, view, highlight)
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
        data = await read_json(request, 64 * 1024)
        live = store.get(sid)
        live.view = OrbitView.from_dict(data)
        await run_in_threadpool(store.save, live, meta_only=True)
        return {"view": live.view.to_dict()}

    @app.post("/api/sessions/{sid}/apply")
    async def apply_edit(sid: str, request: Request):
        """JSON: revision, view (orbit parameters), image (PNG data URL of the edited view),
        optional mask (PNG data URL, white = edit), method, kind, label, selection_only.  An
        edit that changes no Gaussian adds no history entry (`changed` is false).  Hidden
        Gaussians keep their bits, and with `selection_only` so do the unselected ones.  The
        answer's `reading` says how the model read an edit of kind "auto" (`edit_reading`)."""
        store.get(sid)  # 404 before reading a large body
        data = await read_json(request, APPLY_BODY_LIMIT)
        revision = take_revision(data)
        fields = {"view", "image", "mask", "method", "kind", "label", "selection_only"}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise WebInputError(f"unknown field(s): {', '.join(unknown)}")
        view = OrbitView.from_dict(data.get("view"))
        method = data.get("method", be.config.default_method)
        kind = data.get("kind", be.config.default_kind)
        if method not in METHODS:
            raise WebInputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if kind not in be.kinds:
            raise WebInputError(f"kind must be one of {', '.join(be.kinds)}, got {kind!r}")
        only = data.get("selection_only", False)
        if not isinstance(only, bool):
            raise WebInputError(f"selection_only must be true or false, got {only!r}")
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

        read: list = []  # how the model read the edit under "auto" (`ModelMethod.reading`)

        def run(live) -> bool:
            from splatpainter.edit import EditView

            cam = orbit_camera(view, live.centre, live.radius)
            m = be.method_for(live, method, kind)
            live.running = m
            text = label or (f"{method} ({kind})" if method == "model" else method)
            s = live.session
            before = s.asset
            if only and (live.selection is None or not bool(live.selection.any())):
                raise WebInputError("selection_only: nothing is selected")
            s.apply(EditView(cam, image, mask, name="web"), text, method=m)
            read.append(getattr(m, "reading", None) if kind == "auto" else None)
            limited = visible_only(before, s.asset, live.selection if only else None)
            if limited is not s.asset:  # the other Gaussians keep their bits
                s.entries[s.index].asset = limited
            return s.changed_gaussians(s.index) > 0

        t0 = time.perf_counter()
        info = await run_in_threadpool(store.mutate, sid, f"applying ({method})", run, revision)
        info["seconds"] = round(time.perf_counter() - t0, 3)
        info["reading"] = read[0] if read else None
        return info

    async def _history_action(
        sid: str, request: Request, action: str, index: int | None = None
    ) -> dict[str, Any]:
        data = await read_json(request, 4096)
        revision = take_revision(data)
        if data:
            raise WebInputError(f"unknown field(s): {', '.join(sorted(data))}")

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

        return await run_in_threadpool(store.mutate, sid, action, run, revision)

    # JSON {"revision": N}, the revision the page showed when the user asked
    @app.post("/api/sessions/{sid}/undo")
    async def undo(sid: str, request: Request):
        return await _history_action(sid, request, "undo")

    @app.post("/api/sessions/{sid}/redo")
    async def redo(sid: str, request: Request):
        return await _history_action(sid, request, "redo")

    @app.post("/api/sessions/{sid}/reset")
    async def reset(sid: str, request: Request):
        """Back to the asset as loaded (undoable)."""
        return await _history_action(sid, request, "reset")

    @app.post("/api/sessions/{sid}/reset_memory")
    async def reset_memory(sid: str, request: Request):
        """Forget what earlier edits taught the model (the asset stays; undoable)."""
        return await _history_action(sid, request, "reset_memory")

    @app.post("/api/sessions/{sid}/goto/{index}")
    async def goto(sid: str, index: int, request: Request):
        return await _history_action(sid, request, "goto", index)

    # ------------------------------------------------------------------ client-side viewport
    @app.get("/api/sessions/{sid}/asset.ply")
    async def viewport_asset(sid: str):
        """The current asset once, for the page's WebGL viewport; `X-Asset-Token` names it and
        `X-Orbit` gives what the page needs to compute `orbit_camera` itself."""
        live = store.get(sid)
        asset = live.session.asset  # one reference: an edit swaps it whole
        orbit = orbit_frame(live.centre, live.radius, live.session.method.background)
        headers = {
            "Cache-Control": "no-store",
            "X-Asset-Token": str(tokens.token(asset)),
            "X-Orbit": json.dumps(orbit),
        }
        data = await run_in_threadpool(asset_bytes, asset)
        return Response(data, media_type="application/octet-stream", headers=headers)

    @app.get("/api/sessions/{sid}/delta")
    def viewport_delta(sid: str, since: int = Query(..., ge=1)):
        """The colours that changed from the asset `since` names to the current one (binary,
        see `viewport.colour_delta`); 409 `reload` when there is none: load asset.ply again."""
        session = store.get(sid).session
        new, old = session.asset, tokens.get(since)
        if old is None or not any(e.holds(old) for e in session.entries):
            detail = "the page's asset is not in this session's history; load asset.ply again"
            return JSONResponse({"detail": detail, "error": "reload"}, status_code=409)
        try:
            data = colour_delta(old, new)
        except DeltaRefused as e:
            detail = f"{e}; load asset.ply again"
            return JSONResponse({"detail": detail, "error": "reload"}, status_code=409)
        return Response(
            data,
            media_type="application/octet-stream",
            headers={"Cache-Control": "no-store", "X-Asset-Token": str(tokens.token(new))},
        )

    # ------------------------------------------------------------------ 3D selection
    @app.get("/api/sessions/{sid}/selection")
    def selection(sid: str):
        """The selected Gaussians' indices (in the asset's order, which edits never change)."""
        live = store.get(sid)
        sel = live.selection
        indices = [] if sel is None else sel.nonzero().squeeze(-1).tolist()
        return {"selected": len(indices), "indices": indices}

    @app.post("/api/sessions/{sid}/selection")
    async def select(sid: str, request: Request):
        """Change the selection (not an edit: no revision, no history).  JSON: one of
        `box` {min, max}, `sphere` {centre, radius} (world coordinates), `brush` {view, mask}
        (a PNG data URL; the Gaussians whose centre projects on its white pixels), with
        `mode` replace (default), add or subtract; or `op`: all, none or invert."""
        data = await read_json(request, APPLY_BODY_LIMIT)
        live = store.get(sid)
        means = live.session.asset.means
        shapes = [k for k in ("box", "sphere", "brush", "op") if k in data]
        unknown = sorted(set(data) - {"box", "sphere", "brush", "op", "mode"})
        if unknown or len(shapes) != 1:
            raise WebInputError(
                "give exactly one of box, sphere, brush or op (and optionally mode)"
                + (f"; unknown field(s): {', '.join(unknown)}" if unknown else "")
            )
        kind, spec = shapes[0], data[shapes[0]]
        if kind == "op":
            n = means.shape[0]
            current = live.selection if live.selection is not None else torch.zeros(n, dtype=bool)
            ops = {"all": torch.ones(n, dtype=bool), "none": torch.zeros(n, dtype=bool)}
            ops["invert"] = ~current
            if spec not in ops:
                raise WebInputError(f"op must be one of all, none, invert, got {spec!r}")
            live.selection = ops[spec]
        else:
            if not isinstance(spec, dict):
                raise WebInputError(f"{kind} must be a JSON object")
            if kind == "box":
                new = select_box(means, spec.get("min"), spec.get("max"))
            elif kind == "sphere":
                new = select_sphere(means, spec.get("centre"), spec.get("radius"))
            else:
                view = OrbitView.from_dict(spec.get("view"))
                if "mask" not in spec:
                    raise WebInputError("brush.mask: missing (a PNG data URL, white = selected)")
                raw = decode_data_url(spec["mask"], "brush.mask")
                mask = decode_image(raw, view.width, view.height, "brush.mask", "L")
                cam = orbit_camera(view, live.centre, live.radius)
                new = select_brush(means, cam, mask.reshape(view.height, view.width))
            live.selection = combine(live.selection, new, data.get("mode", "replace"))
        store.save_selection(live)  # (atomic; it outlives a reload and a restart)
        return {"selected": int(live.selection.sum()), "num_gaussians": int(means.shape[0])}

    async def _selection_edit(sid: str, request: Request, what: str) -> dict[str, Any]:
        """Delete, colour-adjust or hide the selection's visible Gaussians (hidden ones are not
        edited): an undoable history entry, none when nothing changes."""
        data = await read_json(request, 4096)
        revision = take_revision(data)
        allowed = {"hue", "saturation", "brightness"} if what == "adjust" else set()
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise WebInputError(f"unknown field(s): {', '.join(unknown)}")
        if what == "adjust":
            hsv = check_hsv(
                data.get("hue", 0.0), data.get("saturation", 1.0), data.get("brightness", 1.0)
            )

        def run(live) -> bool:
            sel = live.selection
            if sel is None or not bool(sel.any()):
                raise WebInputError(f"{what}: nothing is selected")
            sel = sel & ~hidden_mask(live.session.asset)
            n = int(sel.sum())
            if what == "hide":
                return n > 0 and live.record(hide(live.session.asset, sel), f"hide {n}", "select")
            if n == 0:
                raise WebInputError(f"{what}: every selected Gaussian is hidden; unhide them first")
            if what == "delete":
                return live.record(delete(live.session.asset, sel), f"delete {n}", "select")
            h, sat, val = hsv
            label = f"adjust {n}: hue {h:+g}, saturation x{sat:g}, brightness x{val:g}"
            return live.record(adjust_hsv(live.session.asset, sel, h, sat, val), label, "select")

        return await run_in_threadpool(store.mutate, sid, f"selection {what}", run, revision)

    @app.post("/api/sessions/{sid}/selection/delete")
    async def delete_selection(sid: str, request: Request):
        """JSON {revision}: make the selected Gaussians vanish (floaters); undoable."""
        return await _selection_edit(sid, request, "delete")

    @app.post("/api/sessions/{sid}/selection/adjust")
    async def adjust_selection(sid: str, request: Request):
        """JSON {revision, hue (degrees), saturation, brightness (factors)}: an exact colour
        adjustment of the selected Gaussians only; undoable."""
        return await _selection_edit(sid, request, "adjust")

    @app.post("/api/sessions/{sid}/selection/hide")
    async def hide_selection(sid: str, request: Request):
        """JSON {revision}: hide the selected Gaussians (they vanish from every view and no
        edit touches them until shown again); undoable."""
        return await _selection_edit(sid, request, "hide")

    @app.post("/api/sessions/{sid}/unhide")
    async def unhide_hidden(sid: str, request: Request):
        """JSON {revision, selection_only (default false: every hidden Gaussian)}: show hidden
        Gaussians again with their own opacity, bit for bit; undoable."""
        data = await read_json(request, 4096)
        revision = take_revision(data)
        only = data.pop("selection_only", False)
        if not isinstance(only, bool):
            raise WebInputError(f"selection_only must be true or false, got {only!r}")
        if data:
            raise WebInputError(f"unknown field(s): {', '.join(sorted(data))}")

        def run(live) -> bool:
            s = live.session
            if only and (live.selection is None or not bool(live.selection.any())):
                raise WebInputError("unhide selection_only: nothing is selected")
            hidden = hidden_mask(s.asset)
            if only:
                hidden &= live.selection
            n = int(hidden.sum())
            shown = unhide([e.asset for e in s.history], live.selection if only else None)
            return n > 0 and live.record(shown, f"unhide {n}", "select")

        return await run_in_threadpool(store.mutate, sid, "unhide", run, revision)

    @app.get("/api/sessions/{sid}/export")
    def export(sid: str, format: str = Query("ply", pattern="^(ply|splat)$"), hidden: str = "keep"):
        """The current asset as a file, every Gaussian in its place.  Hidden Gaussians are
        written with their own opacity (`hidden=keep`, the default: hiding is a view aid and
        an export never loses them) or as deleted (`hidden=delete`: fully transparent);
        `X-Hidden-Gaussians` says how many there were."""
        from splatpainter.io import ply_to_bytes, splat_to_bytes

        live = store.get(sid)
        history = [e.asset for e in live.session.history]
        n_hidden = int(hidden_mask(history[-1]).sum())
        asset = for_export(history, hidden).detach().to("cpu")
        data = ply_to_bytes(asset) if format == "ply" else splat_to_bytes(asset)
        stem = "".join(c for c in Path(live.name).stem if c.isalnum() or c in "-_") or "asset"
        return Response(
            data,
            media_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{stem}-edited.{format}"',
                "X-Hidden-Gaussians": str(n_hidden),
            },
        )

    return app
