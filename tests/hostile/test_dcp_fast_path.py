"""The DCP ``.metadata`` fast path (``pickle.dcp_record``: tensor and ``storage_data`` items as rows) against the
reference path (every opcode through its table step), on what torch writes and on what it does not.

``parse_metadata``'s result (or its error, by type and message) must be the same on both paths for torch-written
directories, generated metadata (Hypothesis: dtypes, shapes, chunk counts, odd key names, byte ranges past
2**31, transforms, bytes items, planner_data and storage_meta variants, pickle protocols), byte mutants, and
every memo and stack limit around the items. Torch's own items must take the fast path.
"""

from __future__ import annotations

import pickle
import pickletools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from dcp_writers import save, simulate_ranks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptfs.errors import CkptfsError, UnpicklingError
from ckptfs.formats import dcp_columns
from ckptfs.formats.dcp_metadata import parse_metadata
from ckptfs.limits import Limits
from ckptfs.pickle import cscan, unpickler
from ckptfs.pickle.dcp_record import StorageRow, TensorRow
from ckptfs.pickle.values import UNBUILT, FastPathRefused
from hostile.checks import compiled_scanner, fast_paths

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int64, torch.bool,
          torch.float64, torch.complex64, torch.float8_e4m3fn, torch.uint16, torch.int32]
DIMS = [0, 1, 2, 3, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40]
BUILT = cscan.LIBRARY is not None
OFFSETS = [0, 1, 255, 65536, 2**31 - 1, 2**31, 2**40, 2**62]


def parsed(data: bytes, limits: Limits = Limits()) -> Any:
    try:
        return parse_metadata(data, limits)
    except CkptfsError as exc:
        return "error", type(exc).__name__, str(exc)


def both_paths(data: bytes, limits: Limits = Limits()) -> tuple[Any, Any]:
    """The pure-Python fast path's result and the reference's, once the compiled scanner's (where it is built and
    accepts the pickle, else the pure-Python paths') is checked to be the fast path's."""
    with fast_paths(True):
        compiled = parsed(data, limits)
        with compiled_scanner(False):
            fast = parsed(data, limits)
    with fast_paths(False):
        reference = parsed(data, limits)
    assert compiled == fast
    return fast, reference


def compiled(data: bytes) -> bool:
    """Whether the compiled scanner made the records (it is built, and accepted the pickle)."""
    with fast_paths(True):
        return dcp_columns.metadata(data, Limits()) is not None


def rows(data: bytes) -> tuple[int, int]:
    """Tensor and storage items ``load_dcp`` gave as rows (none when it parsed again on the reference path)."""
    with fast_paths(True):
        state = unpickler.load_dcp(data, Limits()).state
    return (sum(type(v) is TensorRow for v in state["state_dict_metadata"].values()),
            sum(type(v) is StorageRow for v in state["storage_data"].values()))


