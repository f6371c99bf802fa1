"""Hostile torch.distributed.checkpoint directories (and directories of safetensors files, as
``HuggingFaceStorageWriter`` writes them), made byte by byte (no torch): a ``.metadata`` pickle of the
classes torch writes, and ``.distcp`` files of hand-made torch.save blobs. A case is a directory: a dict of file
name → bytes (or ``Link``), written to a temporary directory by the fixtures and the fuzzer.

The valid layout: ``model.w`` (float32 4×2, rows 0-1 in ``__0_0.distcp``, rows 2-3 in ``__1_0.distcp``),
``model.b`` (float32 [1, 2, 3], after the first blob of ``__0_0.distcp``) and ``step`` (a pickled 5); each
case changes what the metadata says or what the files hold.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Callable

import ckptfs
from ckptfs.errors import CkptfsError, CorruptCheckpointError, NotACheckpointError, UnsupportedError
from ckptfs.pickle.values import PickledObject
from hostile.cases import Env, Link, case
from hostile.containers import zip_checkpoint
from hostile.picklegen import (
    BUILD,
    EMPTY_TUPLE,
    NEWOBJ,
    call,
    dct,
    glob,
    i,
    ints,
    lst,
    pickle,
    s,
    storage_pid,
    tensor_v2,
    tup,
)

META = "torch.distributed.checkpoint.metadata"
META_1_13 = "torch.distributed._shard.checkpoint.metadata"
SHARDED_META = "torch.distributed._shard.sharded_tensor.metadata"
W = struct.pack("<8f", *range(8))
B = struct.pack("<3f", 1.0, 2.0, 3.0)


def _obj(module: str, name: str, state: bytes) -> bytes:
    return glob(module, name) + EMPTY_TUPLE + NEWOBJ + state + BUILD


def _attrs(**fields: bytes) -> bytes:
    return dct(*((s(k), v) for k, v in fields.items()))


def _size(values: tuple[int, ...]) -> bytes:
    return call(glob("torch", "Size"), ints(*values))


def _properties(dtype: str, torch_1_13: bool = False) -> bytes:
    module, encoding = (SHARDED_META, "MEM_FORMAT_ENCODING") if torch_1_13 else (META, "_MEM_FORMAT_ENCODING")
    return _obj(module, "TensorProperties", tup(glob("torch", dtype),
                                                call(glob("torch.serialization", "_get_layout"), s("torch.strided")),
                                                b"\x89", call(glob(module, encoding), i(0)), b"\x89"))


def _blob(values: bytes, shape: tuple[int, ...]) -> bytes:
    """torch.save of one contiguous float32 tensor of ``shape`` holding ``values``."""
    stride = tuple(_c_stride(shape, n) for n in range(len(shape)))
    numel = len(values) // 4
    return zip_checkpoint(pickle(tensor_v2(storage_pid("FloatStorage", "0", numel), i(0), ints(*shape),
                                           ints(*stride))), {"0": values})


def _c_stride(shape: tuple[int, ...], n: int) -> int:
    step = 1
    for size in shape[n + 1:]:
        step *= size
    return step


@dataclass
class Stored:
    fqn: str
    offsets: tuple[int, ...] | None
    file: str
    offset: int
    length: int
    transforms: list[str] | None = None


@dataclass
class Item:
    shape: tuple[int, ...]
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]
    dtype: str = "float32"


@dataclass
class Layout:
    """What the metadata says and what the files hold; a case's mutation edits it before it is written."""

    files: dict[str, bytes | Link] = field(default_factory=dict)
    tensors: dict[str, Item] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)
    storage: list[Stored] = field(default_factory=list)
    planner: bytes | dict[str, tuple[str | int, ...]] | None = None
    torch_1_13: bool = False
    """Pickled as torch 1.13's ``torch.distributed._shard.checkpoint`` did (``dcp_1_13_writer``): its class names,
    no ``storage_meta``, ``version`` or ``transform_descriptors``."""

    def stored(self, fqn: str, offsets: tuple[int, ...] | None = None) -> Stored:
        return next(x for x in self.storage if x.fqn == fqn and x.offsets == offsets)

    def metadata(self) -> bytes:
        meta = META_1_13 if self.torch_1_13 else META
        items = [(s(fqn), _obj(meta, "TensorStorageMetadata", _attrs(
            properties=_properties(item.dtype, self.torch_1_13), size=_size(item.shape),
            chunks=lst(*(_obj(meta, "ChunkStorageMetadata", _attrs(offsets=_size(o), sizes=_size(z)))
                         for o, z in item.boxes)))))
                 for fqn, item in self.tensors.items()]
        items += [(s(fqn), _obj(meta, "BytesStorageMetadata", dct())) for fqn in self.objects]
        storage = [(_obj(meta, "MetadataIndex", _attrs(fqn=s(x.fqn), offset=b"N" if x.offsets is None else
                                                       _size(x.offsets), index=b"N")),
                    _obj(meta.replace(".metadata", ".filesystem"), "_StorageInfo", _attrs(
                        relative_path=s(x.file), offset=i(x.offset), length=i(x.length),
                        **({} if self.torch_1_13 else {"transform_descriptors": b"N" if x.transforms is None
                                                       else lst(*map(s, x.transforms))}))))
                   for x in self.storage]
        if isinstance(self.planner, bytes):
            planner = self.planner
        elif self.planner is None:
            planner = b"N"
        else:
            planner = dct(*((s(fqn), tup(*(s(k) if isinstance(k, str) else i(k) for k in path)))
                            for fqn, path in self.planner.items()))
        if self.torch_1_13:
            return pickle(_obj(meta, "Metadata", _attrs(state_dict_metadata=dct(*items), planner_data=planner,
                                                        storage_data=dct(*storage))), proto=4)
        return pickle(_obj(META, "Metadata", _attrs(state_dict_metadata=dct(*items), planner_data=planner,
                                                    storage_data=dct(*storage), storage_meta=b"N",
                                                    version=s("1.0.0"))))


