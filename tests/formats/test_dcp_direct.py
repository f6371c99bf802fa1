"""The compiled scanner's direct rows (``_cscan_dcp_join.c``; tensors made by ``dcp_tree.DcpTree.add_scanned``)
against the pure-Python paths, on ``.metadata`` pickles that take each way through the join: planner keys and
storage FQNs that are the items' own strings in the items' order (joined by position) or not (hashed), renamed,
nested, absent or missing planner paths, keys set twice, chunks not in ``storage_data``, files too short or not
there. A directory opens to the same ``info --json`` text, or the same error, on every path."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile.checks import compiled_scanner, fast_paths, three_paths
from hostile.test_parse_paths import opened
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptfs.formats import dcp_columns
from ckptfs.limits import Limits
from ckptfs.pickle import cscan

BUILT = cscan.LIBRARY is not None
FILES = ("__0_0.distcp", "__1_0.distcp")
BLOB = 1000


def copy(text: str) -> str:
    """An equal str that is another object: pickled on its own, not got again through the memo."""
    return "".join(list(text))


def metadata(names: list[str], *, planner: Any = "flat", fresh: bool = False, order: int = 1,
             shapes: dict[str, tuple[int, ...]] | None = None, extra: dict[MetadataIndex, _StorageInfo] | None = None,
             missing: tuple[str, ...] = (), bytes_items: tuple[str, ...] = ()) -> bytes:
    """``pickle.dump`` of torch's ``Metadata``, as ``FileSystemWriter.finish`` writes it: each tensor one chunk of
    its size in file n % 2. ``fresh``: planner keys and storage FQNs equal strings of their own; ``order`` -1:
    planner_data and storage_data in reverse; ``planner``: "flat", None, or a dict of paths by name; ``missing``:
    tensors without a storage entry."""
    items: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    dtypes = (torch.float32, torch.bfloat16, torch.int8)
    for n, name in enumerate(names):
        if name in bytes_items:
            items[name] = BytesStorageMetadata()
            storage[MetadataIndex(copy(name) if fresh else name)] = _StorageInfo(FILES[n % 2], n * BLOB, BLOB)
            continue
        size = torch.Size((shapes or {}).get(name, (2, 3 + n % 2)))
        offsets = torch.Size([0] * len(size))
        items[name] = TensorStorageMetadata(TensorProperties(dtype=dtypes[n % 3], requires_grad=n % 4 == 1), size,
                                            [ChunkStorageMetadata(offsets, torch.Size(size))])
        if name not in missing:
            storage[MetadataIndex(copy(name) if fresh else name, offsets, 0)] = _StorageInfo(FILES[n % 2], n * BLOB,
                                                                                            BLOB)
    storage.update(extra or {})
    plan: Any = planner
    if planner == "flat":
        plan = {copy(name) if fresh else name: (name,) for name in names}
    if isinstance(plan, dict):
        plan = dict(list(plan.items())[::order])
    result = Metadata(state_dict_metadata=items, planner_data=plan, storage_data=dict(list(storage.items())[::order]))
    result.version = "1.0.0"
    return pickle.dumps(result, protocol=4)


def directory(out: Path, data: bytes, sizes: tuple[int, ...] = (1 << 20, 1 << 20)) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / ".metadata").write_bytes(data)
    for name, size in zip(FILES, sizes):
        with open(out / name, "wb") as f:
            f.truncate(size)
    return out


def direct_items(data: bytes) -> int | None:
    """How many items the compiled scanner's direct rows make, None when it made none (or refused)."""
    with compiled_scanner(True), fast_paths(True):
        scanned = dcp_columns.scan(data, Limits())
    if scanned is None or not scanned.direct:
        return None
    return sum(key >= 0 for key in scanned.tables["direct"].tolist()[2::11])


def same_on_every_path(path: Path) -> Any:
    made, python, reference = three_paths(lambda: opened(path))
    assert made == python == reference
    return made


NAMES = [f"model.layers.{n}.w{n % 3}" for n in range(12)]


@pytest.mark.parametrize("fresh", [False, True])
@pytest.mark.parametrize("order", [1, -1])
@pytest.mark.parametrize("planner", ["flat", None, {}])
def test_joined_by_position_or_hashed(tmp_path: Path, fresh: bool, order: int, planner: Any) -> None:
    data = metadata(NAMES, planner=planner, fresh=fresh, order=order)
    made = same_on_every_path(directory(tmp_path, data))
    assert isinstance(made, str) and '"chunked_tensors": 12' in made
    assert direct_items(data) == (len(NAMES) if BUILT else None)


def test_planner_paths_renamed_nested_and_missing(tmp_path: Path) -> None:
    planner = {NAMES[0]: ("renamed",), NAMES[1]: ("model", NAMES[1]), NAMES[2]: ("list", 0),
               NAMES[3]: ("list", 1), NAMES[4]: (NAMES[4], 7), NAMES[5]: (3,)}
    planner.update({name: (name,) for name in NAMES[7:]})  # NAMES[6]: no path, its FQN is its key
    for order in (1, -1):
        data = metadata(NAMES, planner=planner, order=order)
        made = same_on_every_path(directory(tmp_path / f"o{order}", data))
        assert isinstance(made, str) and '"renamed"' in made
        assert direct_items(data) == (len(NAMES) - 5 if BUILT else None)


def test_two_items_at_one_key(tmp_path: Path) -> None:
    data = metadata(NAMES[:3], planner={NAMES[0]: ("x",), NAMES[1]: ("y",), NAMES[2]: ("x",)})
    made = same_on_every_path(directory(tmp_path, data))
    assert made[0] == "CorruptCheckpointError" and "given twice" in made[1]


