"""Shared test settings for splatpainter: the latent disk cache lives in a temporary folder, so
a test run never reads or fills the user's ~/.cache/splatpainter (subprocesses inherit it)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _latent_cache_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["SPLATPAINTER_CACHE_DIR"] = str(tmp_path_factory.mktemp("latent-cache"))