def metadata(tensors: list[tuple[str, torch.dtype, tuple[int, ...], int, bool]], *, bytes_items: int = 0,
             transforms: bool = False, planner: str = "flat", storage_meta: bool = True,
             version: str | None = "1.0.0", protocol: int = 4, offsets: list[int] | None = None) -> bytes:
    """A ``.metadata`` pickled as ``FileSystemWriter.finish`` does (``pickle.dump`` of torch's classes): each
    tensor cut into ``parts`` boxes along dimension 0, stored round-robin in two files; with ``transforms``, the
    second box stored is zstd-compressed."""
    items: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    files = ["__0_0.distcp", "__1_0.distcp"]
    starts = iter(offsets or [n * 1500 for n in range(10_000)])
    for name, dtype, shape, parts, grad in tensors:
        size = torch.Size(shape)
        rows_each = -(-shape[0] // parts) if shape and shape[0] else 0
        boxes = []
        for n in range(parts if shape and shape[0] else 1):
            first = min(n * rows_each, shape[0]) if shape else 0
            box_offsets = torch.Size([first] + [0] * (len(shape) - 1)) if shape else torch.Size(())
            box_sizes = torch.Size([min(rows_each, shape[0] - first)] + list(shape[1:])) if shape else size
            boxes.append(ChunkStorageMetadata(offsets=box_offsets, sizes=box_sizes))
            storage[MetadataIndex(name, box_offsets, n)] = _StorageInfo(
                files[n % 2], next(starts), 1500, ["stream.zstd/1"] if transforms and len(storage) == 1 else None)
        properties = TensorProperties(dtype=dtype, requires_grad=grad)
        items[name] = TensorStorageMetadata(properties=properties, size=size, chunks=boxes)
    for n in range(bytes_items):
        items[f"extra.{n}"] = BytesStorageMetadata()
        storage[MetadataIndex(f"extra.{n}")] = _StorageInfo(files[0], next(starts), 100)
    planner_data: Any = None
    if planner == "flat":
        planner_data = {name: (name,) for name in items}
    elif planner == "nested":
        planner_data = {name: ("model", n, name) for n, name in enumerate(items)}
    meta = StorageMeta(checkpoint_id="/tmp/x", save_id="s", load_id=None) if storage_meta else None
    result = Metadata(state_dict_metadata=items, planner_data=planner_data, storage_data=storage, storage_meta=meta)
    result.version = version
    return pickle.dumps(result, protocol=protocol)


def expert_tensors(count: int) -> list[tuple[str, torch.dtype, tuple[int, ...], int, bool]]:
    return [(f"model.layers.{n // 8}.mlp.experts.{n % 8}.w1.weight", DTYPES[n % 4], (8, 2 + n % 3), 1 + n % 3,
             False) for n in range(count)]


def test_torch_written_directories_take_the_fast_path_and_agree(tmp_path: Path) -> None:
    state = {f"layer.{n}.weight": torch.arange(32, dtype=torch.float32).reshape(8, 4).to(DTYPES[n % 4]) + n
             for n in range(12)}
    state["step"] = torch.tensor(7)
    state["scale"] = torch.tensor(0.5, dtype=torch.float64)
    state["extra"] = {"lr": 0.1}
    plain = tmp_path / "plain"
    save(state, plain)
    sharded = tmp_path / "sharded"
    simulate_ranks(state, {name: (0, 2 + n % 3) for n, name in enumerate(state) if "layer" in name}, sharded,
                   world=3)
    for directory in (plain, sharded):
        data = (directory / ".metadata").read_bytes()
        fast, reference = both_paths(data)
        assert fast[0] != "error" and fast == reference
        tensors = sum(item is not None for item in fast.items.values())
        tensor_rows, storage_rows = rows(data)
        # The first item names every class and key: it goes through the opcodes, and so does each bytes item.
        assert tensor_rows >= tensors - 1
        assert storage_rows >= len([k for k in fast.storage if k[1] is not None]) - 1
        assert compiled(data) == BUILT


def test_generated_metadata_takes_the_fast_path() -> None:
    data = metadata(expert_tensors(600), bytes_items=2, transforms=True, offsets=OFFSETS * 500)
    fast, reference = both_paths(data)
    assert fast[0] != "error" and fast == reference
    tensor_rows, storage_rows = rows(data)
    frames = sum(op.name == "FRAME" for op, _, _ in pickletools.genops(data))
    # Not: the first item, whose classes and keys are literals, and one item across each frame boundary.
    assert 599 - frames <= tensor_rows <= 599
    chunks = sum(len(item.chunks) for item in fast.items.values() if item is not None)
    assert chunks - 2 - frames <= storage_rows <= chunks - 2  # the first, and the one with transforms
    assert fast.storage[("model.layers.0.mlp.experts.3.w1.weight", (0, 0))].offset in OFFSETS
    # transform_descriptors are left to the pure-Python paths; without them, the compiled scanner reads it all
    assert not compiled(data)
    plain = metadata(expert_tensors(600), bytes_items=2, planner="nested", offsets=OFFSETS * 500)
    assert compiled(plain) == BUILT
    assert both_paths(plain)[0] == both_paths(plain)[1]


names = st.text(st.characters(codec="utf-8", exclude_categories=()), min_size=1, max_size=300)
shapes = st.lists(st.sampled_from(DIMS), max_size=5).map(tuple)
tensor_specs = st.tuples(names, st.sampled_from(DTYPES), shapes, st.integers(1, 4), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(tensor_specs, min_size=1, max_size=8, unique_by=lambda t: t[0]),
       bytes_items=st.integers(0, 2), transforms=st.booleans(), planner=st.sampled_from(["flat", "nested", "none"]),
       storage_meta=st.booleans(), version=st.sampled_from(["1.0.0", None]), protocol=st.sampled_from([2, 4, 5]),
       offsets=st.lists(st.sampled_from(OFFSETS), min_size=40, max_size=40))
def test_generated_metadata_same_on_both_paths(specs: list[Any], bytes_items: int, transforms: bool, planner: str,
                                               storage_meta: bool, version: str | None, protocol: int,
                                               offsets: list[int]) -> None:
    data = metadata(specs, bytes_items=bytes_items, transforms=transforms, planner=planner,
                    storage_meta=storage_meta, version=version, protocol=protocol, offsets=offsets)
    fast, reference = both_paths(data)
    assert fast == reference


ascii_names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=60)
small_shapes = st.lists(st.sampled_from([0, 1, 2, 3, 255, 256, 65536]), max_size=3).map(tuple)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(st.tuples(ascii_names, st.sampled_from(DTYPES), small_shapes, st.integers(1, 4), st.booleans()),
                      min_size=1, max_size=8, unique_by=lambda t: t[0]),
       bytes_items=st.integers(0, 2), planner=st.sampled_from(["flat", "nested", "none"]),
       storage_meta=st.booleans(), version=st.sampled_from(["1.0.0", None]), protocol=st.sampled_from([4, 5]),
       offsets=st.lists(st.sampled_from(OFFSETS), min_size=40, max_size=40))
