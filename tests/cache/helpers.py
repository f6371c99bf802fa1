"""What the metadata cache's tests look at: the entries in a cache folder."""

from __future__ import annotations

from pathlib import Path


def entries(cache_dir: Path) -> list[Path]:
    folder = cache_dir / "metadata"
    return sorted(folder.glob("*.ckm")) if folder.exists() else []
