"""Differential tests of the pickle interpreter's parse paths: the fast path (inline opcodes, tensor records)
against the reference (every opcode through its ``OPCODES`` step, ``CKPTFS_PICKLE_FAST_PATHS=0``).

The same results are required for the torch-written corpus, every hostile case and seed, mutants of the seeds
(as the fuzzer makes them), and random opcode streams under tiny limits: the same tree, tensors and storages
(``info --json``'s text), or the same error by type and message.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile
from dcp_writers import simulate_ranks
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.cli.info import description_text
from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import DTYPES
from ckptfs.model.records import Storage, Tensor
from ckptfs.pickle import tensor_record, unpickler
from ckptfs.pickle.machine import no_handler
from ckptfs.pickle.values import Global, PickledObject, UnhashableKey
from ckptfs.sources import BytesSource
from hostile.cases import CASES, Case
from hostile.checks import fast_paths
from hostile.fuzz_target import Mutator
from hostile.seeds import SEED_NAMES

MUTANTS = 600
DCP_MUTANTS = 300


def opened(source: str | Path | BytesSource, limits: Limits = Limits()) -> Any:
    """What opening shows: ``info --json``'s text (tree, tensors, storages), or the error's type and message."""
    try:
        with ckptfs.open(source, limits=limits) as ck:
            try:
                return description_text(ck)
            except CkptfsError as exc:
                return ("describe", type(exc).__name__, str(exc))
    except CkptfsError as exc:
        return (type(exc).__name__, str(exc))


def both_paths(make: Any) -> tuple[Any, Any]:
    with fast_paths(True):
        fast = make()
    with fast_paths(False):
        reference = make()
    return fast, reference


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_same_on_both_paths(corpus: dict[str, CorpusFile], name: str) -> None:
    fast, reference = both_paths(lambda: opened(corpus[name].path))
    assert isinstance(fast, str)
    assert fast == reference


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_case_same_on_both_paths(case: Case, hostile_files: dict[str, Path]) -> None:
    fast, reference = both_paths(lambda: opened(hostile_files[case.name]))
    assert fast == reference


def test_seeds_and_their_mutants_same_on_both_paths(seeds: dict[str, bytes]) -> None:
    mutate = Mutator([seeds[name] for name in SEED_NAMES], random.Random(16))
    inputs = [seeds[name] for name in SEED_NAMES] + [mutate() for _ in range(MUTANTS)]
    outcomes = set()
    for data in inputs:
        fast, reference = both_paths(lambda data=data: opened(BytesSource(data, "fuzz.pt")))
        assert fast == reference
        outcomes.add(fast[0] if isinstance(fast, tuple) else "opened")
    assert {"opened", "UnpicklingError", "CorruptCheckpointError"} <= outcomes


def test_dcp_directory_and_its_mutants_same_on_both_paths(tmp_path: Path) -> None:
    """``.metadata`` is dataclasses (NEWOBJ, BUILD, SETITEMS…): the directory, then its pickle mutated (pinned: the
    same bytes, so the same mutants, on every run; ``test_dcp_fast_path_mutants`` tries many more)."""
    state = {f"layer.{n}.weight": torch.arange(32, dtype=torch.float32).reshape(8, 4) + n for n in range(6)}
    state["step"] = torch.tensor(7)
    base = tmp_path / "base"
    simulate_ranks(state, {name: (n % 2, 2 + n % 3) for n, name in enumerate(state) if name != "step"}, base, world=2,
                   pinned=True)
    fast, reference = both_paths(lambda: opened(base))
    assert isinstance(fast, str) and fast == reference
    metadata = (base / ".metadata").read_bytes()
    rng = random.Random(16)
    outcomes = set()
    for n in range(DCP_MUTANTS):
        data = bytearray(metadata)
        for _ in range(rng.choice((1, 1, 2, 4))):
            at = rng.randrange(len(data))
            if rng.random() < 0.1:
                del data[at:]
            else:
                data[at] = rng.randrange(256)
        mutant = tmp_path / f"m{n}"
        shutil.copytree(base, mutant)
        (mutant / ".metadata").write_bytes(bytes(data))
        fast, reference = both_paths(lambda mutant=mutant: opened(mutant))
        assert fast == reference
        outcomes.add(fast[0] if isinstance(fast, tuple) else "opened")
        shutil.rmtree(mutant)
    assert {"opened", "UnpicklingError", "CorruptCheckpointError"} <= outcomes


# -- random opcode streams --------------------------------------------------------------------------------------

SNIPPETS = [
    b"(", b")", b"}", b"]", b"N", b"\x88", b"\x89", b"K\x05", b"M\x01\x02", b"J\xff\xff\xff\xff", b"\x8c\x01a",
    b"X\x01\x00\x00\x00b", b"\x8c\x01\xff", b"\x94", b"q\x00", b"q\x01", b"r\x02\x00\x00\x00", b"h\x00", b"h\x01",
    b"j\x02\x00\x00\x00", b"h\x09", b"t", b"\x85", b"\x86", b"\x87", b"u", b"e", b"s", b"a", b"R", b"\x81", b"b",
    b"cmod\nname\n", b"ctorch._utils\n_rebuild_tensor_v2\n", b"ccollections\nOrderedDict\n", b"0", b"1", b"2",
    b"d", b"l", b"\x8f", b"\x90", b"\x91", b"Q", b")\x81\x94}\x94(", b"\x86\x94\x85\x94R\x94",
    (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nq\x03"
     b"X\x01\x00\x00\x000q\x04X\x03\x00\x00\x00cpuq\x05K\x04tq\x06Q"),
]
"""Opcodes with arguments, and a whole persistent id: each inline opcode, its neighbours and the table's."""
TENSOR = (b"ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01ctorch\nFloatStorage\nq\x02"
          b"X\x01\x00\x00\x000q\x03X\x03\x00\x00\x00cpuq\x04K\x04tq\x05QK\x00K\x04\x85q\x06K\x01\x85q\x07\x89"
          b"ccollections\nOrderedDict\nq\x08)Rq\x09tq\x0aRq\x0b")
