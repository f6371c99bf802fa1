"""The compiled scanner of DCP ``.metadata`` pickles (``ckptfs/pickle/_cscan_dcp.c``) against the pure-Python paths.

Every directory opens the same on the three paths: compiled (where it accepts), the pure-Python fast path
(``dcp_record``) and the reference (``CKPTFS_PICKLE_FAST_PATHS=0``): the same ``info --json`` text, or the same
error by type and message. The inputs: torch-written directories of the forms the scanner accepts (which it must
accept), mutants of their ``.metadata`` and random opcodes spliced into one. The hostile DCP cases are compared
in ``test_cscan.test_hostile_case_same_on_every_path`` (all cases), generated metadata in ``test_dcp_fast_path``;
the scanner alone runs under AddressSanitizer and UBSan with these ``.metadata`` among the seeds
(``test_cscan.test_scanner_fuzzed_under_sanitizers``).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from dcp_writers import save, simulate_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.formats import dcp_columns
from ckptfs.limits import Limits
from ckptfs.pickle import cscan, unpickler
from hostile.checks import compiled_scanner, fast_paths, three_paths
from hostile.test_parse_paths import opened

BUILT = cscan.LIBRARY is not None
MUTANTS = 300


def _state(n: int) -> dict[str, Any]:
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.bool, torch.complex64,
              torch.uint8)
    state: dict[str, Any] = {f"layer.{k}.weight": (torch.arange(24) + k).reshape(6, 4).to(dtypes[k % len(dtypes)])
                             for k in range(n)}
    state.update(step=torch.tensor(7), scale=torch.tensor(0.5, dtype=torch.float64), empty=torch.empty(0, 3),
                 deep=torch.arange(64, dtype=torch.float32).reshape(2, 2, 2, 2, 2, 2), extra={"lr": 0.1, "n": [1]})
    return state


def torch_written(out: Path) -> dict[str, Path]:
    """DCP directories of the forms the scanner reads, as torch writes them: dtypes, 0-d, empty and 6-d tensors,
    bytes items, nested keys; chunked tensors over 3 and 8 ranks."""
    paths = {"plain": out / "plain", "sharded3": out / "sharded3", "ranks8": out / "ranks8"}
    state = _state(12)
    save(state, paths["plain"])
    sharded = {name: (0, 2 + n % 3) for n, name in enumerate(state) if name.startswith("layer")}
    simulate_ranks(state, sharded, paths["sharded3"], world=3, pinned=True)
    state = _state(40)
    simulate_ranks(state, {name: (1, 4) for name in state if name.startswith("layer")} | {"deep": (5, 2)},
                   paths["ranks8"], world=8, pinned=True)
    return paths


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return torch_written(tmp_path_factory.mktemp("cscan_dcp"))


def compiled(data: bytes, limits: Limits = Limits()) -> bool:
    with compiled_scanner(True), fast_paths(True):
        return dcp_columns.metadata(data, limits) is not None


def test_torch_written_directories_are_scanned_and_same_on_every_path(written: dict[str, Path]) -> None:
    for name, path in written.items():
        assert compiled((path / ".metadata").read_bytes()) == BUILT, name
        made, python, reference = three_paths(lambda path=path: opened(path))
        assert isinstance(made, str), (name, made)
        assert made == python == reference, name


def test_limits_around_a_directory_same_on_every_path(written: dict[str, Path]) -> None:
    """Memo and stack bounds around what the directory needs: the scanner refuses before any bound."""
    data = (written["sharded3"] / ".metadata").read_bytes()
    with fast_paths(False):
        machine = unpickler.SafeUnpickler(data, limits=Limits())
        machine.load()
    used = len(machine.memo)
    for depth in (1, 8, 15, 16, 17, 18, 24, 32, 36, 40, 100, 10_000_000):
        for memo in (1, 16, used - 1, used, used + 1, used + 2, 10_000_000):
            limits = Limits(max_stack_depth=depth, max_memo_entries=memo)
            made, python, reference = three_paths(lambda limits=limits: opened(written["sharded3"], limits))
            assert made == python == reference, (depth, memo)
    assert compiled(data, Limits(max_stack_depth=100, max_memo_entries=used + 2)) == BUILT


def _mutant_dir(base: Path, data: bytes, out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(base, out)
    (out / ".metadata").write_bytes(data)
    return out


def test_mutants_same_on_every_path(written: dict[str, Path], tmp_path: Path) -> None:
    base = written["sharded3"]
    metadata = (base / ".metadata").read_bytes()
    rng = random.Random(31)
    outcomes = set()
    scanned = 0
    for n in range(MUTANTS):
        data = bytearray(metadata)
        for _ in range(rng.choice((1, 1, 2, 4))):
            at = rng.randrange(len(data))
            if rng.random() < 0.05:
                del data[at:]
            else:
                data[at] = rng.randrange(256)
        mutant = _mutant_dir(base, bytes(data), tmp_path / f"m{n % 2}")
        made, python, reference = three_paths(lambda mutant=mutant: opened(mutant))
        assert made == python == reference
        outcomes.add(made[0] if isinstance(made, tuple) else "opened")
        scanned += compiled(bytes(data))
    assert {"opened", "UnpicklingError", "CorruptCheckpointError"} <= outcomes
    assert (scanned > MUTANTS // 100) == BUILT


SNIPPETS = [b"(", b")", b"}", b"]", b"N", b"\x88", b"\x89", b"K\x05", b"M\x01\x02", b"J\xff\xff\xff\xff",
            b"\x8a\x01\xff", b"\x8c\x01a", b"\x8c\x01/", b"X\x01\x00\x00\x00b", b"\x8c\x01\xff", b"\x94", b"q\x00",
            b"h\x00", b"h\x01", b"h\x09", b"h\x10", b"h!", b"t", b"\x85", b"\x86", b"\x87", b"u", b"e", b"s", b"a",
            b"R", b"\x81", b"b", b"\x93", b"0", b")\x81\x94}\x94(", b"\x86\x94\x85\x94R\x94"]
"""Opcodes the scanner reads and some it does not, gets of the memo's first slots (the classes, names, Size)."""


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 10_000), parts=st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=6))
def test_spliced_opcodes_same_on_every_path(written: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
                                            cut: int, parts: list[bytes]) -> None:
    """Opcodes spliced in between two opcodes of torch's items (the frame lengths then disagree, so FRAMEs are
    dropped first: ``pickle.dump`` frames every 64 KiB)."""
    base = written["plain"]
    metadata = (base / ".metadata").read_bytes()
    assert metadata[2:3] == b"\x95"
    data = metadata[:2] + metadata[11:]
    at = min(cut, len(data) - 1)
    data = data[:at] + b"".join(parts) + data[at:]
    mutant = _mutant_dir(base, data, tmp_path_factory.mktemp("spliced") / "m")
    made, python, reference = three_paths(lambda: opened(mutant))
    assert made == python == reference


def test_hostile_dcp_cases_reach_the_scanner(hostile_files: dict[str, Path]) -> None:
    """The hostile DCP cases (made byte by byte: GLOBAL opcodes, BINPUT) that lie in what the scanner reads are
    accepted by it, so ``test_cscan``'s comparison of every case on the three paths covers its rows."""
    metadata = {name: path / ".metadata" for name, path in hostile_files.items() if (path / ".metadata").is_file()}
    scanned = {name for name, path in metadata.items() if compiled(path.read_bytes())}
    assert len(metadata) >= 30
    assert (len(scanned) >= 10) == BUILT, sorted(scanned)


def test_pure_python_when_the_library_is_missing(written: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    with compiled_scanner(True):
        made = opened(written["plain"])
    monkeypatch.setattr(cscan, "LIBRARY", None)
    assert cscan.dcp((written["plain"] / ".metadata").read_bytes(), Limits()) is None
    assert opened(written["plain"]) == made
