"""The DCP ``.metadata`` fast path against the reference path on mutants of a torch-written ``.metadata``, and on
opcodes that use a row the way they may use the object it stands for.

A row (``TensorRow``, ``StorageKey``, ``StorageRow``) is what the fast path pushes instead of the reference path's
inert object. An opcode after an item may take one as its target (``APPEND``, ``SETITEM``, ``BUILD`` fill an
inert object, and fail on a row), as a callable (a ``PickledObject`` whose class is shown by the callable's type),
or copy it (``DUP``, a memo put). CI once saw a mutant end with "APPEND on a StorageRow, which is not a list" on
the fast path and "unknown or refused opcode" further on on the reference: the fast path must give the
reference's result instead. The mutated ``.metadata`` is written by ``PinnedWriter``: the writer's own holds the
directory's path and a random save id, and the mutants (and whether one of them hits a row) changed each run.
"""

from __future__ import annotations

import contextlib
import pickletools
import random
from pathlib import Path

import pytest
import torch
from dcp_writers import simulate_ranks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.pickle import unpickler
from ckptfs.pickle.dcp_record import STORAGE_INFO, StorageRow, TensorRow
from ckptfs.pickle.values import FastPathRefused, PickledObject, short_repr
from hostile.checks import fast_paths
from hostile.test_dcp_fast_path import both_paths, expert_tensors, metadata

MUTANTS = 6000


@pytest.fixture(scope="module")
def torch_metadata(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The ``.metadata`` of ``test_parse_paths``' DCP directory (two ranks, boxes), the same bytes on every run."""
    state = {f"layer.{n}.weight": torch.arange(32, dtype=torch.float32).reshape(8, 4) + n for n in range(6)}
    state["step"] = torch.tensor(7)
    path = tmp_path_factory.mktemp("dcp") / "base"
    simulate_ranks(state, {name: (n % 2, 2 + n % 3) for n, name in enumerate(state) if name != "step"}, path,
                   world=2, pinned=True)
    return (path / ".metadata").read_bytes()


def test_the_torch_written_metadata_is_pinned_and_takes_the_fast_path(torch_metadata: bytes,
                                                                     tmp_path: Path) -> None:
    state = {f"layer.{n}.weight": torch.arange(32, dtype=torch.float32).reshape(8, 4) + n for n in range(6)}
    state["step"] = torch.tensor(7)
    simulate_ranks(state, {name: (n % 2, 2 + n % 3) for n, name in enumerate(state) if name != "step"},
                   tmp_path / "elsewhere", world=2, pinned=True)
    assert (tmp_path / "elsewhere" / ".metadata").read_bytes() == torch_metadata
    with fast_paths(True):
        value = unpickler.load_dcp(torch_metadata, Limits()).state
    assert sum(type(v) is TensorRow for v in value["state_dict_metadata"].values()) >= 5
    assert sum(type(v) is StorageRow for v in value["storage_data"].values()) >= 10


def mutant(data: bytes, rng: random.Random) -> bytes:
    """``test_parse_paths``' DCP mutants: one to four bytes replaced, sometimes the end cut off."""
    mutated = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        at = rng.randrange(len(mutated))
        if rng.random() < 0.1:
            del mutated[at:]
        else:
            mutated[at] = rng.randrange(256)
    return bytes(mutated)


def test_torch_written_mutants_same_on_both_paths(torch_metadata: bytes) -> None:
    """Among these, before the fix: 'APPEND on a StorageRow' (the reference: an unknown opcode further on),
    'SETITEM on a StorageRow', and 'a storage_data value is a StorageRow' (the reference: 'a PickledObject')."""
    rng = random.Random(24)
    outcomes = set()
    for _ in range(MUTANTS):
        fast, reference = both_paths(mutant(torch_metadata, rng))
        assert fast == reference
        outcomes.add(fast[1] if fast[0] == "error" else "parsed")
    assert {"parsed", "UnpicklingError", "CorruptCheckpointError", "TruncatedPickleError"} <= outcomes


def item_ends(data: bytes) -> list[int]:
    """Where each ``storage_data`` entry ends (its value's ``BUILD``), and each tensor item (``APPENDS``/``APPEND``,
    ``SETITEMS``, ``BUILD``): the places where the fast path leaves rows on top of the stack."""
    start = data.index(b"state_dict_metadata")
    ops = [(op.name, pos) for op, _, pos in pickletools.genops(data) if pos > start]
    ends = [pos + 1 for (name, pos), (before, _), (first, _) in zip(ops[2:], ops[1:], ops) if name == "BUILD"
            and before == "SETITEMS" and first in ("APPENDS", "APPEND")]
    storage = data.index(b"storage_data")
    builds = [pos + 1 for name, pos in ops if name == "BUILD" and pos > storage]
    return ends + builds[1::2]


@settings(max_examples=1500, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 16), st.booleans(), st.integers(0, 255)), min_size=1,
                      max_size=3))
