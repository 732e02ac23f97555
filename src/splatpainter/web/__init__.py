"""The browser editor behind `splatpainter serve`: a FastAPI app and one static page.

`create_app(ServerConfig(workdir=...))` builds the app (needs the `web` extra: fastapi,
uvicorn); the page lives in `static/` and loads nothing from the network.
"""

from splatpainter.web.app import EditorBackend, ServerConfig, create_app

__all__ = ["EditorBackend", "ServerConfig", "create_app"]
