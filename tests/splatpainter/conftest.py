"""Shared test settings for splatpainter: the latent disk cache lives in a temporary folder, so
a test run never reads or fills the user's ~/.cache/splatpainter (subprocesses inherit it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _latent_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["SPLATPAINTER_CACHE_DIR"] = str(tmp_path_factory.mktemp("latent-cache"))


@pytest.fixture(scope="module")
def asset_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo asset on disk (1,500 Gaussians, seed 0), one per test module."""
    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.io import save_asset

    path = tmp_path_factory.mktemp("asset") / "small.ply"
    save_asset(make_demo_asset(1500, seed=0).asset, path)
    return path


@pytest.fixture(scope="module")
def playwright_api():
    """playwright's sync API for the browser tests, or a skip that says (also on stderr, so CI
    logs show it) why Chromium cannot be driven here."""
    pytest.importorskip("fastapi")
    from splatpainter.web.harness import chromium_missing

    why = chromium_missing()
    if why:
        print(f"browser test skipped: {why}", file=sys.stderr)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    return sync_playwright
