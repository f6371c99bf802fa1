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
def no_cache_home() -> Iterator[None]:
    """Commands run by the tests cache nothing unless a test says where (``--cache-dir``, its own
    ``XDG_CACHE_HOME``): no folder can be made below ``/dev/null``, so every open parses, as the tests of
    parsing expect, and nothing is written to the user's ~/.cache."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = "/dev/null"
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before