def test_generated_metadata_of_torch_forms_compiled(specs: list[Any], bytes_items: int, planner: str,
                                                    storage_meta: bool, version: str | None, protocol: int,
                                                    offsets: list[int]) -> None:
    """ASCII names, sizes of fewer than 2**62 elements, no transforms: the compiled scanner reads them all."""
    data = metadata(specs, bytes_items=bytes_items, planner=planner, storage_meta=storage_meta, version=version,
                    protocol=protocol, offsets=offsets)
    fast, reference = both_paths(data)
    assert fast == reference
    assert compiled(data) == BUILT


@pytest.mark.parametrize("transforms", [True, False])
def test_mutants_same_on_both_paths(transforms: bool) -> None:
    """Without transforms, the compiled scanner reads the base (and some mutants): three paths compared."""
    base = metadata(expert_tensors(40), bytes_items=1, transforms=transforms, offsets=OFFSETS * 20)
    rng = random.Random(24)
    outcomes = set()
    scanned = 0
    for _ in range(400):
        data = bytearray(base)
        for _ in range(rng.choice((1, 1, 2, 4))):
            at = rng.randrange(len(data))
            if rng.random() < 0.05:
                del data[at:]
            elif rng.random() < 0.3:
                data[at:at] = bytes([rng.randrange(256)])
            else:
                data[at] = rng.randrange(256)
        fast, reference = both_paths(bytes(data))
        assert fast == reference
        outcomes.add(fast[1] if fast[0] == "error" else "parsed")
        scanned += compiled(bytes(data))
    assert {"parsed", "UnpicklingError", "CorruptCheckpointError"} <= outcomes
    assert (scanned > 4) == (BUILT and not transforms)


@pytest.mark.parametrize("depth", [1, 2, 5, 9, 15, 16, 17, 20, 40])
def test_stack_limits_same_on_both_paths(depth: int) -> None:
    data = metadata(expert_tensors(6))
    fast, reference = both_paths(data, Limits(max_stack_depth=depth))
    assert fast == reference


