"""Shared fixtures: the torch-written corpus, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus import CorpusFile, build_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CorpusFile]:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def corpus_dir(corpus: dict[str, CorpusFile]) -> Path:
    return next(iter(corpus.values())).path.parent
