"""The legacy stream format: storage boundaries, big pickles, corruption, old-style pickles built by hand."""

from __future__ import annotations

import io
import pickle
import pickletools
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from checks import check_checkpoint
from corpus import CorpusFile, load_expected, save_legacy

import ckptfs
from ckptfs.errors import CorruptCheckpointError

LEGACY = ["r1_views_containers_legacy", "r2_every_dtype_legacy", "r3_legacy", "r9_protocol4_legacy",
          "whole_module_legacy"]
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
COUNT = struct.Struct("<q")


def pickle_ends(data: bytes, count: int) -> list[int]:
    """End offsets of the first ``count`` pickles in ``data``, found by walking opcodes (nothing is loaded)."""
    ends, stream = [], io.BytesIO(data)
    for _ in range(count):
        for opcode, _, _ in pickletools.genops(stream):
            if opcode.name == "STOP":
                break
        ends.append(stream.tell())
    return ends


@pytest.mark.parametrize("name", LEGACY)
def test_storages_tile_the_file_after_the_key_list(corpus: dict[str, CorpusFile], name: str) -> None:
    data = corpus[name].path.read_bytes()
    keys_start, keys_end = pickle_ends(data, 5)[3:]
    keys = pickle.loads(data[keys_start:keys_end])
    with ckptfs.open(corpus[name].path) as ck:
        roots = {s.key: s for s in ck.storages if s.base is None}
        assert sorted(roots) == sorted(keys)
        position = keys_end
        for key in keys:
            storage = roots[key]
            (count,) = COUNT.unpack_from(data, position)
            assert (storage.offset, count) == (position + COUNT.size, storage.numel), key
            position = storage.offset + storage.nbytes
        assert position == len(data)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_main_pickle_larger_than_the_first_window(tmp_path: Path, protocol: int) -> None:
    """Protocol 4/5 pickles are framed; a window cutting a frame must grow, not fail."""
    obj = {f"layer_{i:04d}_" + "x" * 100: torch.tensor([i, -i], dtype=torch.int16) for i in range(800)}
    path = save_legacy(obj, tmp_path / "big_pickle.pt", pickle_protocol=protocol)
    assert pickle_ends(path.read_bytes(), 4)[3] > 64 * 1024
    check_checkpoint(path, load_expected(path, obj), random.Random(protocol))


def test_torch_cannot_load_v3_dtypes_from_legacy_files_but_ckptfs_can(corpus: dict[str, CorpusFile]) -> None:
    """Spec §3.3: the corpus oracle falls back to the saved object exactly where torch fails."""
    entry = corpus["r2_every_dtype_legacy"]
    with pytest.raises(AttributeError, match="UntypedStorage' has no attribute 'dtype'"):
        torch.load(entry.path, weights_only=False)
    with ckptfs.open(entry.path) as ck:
        assert ck.tensor(("uint16", "transposed")).dtype.name == "uint16"


# -- corruption ----------------------------------------------------------------------------


@pytest.fixture
def small_legacy(tmp_path: Path) -> Path:
    return save_legacy({"a": torch.arange(6.0), "b": torch.arange(4, dtype=torch.int8)}, tmp_path / "small.pt")


def test_count_header_disagreeing_with_pickle(small_legacy: Path) -> None:
    with ckptfs.open(small_legacy) as ck:
        storage = ck.tensor(("a",)).storage
    data = bytearray(small_legacy.read_bytes())
    COUNT.pack_into(data, storage.offset - COUNT.size, 5)
    small_legacy.write_bytes(data)
    with ckptfs.open(small_legacy) as ck:
        assert ck.read(ck.tensor(("b",))) == bytes(range(4))
        with pytest.raises(CorruptCheckpointError, match="declares 6 elements in the pickle but 5 in its header"):
            ck.read(ck.tensor(("a",)))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d[:-1], r"legacy storages end at byte \d+ but the file has \d+ bytes"),
    (lambda d: d + b"\0", r"legacy storages end at byte \d+ but the file has \d+ bytes"),
    (lambda d: d[:120], "truncated"),
])
def test_damaged_files_fail_to_open(small_legacy: Path, edit: Any, message: str) -> None:
    small_legacy.write_bytes(edit(small_legacy.read_bytes()))
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        ckptfs.open(small_legacy)
    assert str(info.value).startswith(f"{small_legacy}: ")


# -- old-style pickles, built by hand ------------------------------------------------------------


class StorageRef:
    """A legacy persistent id: a root storage, or a view ``(view_key, offset, numel)`` of one (spec §3.4)."""

    def __init__(self, key: str, cls: type, numel: int, view: tuple[str, int, int] | None = None) -> None:
        self.pid = ("storage", cls, key, "cpu", numel, view)