def valid_layout() -> Layout:
    top, bottom, bias, step = _blob(W[:16], (2, 2)), _blob(W[16:], (2, 2)), _blob(B, (3,)), zip_checkpoint(
        pickle(i(5)))
    layout = Layout(files={"__0_0.distcp": top + bias + step, "__1_0.distcp": bottom})
    layout.tensors = {"model.w": Item((4, 2), [((0, 0), (2, 2)), ((2, 0), (2, 2))]),
                      "model.b": Item((3,), [((0,), (3,))])}
    layout.objects = ["step"]
    layout.storage = [Stored("model.w", (0, 0), "__0_0.distcp", 0, len(top)),
                      Stored("model.w", (2, 0), "__1_0.distcp", 0, len(bottom)),
                      Stored("model.b", (0,), "__0_0.distcp", len(top), len(bias)),
                      Stored("step", None, "__0_0.distcp", len(top) + len(bias), len(step))]
    layout.planner = {"model.w": ("model", "w"), "model.b": ("model", "b"), "step": ("step",)}
    return layout


def directory(mutate: Callable[[Layout], None] | None = None,
              metadata: Callable[[bytes], bytes] | None = None) -> Callable[[Env], dict[str, bytes | Link]]:
    """A case's files: the valid layout, edited by ``mutate``; ``metadata`` rewrites the pickle's bytes."""

    def build(env: Env) -> dict[str, bytes | Link]:
        layout = valid_layout()
        if mutate is not None:
            mutate(layout)
        data = layout.metadata()
        return {".metadata": metadata(data) if metadata else data, **layout.files}

    return build


def _reads_valid(ck: ckptfs.Checkpoint) -> None:
    assert ck.format == "dcp" and ck.root["step"] == 5
    assert ck.read(ck.tensor(("model", "w"))) == W and ck.read(ck.tensor(("model", "b"))) == B