def test_bytes_items_shapes_and_chunks_not_stored(tmp_path: Path) -> None:
    shapes = {NAMES[1]: (), NAMES[2]: (0, 5), NAMES[3]: (4,), NAMES[4]: (1, 1, 1, 1, 1, 1)}
    data = metadata(NAMES, shapes=shapes, bytes_items=(NAMES[5],))
    made = same_on_every_path(directory(tmp_path / "bytes", data))
    assert made[0] == "CorruptCheckpointError" and NAMES[5] in made[1]  # its blob is no torch.save archive
    assert direct_items(data) == (len(NAMES) - 1 if BUILT else None)
    for fresh in (False, True):
        data = metadata(NAMES, shapes=shapes, missing=(NAMES[7],), fresh=fresh)
        made = same_on_every_path(directory(tmp_path / f"missing{fresh}", data))
        assert made[0] == "CorruptCheckpointError"
        assert made[1].endswith(f": {NAMES[7]!r} at [0, 0] is not in storage_data")
        assert direct_items(data) == (len(NAMES) - 1 if BUILT else None)


def test_storage_entries_beyond_the_items(tmp_path: Path) -> None:
    """Entries no item reads (another file, a None offset) are counted among the files, not joined."""
    extra = {MetadataIndex(NAMES[0]): _StorageInfo("other.distcp", 0, 5),
             MetadataIndex(NAMES[1], torch.Size((1, 0)), 0): _StorageInfo("third.distcp", 0, 5)}
    for order in (1, -1):
        data = metadata(NAMES, extra=extra, order=order)
        made = same_on_every_path(directory(tmp_path / f"o{order}", data))
        assert isinstance(made, str) and '"files": 5' in made
        assert direct_items(data) == (len(NAMES) if BUILT else None)


def test_files_too_short_or_not_there(tmp_path: Path) -> None:
    data = metadata(NAMES)
    made = same_on_every_path(directory(tmp_path / "short", data, (1 << 20, 4 * BLOB)))
    assert made[0] == "CorruptCheckpointError" and "which has 4000 bytes" in made[1]
    path = directory(tmp_path / "gone", data)
    (path / FILES[1]).unlink()
    made = same_on_every_path(path)
    assert made[0] == "CorruptCheckpointError" and "which is not in the directory" in made[1]


def _twice(data: bytes, name: str, other: str) -> bytes:
    """``data`` with every string ``other`` made ``name`` (of the same length): keys set twice."""
    assert len(name) == len(other) and bytes([len(other)]) + other.encode() in data
    return data.replace(bytes([len(other)]) + other.encode(), bytes([len(name)]) + name.encode())


def test_keys_set_twice(tmp_path: Path) -> None:
    """An item twice makes no direct rows; a storage key or planner key twice has its last value."""
    data = _twice(metadata(NAMES), NAMES[0], NAMES[3])
    made = same_on_every_path(directory(tmp_path / "items", data))
    assert isinstance(made, str)
    assert direct_items(data) is None
    other = "model.layers.X.wX"
    for fresh in (False, True):
        storage = {MetadataIndex(other, torch.Size((0, 0)), 0): _StorageInfo("late.distcp", 0, 5)}
        data = _twice(metadata(NAMES, extra=storage, fresh=fresh), NAMES[0], other)
        made = same_on_every_path(directory(tmp_path / f"storage{fresh}", data))
        assert made[0] == "CorruptCheckpointError" and "'late.distcp', which is not in the directory" in made[1]
        planner = {name: (name,) for name in NAMES} | {other: ("moved",)}
        data = _twice(metadata(NAMES, planner=planner, fresh=fresh), NAMES[0], other)
        made = same_on_every_path(directory(tmp_path / f"planner{fresh}", data))
        assert isinstance(made, str) and '"moved"' in made
        assert direct_items(data) == (len(NAMES) if BUILT else None)


def _join_hash(name: str) -> int:
    """``hash()`` of ``_cscan_dcp_join.c`` for a text key (rank -2): the 8-byte words in the machine's order (its
    memcpy), the tail's bytes first to last, each mixed in."""
    mask = (1 << 64) - 1

    def mix(h: int) -> int:
        h ^= h >> 32
        h = h * 0xD6E8FEB86659FD93 & mask
        return h ^ h >> 32

    text = name.encode()
    whole = len(text) - len(text) % 8
    h = (len(text) * 0x9E3779B97F4A7C15 & mask) ^ (-2 & mask)
    for at in range(0, whole, 8):
        h = mix(h ^ int.from_bytes(text[at:at + 8], sys.byteorder))
    return mix(h ^ int.from_bytes(text[whole:], "big"))


def _colliding(count: int) -> list[str]:
    """``count`` names in one slot of the join's table of names (128 slots for up to 64 items): each one inserted
    probes every one before it."""
    candidates = (f"model.layers.{n}.weight" for n in range(1_000_000))
    names = [next(candidates)]
    first = _join_hash(names[0]) & 127
    while len(names) < count:
        name = next(candidates)
        if _join_hash(name) & 127 == first:
            names.append(name)
    return names


def test_keys_colliding_past_the_probe_bound(tmp_path: Path) -> None:
    """Names crafted to collide in the join's hash table: n of them probe n(n-1)/2 slots against a bound of 16 a row
    (PROBES_PER_ROW) and one, 16(n+1): 33 names (528 probes) stay within it and are joined, 34 (561) are past it
    (560) and the join is given up: the records' path then makes the same tensors."""
    for count, joined in ((33, True), (34, False)):
        data = metadata(_colliding(count))
        made = same_on_every_path(directory(tmp_path / str(count), data))
        assert isinstance(made, str) and f'"chunked_tensors": {count}' in made
        assert direct_items(data) == (count if BUILT and joined else None)
