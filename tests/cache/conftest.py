"""Fixtures of the metadata cache's tests: a cache folder, and the size threshold lowered so that the small
corpus checkpoints are cached too."""

from __future__ import annotations

from pathlib import Path

import pytest

import ckptfs.cache


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(ckptfs.cache, "MIN_TENSORS", 0)
    monkeypatch.setattr(ckptfs.cache, "MIN_TENSORS_BY_FORMAT", {})
    monkeypatch.setattr(ckptfs.cache, "MIN_TENSORS_SCANNED", {})
    return tmp_path / "cache"