def _reads_but(fqn_path: tuple[str, ...], reason: str,
               error: type[CkptfsError] = CorruptCheckpointError) -> Callable[[ckptfs.Checkpoint], None]:
    """The tensor at ``fqn_path`` fails to read with ``error`` for ``reason``; the others read their bytes."""

    def check(ck: ckptfs.Checkpoint) -> None:
        for tensor in ck.tensors:
            if tensor.path != fqn_path:
                ck.read(tensor, 0, 1 << 16)
                continue
            try:
                ck.read(tensor, 0, 1 << 16)
            except error as exc:
                assert type(exc) is error, exc
                assert re.search(reason, exc.reason), exc.reason
                assert exc.path == ck.path
            else:
                raise AssertionError(f"reading {tensor.path} did not fail")

    return check


def _set(fqn: str, offsets: tuple[int, ...] | None, **changes: object) -> Callable[[Layout], None]:
    def mutate(layout: Layout) -> None:
        stored = layout.stored(fqn, offsets)
        for name, value in changes.items():
            setattr(stored, name, value)

    return mutate


def _boxes(*boxes: tuple[tuple[int, ...], tuple[int, ...]], fqn: str = "model.w") -> Callable[[Layout], None]:
    def mutate(layout: Layout) -> None:
        """The boxes replace the tensor's, each keeping the place in storage_data of the one it replaces."""
        for stored, (offsets, _) in zip([x for x in layout.storage if x.fqn == fqn], boxes):
            stored.offsets = offsets
        layout.tensors[fqn].boxes = list(boxes)

    return mutate


def _shape(fqn: str, shape: tuple[int, ...], boxes: list | None = None) -> Callable[[Layout], None]:
    def mutate(layout: Layout) -> None:
        layout.tensors[fqn].shape = shape
        if boxes is not None:
            layout.tensors[fqn].boxes = boxes

    return mutate


def _many_boxes_one_missing(layout: Layout) -> None:
    """300 one-element boxes, the one at 5 given twice in place of 5: the count matches, the grid has a hole.
    Past OVERLAP_CHECKED_CHUNKS the grid is checked when read."""
    one = _blob(B[:4], (1,))
    layout.files["ones.distcp"] = one
    offsets = [n if n != 5 else 4 for n in range(300)]
    layout.tensors["model.b"] = Item((300,), [((n,), (1,)) for n in offsets])
    layout.storage = [x for x in layout.storage if x.fqn != "model.b"]
    layout.storage += [Stored("model.b", (n,), "ones.distcp", 0, len(one)) for n in sorted(set(offsets))]


def _file(name: str, data: bytes | Link | None) -> Callable[[Layout], None]:
    def mutate(layout: Layout) -> None:
        if data is None:
            del layout.files[name]
        else:
            layout.files[name] = data

    return mutate


def rle_frame(blocks: int) -> bytes:
    """A zstd frame of ``blocks`` run-length blocks of 128 KiB of zeros, 4 bytes each (RFC 8878: a frame header
    with a 2 MiB window and no content size, then block headers of type RLE, the last one marked)."""
    def block(last: int) -> bytes:
        return (last | 1 << 1 | (128 << 10) << 3).to_bytes(3, "little") + b"\x00"

    return b"\x28\xb5\x2f\xfd\x00\x58" + block(0) * (blocks - 1) + block(1)


def _zstd_bomb(layout: Layout) -> None:
    """``model.b``'s 3 floats (about 1.2 KiB of blob) as a zstd frame of 32 KiB that decompresses to 1 GiB: the
    decoder is fed little at a time, so it never holds more than a few MiB past the item's bound."""
    frame = rle_frame(8192)
    layout.files["bomb.distcp"] = frame
    _set("model.b", (0,), file="bomb.distcp", offset=0, length=len(frame), transforms=["stream.zstd/1"])(layout)


def _planted(env: Env) -> bytes:
    return call(glob("os", "system"), s(f"touch {env.canary}"))


def _planted_planner(env: Env) -> dict[str, bytes | Link]:
    layout = valid_layout()
    layout.planner = _planted(env)
    return {".metadata": layout.metadata(), **layout.files}


