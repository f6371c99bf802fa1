"""``load_extension``: each reason a compiled library is not loaded, as ``--version`` words it."""

from __future__ import annotations

import importlib.machinery
import shutil
from pathlib import Path

import pytest

from ckptfs.compiled import load_extension
from ckptfs.fuse import dirents

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A copy of the built listing loop as ``_lib<suffix>`` in ``tmp_path``."""
    if dirents.COMPILED is None:
        pytest.skip(f"the listing loop is {dirents.PATH_NAME}")
    shutil.copy(Path(dirents.__file__).parent / dirents.PATH_NAME.removeprefix("compiled (").removesuffix(")"),
                tmp_path / f"_lib{SUFFIX}")
    return tmp_path


def test_loads_the_library_beside_and_names_its_file(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPTFS_TEST_COMPILED", raising=False)
    library, found = load_extension(built, "_lib", "CKPTFS_TEST_COMPILED", "loop", ("cd_add_entries",))
    assert library is not None and found == f"_lib{SUFFIX}"
    assert library.cd_add_entries is not None


def test_the_switch_leaves_it_unloaded(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_TEST_COMPILED", "0")
    assert load_extension(built, "_lib", "CKPTFS_TEST_COMPILED", "loop") == (None, "CKPTFS_TEST_COMPILED=0")


def test_a_build_without_a_symbol_does_not_load(built: Path) -> None:
    library, found = load_extension(built, "_lib", "CKPTFS_TEST_COMPILED", "loop", ("cd_add_entries", "cd_newer"))
    assert library is None
    assert found.startswith("the compiled loop does not load: ") and found.endswith("undefined symbol: cd_newer")


def test_a_file_that_is_no_library_does_not_load(tmp_path: Path) -> None:
    (tmp_path / f"_lib{SUFFIX}").write_bytes(b"garbage\n")
    assert load_extension(tmp_path, "_lib", "CKPTFS_TEST_COMPILED", "scanner") == (
        None, f"the compiled scanner does not load: {tmp_path / f'_lib{SUFFIX}'}: file too short")


def test_none_built(tmp_path: Path) -> None:
    assert load_extension(tmp_path, "_lib", "CKPTFS_TEST_COMPILED", "scanner") == (
        None, "no compiled scanner was built")
