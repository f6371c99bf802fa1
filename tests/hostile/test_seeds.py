"""The seeds are the same bytes in every run: no memory address, hash order, time or path gets into them."""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest
from legacy_writer import KEY_BASE, KEY_STEP

from hostile.seeds import SEED_NAMES

HERE = Path(__file__).resolve().parent


def test_seeds_are_the_same_bytes_in_another_process(seeds: dict[str, bytes], tmp_path: Path) -> None:
    """Written again later, by a fresh interpreter with another hash seed, in another working directory."""
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    subprocess.run([sys.executable, str(HERE / "seeds.py"), str(tmp_path)], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": hash_seed})
    assert {name: (tmp_path / name).read_bytes() == seeds[name] for name in SEED_NAMES} == dict.fromkeys(
        SEED_NAMES, True)


@pytest.mark.parametrize(("name", "storages"), [("legacy_state.pt", 9), ("legacy_exotic.pt", 7)])
def test_legacy_seed_storage_keys_are_fixed(name: str, storages: int, seeds: dict[str, bytes]) -> None:
    """The object's persistent ids name the fixed keys, and the key list (the last pickle) lists them, sorted."""
    stream = io.BytesIO(seeds[name])
    for _ in range(3):
        pickle.load(stream)
    named = [arg for op, arg, _ in pickletools.genops(stream) if op.name == "BINUNICODE" and arg.isdigit()]
    keys = pickle.load(stream)
    fixed = [str(KEY_BASE - KEY_STEP * n) for n in range(storages)]
    assert list(dict.fromkeys(named)) == fixed
    assert keys == sorted(fixed)


def test_torchscript_seed_names_no_path(seeds: dict[str, bytes]) -> None:
    """TorchScript records the file of every function it compiles: the seed's is a fixed name, not a path."""
    data = seeds["torchscript.pt"]
    assert b"ckptfs_seed_module.py" in data
    for path in (sys.prefix, str(HERE)):
        assert path.encode() not in data