def _planted_object(env: Env) -> dict[str, bytes | Link]:
    """The bytes item ``step`` pickles a call of os.system: it stays a description."""
    layout = valid_layout()
    payload = zip_checkpoint(pickle(_planted(env)))
    start = len(layout.files["__1_0.distcp"])  # type: ignore[arg-type]
    layout.files["__1_0.distcp"] += payload  # type: ignore[operator]
    _set("step", None, file="__1_0.distcp", offset=start, length=len(payload))(layout)
    return {".metadata": layout.metadata(), **layout.files}


def _planted_check(ck: ckptfs.Checkpoint) -> None:
    assert isinstance(ck.root["step"], PickledObject) and ck.root["step"].callable.qualname == "os.system"
    _reads_valid_tensors(ck)


def _reads_valid_tensors(ck: ckptfs.Checkpoint) -> None:
    assert ck.read(ck.tensor(("model", "w"))) == W and ck.read(ck.tensor(("model", "b"))) == B


def _1_13(*mutations: Callable[[Layout], None]) -> Callable[[Layout], None]:
    """The layout as torch 1.13 wrote it (no planner_data: it did not flatten), then ``mutations``."""
    def mutate(layout: Layout) -> None:
        layout.torch_1_13, layout.planner = True, None
        for mutation in mutations:
            mutation(layout)

    return mutate


def _reads_valid_1_13(ck: ckptfs.Checkpoint) -> None:
    assert ck.details["written_by"] == "torch 1.13's torch.distributed._shard.checkpoint" and ck.root["step"] == 5
    assert ck.read(ck.tensor(("model.w",))) == W and ck.read(ck.tensor(("model.b",))) == B


W_AT_2 = r"'model.w' at \[2, 0\]"
case("dcp_valid", "dcp", directory(), check=_reads_valid)
case("dcp_1_13_valid", "dcp", directory(_1_13()), check=_reads_valid_1_13)
case("dcp_1_13_chunks_overlap", "dcp", directory(_1_13(_boxes(((0, 0), (2, 2)), ((1, 0), (2, 2))))),
     CorruptCheckpointError, r"chunks of tensor 'model.w' at \[1, 0\] and \[0, 0\] overlap")
case("dcp_1_13_range_past_its_file", "dcp", directory(_1_13(_set("model.w", (2, 0), length=1 << 40))),
     CorruptCheckpointError, r"'model.w' at \[2, 0\] is stored at \[0, 1099511627776\) of '__1_0.distcp'")
case("dcp_1_13_path_traversal", "dcp", directory(_1_13(_set("model.w", (2, 0), file="../__1_0.distcp"))),
     CorruptCheckpointError, r"relative_path '../__1_0.distcp' is not a file name in the directory")
case("dcp_no_planner_data", "dcp", directory(lambda d: setattr(d, "planner", None)),
     check=lambda ck: (set(ck.root) == {"model.w", "model.b", "step"}) or None)
case("dcp_range_past_its_file", "dcp", directory(_set("model.w", (2, 0), length=1 << 40)), CorruptCheckpointError,
     W_AT_2 + r" is stored at \[0, 1099511627776\) of '__1_0.distcp', which has \d+ bytes")
case("dcp_offset_past_its_file", "dcp", directory(_set("model.w", (2, 0), offset=(1 << 63) - 1)),
     CorruptCheckpointError, W_AT_2 + r" is stored at \[9223372036854775807, \d+\) of '__1_0.distcp'")
case("dcp_negative_length", "dcp", directory(_set("model.w", (2, 0), length=-1)), CorruptCheckpointError,
     r"\.metadata: byte range 0\+-1 in '__1_0.distcp' is not two non-negative integers")
case("dcp_chunks_overlap", "dcp", directory(_boxes(((0, 0), (2, 2)), ((1, 0), (2, 2)))), CorruptCheckpointError,
     r"chunks of tensor 'model.w' at \[1, 0\] and \[0, 0\] overlap")