class RebuildV1:
    """Pickles as the 4-argument ``torch._utils._rebuild_tensor`` of old files."""

    def __init__(self, storage: StorageRef, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.args = (storage, offset, size, stride)

    def __reduce__(self) -> tuple[Any, ...]:
        return torch._utils._rebuild_tensor, self.args


class RebuildV2(RebuildV1):
    def __reduce__(self) -> tuple[Any, ...]:
        from collections import OrderedDict

        return torch._utils._rebuild_tensor_v2, (*self.args, False, OrderedDict())


def write_legacy(path: Path, obj: Any, roots: dict[str, tuple[type, bytes, int]]) -> Path:
    """A legacy stream: header pickles, ``obj`` (whose ``pid`` attributes become persistent ids), the storages."""

    class Pickler(pickle.Pickler):
        def persistent_id(self, value: Any) -> Any:
            return getattr(value, "pid", None)

    out = io.BytesIO()
    for header in (MAGIC_NUMBER, 1001, {"protocol_version": 1001, "little_endian": True, "type_sizes": {}}):
        pickle.dump(header, out, protocol=2)
    Pickler(out, protocol=2).dump(obj)
    pickle.dump(list(roots), out, protocol=2)
    for _, data, numel in roots.values():
        out.write(COUNT.pack(numel) + data)
    path.write_bytes(out.getvalue())
    return path


def test_rebuild_tensor_v1_and_storage_views(tmp_path: Path) -> None:
    floats = torch.arange(12, dtype=torch.float32)
    doubles = torch.arange(5, dtype=torch.float64) / 3
    root = StorageRef("root", torch.FloatStorage, 12)
    view = StorageRef("root", torch.FloatStorage, 12, ("view", 4, 6))
    only_via_view = StorageRef("d", torch.DoubleStorage, 5, ("dview", 1, 3))
    obj = {
        "v1": RebuildV1(root, 2, (2, 3), (3, 1)),
        "v1_on_view": RebuildV1(view, 1, (2, 2), (1, 2)),
        "v2_on_view": RebuildV2(view, 0, (6,), (1,)),
        "view_of_unlisted_root": RebuildV1(only_via_view, 0, (3,), (1,)),
    }
    path = write_legacy(tmp_path / "old.pt", obj, {
        "root": (torch.FloatStorage, floats.numpy().tobytes(), 12),
        "d": (torch.DoubleStorage, doubles.numpy().tobytes(), 5),
    })
    expected = load_expected(path, None)
    assert torch.equal(expected.tensors[("v1_on_view",)], torch.tensor([[5.0, 7.0], [6.0, 8.0]]))
    assert torch.equal(expected.tensors[("view_of_unlisted_root",)], doubles[1:4])
    check_checkpoint(path, expected, random.Random(1))


def test_view_running_past_its_root(tmp_path: Path) -> None:
    view = StorageRef("root", torch.FloatStorage, 4, ("view", 2, 3))
    path = write_legacy(tmp_path / "bad_view.pt", {"t": RebuildV1(view, 0, (3,), (1,))},
                        {"root": (torch.FloatStorage, bytes(16), 4)})
    with pytest.raises(CorruptCheckpointError, match="storage view 'view' runs past its root storage 'root'"):
        ckptfs.open(path)


def test_rebuild_tensor_v1_past_its_storage(tmp_path: Path) -> None:
    root = StorageRef("root", torch.FloatStorage, 4)
    path = write_legacy(tmp_path / "overrun.pt", {"t": RebuildV1(root, 1, (2, 2), (2, 1))},
                        {"root": (torch.FloatStorage, bytes(16), 4)})
    with pytest.raises(CorruptCheckpointError, match=r"needs 20 bytes but storage 'root' holds 16"):
        ckptfs.open(path)


def test_unlisted_root_storage(tmp_path: Path) -> None:
    root = StorageRef("root", torch.FloatStorage, 1)
    path = write_legacy(tmp_path / "unlisted.pt", {"t": RebuildV1(root, 0, (1,), (1,))}, {})
    with pytest.raises(CorruptCheckpointError, match="'root' is referenced but not in the key list"):
        ckptfs.open(path)


def test_unknown_persistent_id(tmp_path: Path) -> None:
    class Weird:
        pid = ("tensor", "x")

    path = write_legacy(tmp_path / "weird.pt", {"t": Weird()}, {})
    with pytest.raises(CorruptCheckpointError, match="unexpected persistent id"):
        ckptfs.open(path)


def test_not_a_legacy_magic(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    path.write_bytes(pickle.dumps(12345, protocol=2) + pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(ckptfs.NotACheckpointError, match="no legacy magic number"):
        ckptfs.open(path)


def test_wrong_legacy_protocol_version(tmp_path: Path) -> None:
    path = tmp_path / "v1000.pt"
    path.write_bytes(pickle.dumps(MAGIC_NUMBER, protocol=2) + pickle.dumps(1000, protocol=2))
    with pytest.raises(ckptfs.UnsupportedError, match="legacy protocol version 1000"):
        ckptfs.open(path)