def test_edits_at_item_ends_same_on_both_paths(torch_metadata: bytes, edits: list[tuple[int, bool, int]]) -> None:
    """A byte replaced or inserted anywhere, or right after an item (``at_end``): the opcode then applies to a row."""
    ends = item_ends(torch_metadata)
    data = bytearray(torch_metadata)
    for where, at_end, byte in edits:
        at = ends[where % len(ends)] if at_end else where % len(data)
        if at_end:
            data[at:at] = bytes([byte])
        else:
            data[at] = byte
    fast, reference = both_paths(bytes(data))
    assert fast == reference


def spliced(data: bytes, at: int, inserted: bytes) -> bytes:
    """``inserted`` at ``at``, the frame holding it lengthened to match."""
    frame = max(pos for op, _, pos in pickletools.genops(data) if op.name == "FRAME" and pos < at)
    mutated = bytearray(data[:at] + inserted + data[at:])
    length = int.from_bytes(data[frame + 1 : frame + 9], "little") + len(inserted)
    mutated[frame + 1 : frame + 9] = length.to_bytes(8, "little")
    return bytes(mutated)


ON_A_ROW = {
    "APPEND on it": (b"K\x01a", "parsed"),
    "SETITEM on it": (b"K\x01K\x02s", "parsed"),
    "APPENDS on it": (b"(K\x01e", "parsed"),
    "SETITEMS on it": (b"(K\x01K\x02u", "parsed"),
    "ADDITEMS on it": (b"(K\x01\x90", "parsed"),
    "BUILD on it": (b"}b", "parsed"),
    "a call of it": (b")R", "a storage_data value is a PickledObject, not a _StorageInfo"),
    "NEWOBJ of it": (b")\x81", "a storage_data value is a PickledObject, not a _StorageInfo"),
    "DUP": (b"2", "SETITEMS with an odd number of items"),
    "MEMOIZE": (b"\x94", "parsed"),
    "LONG_BINPUT": (b"r\x9f\x86\x01\x00", "parsed"),
    "PUT": (b"p9999\n", "parsed"),
    "POP": (b"0", "SETITEMS with an odd number of items"),
    "a tuple of it": (b"\x85", "a storage_data value is a tuple, not a _StorageInfo"),
}
"""Opcodes right after the fourth ``storage_data`` entry (a ``StorageKey`` and a ``StorageRow`` on the stack), and
what the reference path says."""


@pytest.mark.parametrize("case", ON_A_ROW, ids=list(ON_A_ROW))
def test_opcodes_on_a_row_same_on_both_paths(case: str) -> None:
    inserted, said = ON_A_ROW[case]
    data = metadata(expert_tensors(6))
    storage = data.index(b"storage_data")
    builds = [pos + 1 for op, _, pos in pickletools.genops(data) if op.name == "BUILD" and pos > storage]
    mutated = spliced(data, builds[7], inserted)
    machine = unpickler.SafeUnpickler(mutated, limits=Limits())
    machine.dcp_items = True
    with contextlib.suppress(FastPathRefused, CkptfsError):
        machine.load()
    assert machine.dcp_storage_rows >= 3  # the entry before the opcode is a row
    fast, reference = both_paths(mutated)
    assert fast == reference
    if said == "parsed":
        assert fast[0] != "error"
    else:
        assert fast[0] == "error" and said in fast[2]


def test_a_row_shows_as_its_object_would() -> None:
    """In a message, a row reads as the reference path's object: a class made with no arguments."""
    row = StorageRow("__0_0.distcp", 0, 4)
    assert short_repr([row]) == short_repr([PickledObject(STORAGE_INFO)]) == f"[<{STORAGE_INFO.qualname}()>]"
