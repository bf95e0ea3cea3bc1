"""Selector tests: each test gets its own live-price cache folder, so that no test reads prices
another one (or moto) left behind, and none touches the user's ~/.cache."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def price_cache(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("price-cache")
    monkeypatch.setenv("DL_LAUNCHER_CACHE", str(folder))
    return folder
