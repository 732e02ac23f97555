"""Shared test settings for splatpainter: the latent disk cache lives in a temporary folder, so
a test run never reads or fills the user's ~/.cache/splatpainter (subprocesses inherit it)."""

from __future__ import annotations

import os
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