def test_memo_limits_same_on_both_paths() -> None:
    data = metadata(expert_tensors(6))
    with fast_paths(False):
        machine = unpickler.SafeUnpickler(data, limits=Limits())
        machine.load()
        used = len(machine.memo)
    for memo in range(1, used + 2):
        fast, reference = both_paths(data, Limits(max_memo_entries=memo))
        assert fast == reference
        assert (fast[0] == "error") == (memo < used)


@pytest.mark.parametrize("form", ["BINGET", "LONG_BINGET", "GET"])
def test_a_get_of_an_unmade_object_parses_again_on_the_reference_path(form: str) -> None:
    """A later get of an object the fast path did not make (here: planner_data's first path replaced by a get of
    the second item's ``TensorStorageMetadata``) stops the fast parse; ``load_dcp`` then gives the reference's
    result."""
    data = metadata(expert_tensors(3))
    machine = unpickler.SafeUnpickler(data, limits=Limits())
    machine.dcp_items = True
    machine.load()
    unbuilt = [index for index, value in machine.memo.items() if value is UNBUILT]
    ops = [(op.name, pos) for op, _, pos in pickletools.genops(data) if pos > data.index(b"planner_data")]
    first_tuple = next(n for n, (name, _) in enumerate(ops) if name == "TUPLE1")
    value_get, tuple_end = ops[first_tuple - 1][1], ops[first_tuple][1] + 1
    target = min(unbuilt)
    get = {"BINGET": b"h" + bytes([target]), "LONG_BINGET": b"j" + target.to_bytes(4, "little"),
           "GET": b"g%d\n" % target}[form]  # GET: through its table step, not inline
    mutated = bytearray(data[:value_get] + get + data[tuple_end:])
    frame = max(pos for op, _, pos in pickletools.genops(data) if op.name == "FRAME" and pos < value_get)
    length = int.from_bytes(data[frame + 1 : frame + 9], "little") + len(get) - (tuple_end - value_get)
    mutated[frame + 1 : frame + 9] = length.to_bytes(8, "little")  # the frame holding the change stays whole
    mutated = bytes(mutated)
    machine = unpickler.SafeUnpickler(mutated, limits=Limits())
    machine.dcp_items = True
    with pytest.raises(FastPathRefused):
        machine.load()
    fast, reference = both_paths(mutated)
    assert fast == reference
    assert fast[1] == "CorruptCheckpointError" and "planner_data path" in fast[2]


def test_a_rewritten_memo_turns_the_fast_path_off() -> None:
    """A ``BINPUT`` over the slot of the ``'offsets'`` key between two items: the next items' gets of it no longer
    find the key the checked gets found, so the opcodes must run them (and say what is wrong)."""
    data = metadata(expert_tensors(6))
    slot = next(index for index, value in _memo(data).items() if value == "offsets")
    at = data.index(b"\x8c&model.layers.0.mlp.experts.4.w1.weight")
    inserted = b"\x8c\x01xq" + bytes([slot]) + b"0"  # push 'x', put it in the slot, pop
    mutated = bytearray(data[:at] + inserted + data[at:])
    frame = max(pos for op, _, pos in pickletools.genops(data) if op.name == "FRAME" and pos < at)
    length = int.from_bytes(data[frame + 1 : frame + 9], "little") + len(inserted)
    mutated[frame + 1 : frame + 9] = length.to_bytes(8, "little")
    fast, reference = both_paths(bytes(mutated))
    assert fast == reference
    assert fast[1] == "CorruptCheckpointError" and "chunk offsets" in fast[2]


def _memo(data: bytes) -> dict[int, Any]:
    machine = unpickler.SafeUnpickler(data, limits=Limits())
    machine.dcp_items = True
    machine.load()
    return machine.memo


def test_a_wrong_declared_length_is_left_to_the_opcodes() -> None:
    data = metadata(expert_tensors(3))
    name = b"model.layers.0.mlp.experts.2.w1.weight"
    at = data.index(name)
    mutated = data[: at - 1] + bytes([len(name) + 3]) + data[at:]
    fast, reference = both_paths(mutated)
    assert fast == reference
    assert fast[1] == UnpicklingError.__name__