case("dcp_chunk_hole", "dcp", directory(_boxes(((0, 0), (2, 2)))), CorruptCheckpointError,
     r"the chunks of tensor 'model.w' hold 4 elements, its size \[4, 2\] has 8")
case("dcp_chunk_outside", "dcp", directory(_boxes(((0, 0), (2, 2)), ((3, 0), (2, 2)))), CorruptCheckpointError,
     r"chunk at \[3, 0\] of size \[2, 2\] lies outside tensor 'model.w' of size \[4, 2\]")
case("dcp_chunk_rank_differs", "dcp", directory(_boxes(((0,), (8,)))), CorruptCheckpointError,
     r"chunk at \[0\] of size \[8\] of 'model.w' does not have the 2 dimensions of \[4, 2\]")
case("dcp_grid_with_a_hole", "dcp", directory(_many_boxes_one_missing),
     check=_reads_but(("model", "b"), r"no chunk of tensor \('model', 'b'\) holds element 5 \(index \[5\]\)|"
                                      r"overlap"))
case("dcp_chunk_not_in_storage_data", "dcp",
     directory(lambda d: d.storage.remove(d.stored("model.w", (2, 0)))), CorruptCheckpointError,
     W_AT_2 + r" is not in storage_data")
case("dcp_huge_size", "dcp", directory(_shape("model.w", (1 << 40, 1 << 40))), CorruptCheckpointError,
     r"tensor 'model.w' of size \[1099511627776, 1099511627776\] has more elements than int64 holds")
case("dcp_huge_size_covered", "dcp", directory(_shape("model.b", (1 << 50,), [((0,), (1 << 50,))])),
     check=_reads_but(("model", "b"), r"holds a float32 tensor of size \[3\], not float32 of size "
                                      r"\[1125899906842624\]"))
case("dcp_path_traversal", "dcp", directory(_set("model.w", (2, 0), file="../__1_0.distcp")),
     CorruptCheckpointError, r"relative_path '../__1_0.distcp' is not a file name in the directory")
case("dcp_absolute_path", "dcp", directory(_set("model.w", (2, 0), file="/etc/passwd")), CorruptCheckpointError,
     r"relative_path '/etc/passwd' is not a file name in the directory")
case("dcp_dot_dot", "dcp", directory(_set("model.w", (2, 0), file="..")), CorruptCheckpointError,
     r"relative_path '..' is not a file name in the directory")
case("dcp_symlink_out_of_the_directory", "dcp", directory(_file("__1_0.distcp", Link("/etc/passwd"))),
     CorruptCheckpointError, r"stored in '__1_0.distcp', which is not in the directory")
case("dcp_symlink_within_the_directory", "dcp",
     directory(lambda d: (_file("inner.distcp", d.files["__1_0.distcp"])(d),
                          _file("__1_0.distcp", Link("inner.distcp"))(d)) and None), check=_reads_valid)
case("dcp_file_missing", "dcp", directory(_file("__1_0.distcp", None)), CorruptCheckpointError,
     r"stored in '__1_0.distcp', which is not in the directory")
case("dcp_blob_not_an_archive", "dcp", directory(_file("__1_0.distcp", b"\x00" * 4096)),
     check=_reads_but(("model", "w"), r"the chunk at \[2, 0\] in '__1_0.distcp' at \[0, \d+\) is not a torch.save "
                                      r"archive|the chunk at \[2, 0\] in '__1_0.distcp' at \[0, \d+\): "))
case("dcp_wrong_dtype", "dcp", directory(lambda d: setattr(d.tensors["model.w"], "dtype", "float64")),
     check=_reads_but(("model", "w"), r"holds a float32 tensor of size \[2, 2\], not float64 of size \[2, 2\]"))
case("dcp_unknown_dtype", "dcp", directory(lambda d: setattr(d.tensors["model.w"], "dtype", "float128")),
     UnsupportedError, r"tensor 'model.w' has the dtype torch.float128, which ckptfs does not know")
