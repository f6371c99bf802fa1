"""Real mounts through the CLI. Every mount a test makes is taken down afterwards, even when it fails.

The tests here need /dev/fuse; without it they are skipped, or fail when
CKPTFS_REQUIRE_FUSE=1 (as in CI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from corpus import CorpusFile

from mount.helpers import Mounter, require_fuse
from mount.users import shared_directory


@pytest.fixture(scope="session", autouse=True)
def fuse_device() -> None:
    require_fuse()


@pytest.fixture
def mounter(tmp_path: Path) -> Iterator[Mounter]:
    mounts = Mounter(tmp_path / "mnt")
    try:
        yield mounts
    finally:
        mounts.cleanup()


@pytest.fixture(scope="session")
def corpus_mounts(corpus: dict[str, CorpusFile], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every corpus file mounted once for the session."""
    mounts = Mounter(tmp_path_factory.mktemp("corpus-mounts"))
    try:
        yield {name: mounts(entry.path) for name, entry in corpus.items()}
    finally:
        mounts.cleanup()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can reach, for tests that act as another user."""
    yield from shared_directory()