"""One tensor record as torch writes it (``tensor_record.PATTERN`` matches it)."""


def inert_storage(pid: Any) -> Any:
    if isinstance(pid, tuple) and len(pid) == 5 and isinstance(pid[1], Global) and type(pid[4]) is int:
        return Storage(str(pid[2]), DTYPES["float32"], str(pid[3]), pid[4])
    return ("pid", pid)


def canonical(value: Any, seen: dict[int, int]) -> Any:
    """A comparable form of an interpreted value: types, contents and which objects are one."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, Global)):
        return (type(value).__name__, value)
    if id(value) in seen:
        return ("same", seen[id(value)])
    seen[id(value)] = len(seen)
    if isinstance(value, PickledObject):
        parts = (value.callable, value.args, value.kwargs, value.state, value.later_states, value.list_items,
                 value.dict_items)
        return ("object", *(canonical(p, seen) for p in parts))
    if isinstance(value, UnhashableKey):
        return ("unhashable", canonical(value.value, seen))
    if isinstance(value, Tensor):
        return ("tensor", value.dtype.name, value.shape, value.stride, value.storage_offset,
                canonical(value.storage, seen), value.requires_grad, value.conj, value.neg)
    if isinstance(value, Storage):
        return ("storage", value.key, value.dtype.name, value.location, value.numel)
    if isinstance(value, dict):
        return ("dict", [(canonical(k, seen), canonical(v, seen)) for k, v in value.items()])
    if isinstance(value, (list, tuple, set, frozenset, bytearray)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return (type(value).__name__, [canonical(v, seen) for v in items])
    return ("other", type(value).__name__)


def interpreted(data: bytes, limits: Limits, known: bool) -> Any:
    machine = unpickler.SafeUnpickler(data, resolve=rebuild.resolve if known else no_handler,
                                      persistent_load=inert_storage, limits=limits)
    try:
        return canonical(machine.load(), {}), machine.pos
    except CkptfsError as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(st.sampled_from(SNIPPETS + [TENSOR]), max_size=40), cut=st.integers(0, 6),
       stop=st.booleans(), depth=st.integers(1, 12), memo=st.integers(1, 24), known=st.booleans())
def test_random_opcodes_same_on_both_paths(parts: list[bytes], cut: int, stop: bool, depth: int, memo: int,
                                           known: bool) -> None:
    data = b"\x80\x02" + b"".join(parts) + (b"." if stop else b"")
    data = data[: len(data) - cut] if not stop else data
    limits = Limits(max_stack_depth=depth, max_memo_entries=memo)
    fast, reference = both_paths(lambda: interpreted(data, limits, known))
    assert fast == reference


@pytest.mark.parametrize("depth,memo", [(10_000_000, 10_000_000), (16, 12), (15, 40), (40, 11)])
def test_tensor_records_same_on_both_paths(depth: int, memo: int) -> None:
    assert tensor_record.PATTERN.fullmatch(TENSOR, TENSOR.index(b"(("))
    data = b"\x80\x02}(" + b"".join(b"\x8c\x01" + bytes([65 + n]) + TENSOR for n in range(3)) + b"u."
    fast, reference = both_paths(lambda: interpreted(data, Limits(max_stack_depth=depth, max_memo_entries=memo),
                                                     True))
    assert fast == reference
    if depth > 100:
        assert fast[0][0] == "dict" and len(fast[0][1]) == 3 and fast[0][1][0][1][0] == "tensor"


DATACLASS = b"\x80\x04cmod\nBox\n)\x81\x94}\x94(\x8c\x01a\x94cmod\nSize\nK\x01K\x02\x86\x94\x85\x94R\x94ub."
"""A dataclass pickled by protocol 4: both fused runs of six opcodes (``)\\x81\\x94}\\x94(`` and
``\\x86\\x94\\x85\\x94R\\x94``) at every limit around them."""


@pytest.mark.parametrize("depth", range(1, 8))
@pytest.mark.parametrize("memo", range(1, 9))
@pytest.mark.parametrize("known", [False, True])
def test_dataclass_runs_same_on_both_paths(depth: int, memo: int, known: bool) -> None:
    fast, reference = both_paths(lambda: interpreted(DATACLASS, Limits(max_stack_depth=depth, max_memo_entries=memo),
                                                     known))
    assert fast == reference
    if depth >= 4 and memo >= 6:
        assert fast[0][0] == "object" and fast[0][4][1][0][0] == ("str", "a")