case("dcp_unknown_transform", "dcp", directory(_set("model.w", (2, 0), transforms=["stream.gzip/1"])),
     check=_reads_but(("model", "w"), r"item encoded as \['stream.gzip/1'\]; ckptfs reads only \['stream.zstd/1'\]",
                      UnsupportedError))
case("dcp_zstd_bomb", "dcp", directory(_zstd_bomb),
     check=_reads_but(("model", "b"), r"zstd frame decompresses to more than \d+ bytes, more than its item can "
                                      r"hold"))
case("dcp_planner_huge_index", "dcp", directory(lambda d: d.planner.update(step=("lst", 1 << 40))),  # type: ignore
     CorruptCheckpointError, r"planner_data path \['lst', 1099511627776\] has the list index 1099511627776")
case("dcp_planner_twice", "dcp", directory(lambda d: d.planner.update(step=("model", "w"))),  # type: ignore
     CorruptCheckpointError, r"planner_data path \['model', 'w'\] is given twice")
case("dcp_planted_planner", "dcp", _planted_planner, CorruptCheckpointError,
     r"\.metadata: planner_data is a os.system, not a dict")
case("dcp_planted_object", "dcp", _planted_object, check=_planted_check)
case("dcp_metadata_truncated", "dcp", directory(metadata=lambda data: data[:300]), CorruptCheckpointError,
     r"\.metadata: pickle truncated|pickle truncated")
case("dcp_metadata_not_metadata", "dcp", directory(metadata=lambda data: pickle(dct((s("a"), i(1))))),
     NotACheckpointError, r"a directory, but no checkpoint directory: those read are DCP.s \(a \.metadata")
case("dcp_metadata_huge_string", "dcp",
     directory(metadata=lambda data: data[:-2] + b"0X" + struct.pack("<I", 0xFFFFFFF0) + b"abc."),
     CorruptCheckpointError, r"truncated")


def _safetensors(header: dict, data: bytes, metadata: dict | None = None) -> bytes:
    text = json.dumps({**({"__metadata__": metadata} if metadata else {}), **header}).encode()
    return struct.pack("<Q", len(text)) + text + data


_ST_W = _safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, W[:16])
_INDEX = "model.safetensors.index.json"


def _reads_w(ck: ckptfs.Checkpoint) -> None:
    assert ck.format == "safetensors_dir" and ck.read(ck.root["w"]) == W[:16]


def _hf(files: dict[str, bytes | Link]) -> Callable[[Env], dict[str, bytes | Link]]:
    return lambda env: files


case("hf_valid", "dcp", _hf({"a.safetensors": _ST_W, _INDEX: b'{"weight_map": {"w": "a.safetensors"}}'}),
     check=_reads_w)
case("hf_index_traversal", "dcp", _hf({"a.safetensors": _ST_W,
                                       _INDEX: b'{"weight_map": {"w": "a.safetensors", "v": "../../etc/passwd"}}'}),
     CorruptCheckpointError, r"lists '../../etc/passwd', which is not in the directory")
case("hf_index_huge_nesting", "dcp", _hf({"a.safetensors": _ST_W, _INDEX: b"[" * 100_000}),
     CorruptCheckpointError, r"model.safetensors.index.json is not JSON")
case("hf_shard_offsets", "dcp",
     _hf({"a.safetensors": _safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, W[:16],
                                        {"DCP_SHARDING_INFO": '{"w": {"saved_offsets": [2, 0]}}'})}),
     UnsupportedError, r"a.safetensors: tensor 'w' is a shard at \[2, 0\]")
case("hf_data_offsets_past_the_file", "dcp",
     _hf({"a.safetensors": _safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 1 << 40]}},
                                        W[:16])}),
     CorruptCheckpointError, r"a.safetensors: safetensors tensor 'w' has data_offsets \[0, 1099511627776\] outside")
case("hf_torch_save_blob_first", "dcp",
     _hf({"a.safetensors": zip_checkpoint(pickle(i(5))) + _ST_W, _INDEX: b'{"weight_map": {"w": "a.safetensors"}}'}),
     UnsupportedError, r"'a.safetensors' holds a torch.save blob before its safetensors header")
