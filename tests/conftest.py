"""Shared fixtures: the torch-written corpus, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
from corpus import CorpusFile, build_corpus
from shapes import fake_omegaconf_classes


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CorpusFile]:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def corpus_dir(corpus: dict[str, CorpusFile]) -> Path:
    return next(iter(corpus.values())).path.parent


@pytest.fixture
def fake_omegaconf(monkeypatch: pytest.MonkeyPatch) -> dict[str, type]:
    """Classes named as omegaconf's and an app's enum, importable by name while the test runs."""
    return fake_omegaconf_classes(monkeypatch)


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Commands run by the tests cache below a temporary folder, never in the user's ~/.cache."""
    home = tmp_path_factory.mktemp("xdg-cache")
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before
