"""Checkpoints written by torch (spec §12 recipes) and an oracle built from torch's own objects.

The oracle never asks ckptfs anything: it walks the object ``torch.load`` (or
``torch.jit.load``) returns — dict keys, list and tuple indices, and for sparse
and nested tensors the component tensors torch itself pickles — and records
each tensor at every path where it is reachable.
"""

from __future__ import annotations

import contextlib
import math
import warnings
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.utils.serialization.config as serialization_config
from legacy_writer import save_legacy_reproducibly
from torch import nn

Key = Any
TensorPath = tuple[Key, ...]

PLAIN_DTYPES: tuple[torch.dtype, ...] = (
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.complex128, torch.complex64, torch.complex32,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    torch.uint16, torch.uint32, torch.uint64,
    torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
    torch.bits8, torch.bits16, torch.bits1x8, torch.bits2x4, torch.bits4x2,
)
QUANTIZED_DTYPES: tuple[torch.dtype, ...] = (torch.qint8, torch.quint8, torch.qint32)
PACKED_DTYPES: tuple[torch.dtype, ...] = (torch.quint4x2, torch.quint2x4)
"""Sub-byte quantized types; torch itself mishandles their views, so only whole tensors are saved."""
ALL_DTYPES = PLAIN_DTYPES + QUANTIZED_DTYPES + PACKED_DTYPES

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

BASE_SHAPE = (4, 6)
VIEW_KINDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda b: b,
    "transposed": lambda b: b.t(),
    "row": lambda b: b[2],
    "step_slice": lambda b: b[:, 1::2],
    "overlapping": lambda b: b.as_strided((3, 4), (2, 1), 1),
    "expand": lambda b: b[1, 2:3].expand(3, 4),
    "scalar": lambda b: b[1, 2],
    "empty": lambda b: b[4:],
    "channels_last": lambda b: b.reshape(2, 3, 2, 2).contiguous(memory_format=torch.channels_last),
}
"""Views of a 4×6 base tensor; all but ``channels_last`` share the base's storage."""


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A tensor of random bit patterns (valid 0/1 for bool, quantized from random floats).

    Complex values are finite: torch resolves conj through float conversions that
    quiet signalling NaNs, so their bit patterns would not survive ``resolve_conj``.
    """
    if dtype.is_complex:
        wide = torch.complex128 if dtype is torch.complex128 else torch.complex64
        return torch.randn(shape, dtype=wide, generator=gen).to(dtype)
    if dtype in QUANTIZED_DTYPES or dtype in PACKED_DTYPES:
        return torch.quantize_per_tensor(torch.randn(shape, generator=gen), 0.05, 3, dtype)
    numel = math.prod(shape)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, dtype=torch.uint8, generator=gen).view(torch.bool)
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def views_of(dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    base = random_tensor(dtype, BASE_SHAPE, gen)
    if dtype in PACKED_DTYPES:
        return {"contiguous": base}
    return {kind: make(base) for kind, make in VIEW_KINDS.items()}


def torch_bytes(t: torch.Tensor) -> bytes:
    """The bytes of ``t.contiguous()``: int_repr for quantized tensors, conj/neg resolved."""
    if t.is_quantized:
        return t.int_repr().contiguous().numpy().tobytes()
    t = t.detach().resolve_conj().resolve_neg()
    if t.element_size() == 16:
        return t.contiguous().numpy().tobytes()
    # Reinterpreting as a same-size integer type works for every dtype and every stride.
    return t.view(_INT_OF_SIZE[t.element_size()]).contiguous().numpy().tobytes()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- the oracle ------------------------------------------------------------------


@dataclass
class Expected:
    """What torch says a checkpoint holds."""

    tensors: dict[TensorPath, torch.Tensor]
    """Every path at which a tensor is reachable (a shared tensor at each of its paths)."""
    first_paths: list[TensorPath] | None
    """Each distinct tensor once, at its first path in pickle order; None where torch gives no order."""
    parameters: set[TensorPath]
    root: Any = None
    """The object torch loaded, to compare the non-tensor parts of the tree."""

    @property
    def distinct(self) -> int:
        return len({id(t) for t in self.tensors.values()})


def tensor_components(t: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """The component tensors torch pickles for a sparse or nested tensor; None for a plain one."""
    if t.layout == torch.sparse_coo:
        return [("indices", t._indices()), ("values", t._values())]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [("crow_indices", t.crow_indices()), ("col_indices", t.col_indices()), ("values", t.values())]
    if t.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [("ccol_indices", t.ccol_indices()), ("row_indices", t.row_indices()), ("values", t.values())]
    if t.is_nested:
        return [("buffer", t.values()), ("sizes", t._nested_tensor_size()),
                ("strides", t._nested_tensor_strides()), ("storage_offsets", t._nested_tensor_storage_offsets())]
    return None


def expected_from_object(root: Any) -> Expected:
    """Walks a loaded object in pickle order; a container met again is not walked again.

    A whole ``nn.Module`` is pickled as its ``__getstate__()`` dict, so that is what is walked.
    """
    tensors: dict[TensorPath, torch.Tensor] = {}
    first_paths: list[TensorPath] = []
    parameters: set[TensorPath] = set()
    seen: set[int] = set()
    stack: list[tuple[TensorPath, Any]] = [((), root)]
    while stack:
        path, value = stack.pop()
        children: list[tuple[Key, Any]]
        if isinstance(value, torch.Tensor):
            components = tensor_components(value)
            if components is None:
                tensors[path] = value
                if isinstance(value, nn.Parameter):
                    parameters.add(path)
                if id(value) not in seen:
                    seen.add(id(value))
                    first_paths.append(path)
                continue
            children = list(components)
        elif isinstance(value, nn.Module):
            children = list(value.__getstate__().items())
        elif isinstance(value, dict):
            children = list(value.items())
        elif isinstance(value, (list, tuple)):
            children = list(enumerate(value))
        else:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend((path + (key,), child) for key, child in reversed(children))
    return Expected(tensors, first_paths, parameters, root)


def expected_from_script(
    module: torch.jit.ScriptModule, attributes: tuple[str, ...] = (), constants: tuple[torch.Tensor, ...] = ()
) -> Expected:
    """A TorchScript module's tensors: its parameters and buffers, plain tensor attributes, constants."""
    tensors: dict[TensorPath, torch.Tensor] = {}
    parameters: set[TensorPath] = set()
    for name, param in module.named_parameters(remove_duplicate=False):
        tensors[tuple(name.split("."))] = param
        parameters.add(tuple(name.split(".")))
    for name, buffer in module.named_buffers(remove_duplicate=False):
        tensors[tuple(name.split("."))] = buffer
    for name in attributes:
        tensors[tuple(name.split("."))] = getattr(module, name)
    for index, constant in enumerate(constants):
        tensors[("constants.pkl", index)] = constant
    return Expected(tensors, None, parameters)


def load_expected(path: Path, original: Any) -> Expected:
    """The oracle from ``torch.load``; from the saved object where torch cannot load its own file.

    torch 2.13 fails on legacy files holding v3 dtypes or nested tensors (spec §3.3).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loaded = torch.load(path, weights_only=False)
        except (AttributeError, RuntimeError):
            loaded = original
    return expected_from_object(loaded)


# -- writers ---------------------------------------------------------------------


@dataclass
class CorpusFile:
    name: str
    path: Path
    format: str
    """The format ckptfs must report: ``zip``, ``legacy`` or ``torchscript``."""
    expected: Expected
    byteorder: str = "little"


@contextlib.contextmanager
def crc32_disabled() -> Iterator[None]:
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(True)


@contextlib.contextmanager
def storage_alignment(alignment: int) -> Iterator[None]:
    previous = serialization_config.save.storage_alignment
    serialization_config.save.storage_alignment = alignment
    try:
        yield
    finally:
        serialization_config.save.storage_alignment = previous


def save_zip(obj: Any, path: Path, **kwargs: Any) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, **kwargs)
    return path


def save_legacy(obj: Any, path: Path, **kwargs: Any) -> Path:
    """torch's own legacy writer: storage keys are memory addresses, different in every run (the corpus files use
    ``save_legacy_reproducibly``)."""
    return save_zip(obj, path, _use_new_zipfile_serialization=False, **kwargs)


def write_raw_archive(path: Path, data_pkl: bytes, records: dict[str, bytes] | None = None) -> Path:
    """A zip archive as torch's writer makes it, holding a hand-made ``data.pkl``."""
    writer = torch._C.PyTorchFileWriter(str(path))
    writer.write_record("data.pkl", data_pkl, len(data_pkl))
    for name, data in (records or {}).items():
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return path


def save_both(directory: Path, name: str, obj: Any, **kwargs: Any) -> list[CorpusFile]:
    """``obj`` saved as a zip and as a legacy stream."""
    zip_path = save_zip(obj, directory / f"{name}.pt", **kwargs)
    legacy_path = save_legacy_reproducibly(obj, directory / f"{name}_legacy.pt", **kwargs)
    return [
        CorpusFile(name, zip_path, "zip", load_expected(zip_path, obj)),
        CorpusFile(f"{name}_legacy", legacy_path, "legacy", load_expected(legacy_path, obj)),
    ]


# -- recipes -------------------------------------------------------------------------


def r1_views_and_containers(gen: torch.Generator) -> dict[str, Any]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    shared = torch.tensor([1, 2, 3], dtype=torch.int16)
    tagged = torch.arange(3, dtype=torch.int8)
    tagged.note = "pickled through _rebuild_from_type_v2"
    stateful = nn.Parameter(torch.randn(2, generator=gen))
    stateful.extra = 5
    return {
        "base": base,
        "transposed": base.t(),
        "row_view": base[2],
        "col_slice": base[:, 1::2],
        "expanded": torch.tensor([7.0]).expand(3, 4),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "param": nn.Parameter(torch.randn(2, 3, generator=gen)),
        "frozen_param": nn.Parameter(torch.randn(2, generator=gen), requires_grad=False),
        "requires_grad": torch.randn(3, generator=gen).requires_grad_(),
        "with_attribute": tagged,
        "param_with_state": stateful,
        "alias_a": shared,
        "alias_b": shared,
        "int_keys": {0: torch.ones(2), 7: torch.zeros(1, dtype=torch.int64), -3: "not a tensor"},
        "tuple_keys": {(1, 2): torch.full((2,), 5, dtype=torch.int32)},
        "nested": {"list": [torch.randn(2, generator=gen), (torch.arange(3), {"deep": base[1:3, 2:]})],
                   "tuple": (1, "two", None)},
        "state_dict": nn.Linear(3, 2).state_dict(),
        "ordered": OrderedDict([("z", torch.ones(1)), ("a", torch.zeros(1))]),
        "leaves": {"set": {1, 2, 3}, "frozenset": frozenset({"a"}), "complex": 1 + 2j, "bytes": b"\x00\xff",
                   "empty_bytes": b"", "bytearray": bytearray(b"ab"), "none": None, "true": True, "false": False,
                   "big": 2**100, "negative": -5, "float": 1.5, "nan": float("nan"), "text": "ünïcode"},
    }


def r2_every_dtype(gen: torch.Generator) -> dict[str, Any]:
    obj: dict[str, Any] = {dtype_name(dtype): views_of(dtype, gen) for dtype in ALL_DTYPES}
    floats = torch.randn(4, 6, generator=gen)
    c64 = torch.randn(3, 4, dtype=torch.complex64, generator=gen)
    obj.update({
        "per_channel_qint8": torch.quantize_per_channel(
            floats, torch.rand(4, generator=gen, dtype=torch.float64) + 0.01, torch.arange(4), 0, torch.qint8),
        "per_channel_quint8_axis1": torch.quantize_per_channel(
            floats, torch.rand(6, generator=gen, dtype=torch.float64) + 0.01, torch.arange(6), 1, torch.quint8),
        "conj64": c64.conj(),
        "conj128_transposed": torch.randn(3, 4, dtype=torch.complex128, generator=gen).t().conj(),
        "conj32": c64.to(torch.complex32).conj(),
        "neg_imag": torch.randn(3, dtype=torch.complex64, generator=gen).conj().imag,
        "sparse_coo": torch.randn(4, 5, generator=gen).relu().to_sparse(),
        "sparse_coo_uncoalesced": torch.sparse_coo_tensor(torch.tensor([[0, 1, 0], [2, 0, 2]]),
                                                          torch.tensor([1.0, 2.0, 3.0]), (2, 3)),
        "sparse_csr": torch.randn(3, 4, generator=gen).relu().to_sparse_csr(),
        "sparse_csc": torch.randn(3, 4, generator=gen).relu().to_sparse_csc(),
        "nested": torch.nested.nested_tensor([torch.randn(2, 3, generator=gen), torch.randn(4, 3, generator=gen)]),
        "meta": torch.empty(3, 4, device="meta"),
        "meta_transposed": torch.empty(3, 4, device="meta", dtype=torch.float16).t(),
    })
    return obj


def r3_legacy_basics(gen: torch.Generator) -> dict[str, Any]:
    w = torch.randn(3, 5, generator=gen)
    return {"w": w, "wt": w.t(), "i8": torch.randint(-128, 127, (7,), dtype=torch.int8, generator=gen),
            "empty": torch.empty(0)}


def r9_small(gen: torch.Generator) -> dict[str, Any]:
    base = torch.randn(5, 7, generator=gen)
    return {"base": base, "t": base.t(), "half": base.half()[1:, ::3], "ints": [torch.arange(10), {"k": None}],
            "bytes": b"abc"}


class _Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("count", torch.tensor([1, 2, 3], dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.count.sum()


class _Scripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = _Sub()
        self.w = nn.Parameter(torch.randn(2, 2))
        self.alias = self.w
        self.register_buffer("steps", torch.tensor(7))
        self.view = torch.arange(6.0).reshape(2, 3).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x) @ self.w + self.alias + self.steps + self.view.sum()


TRACED_CONSTANT = (1.5, -2.5, 3.25)


class _Traced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * torch.tensor(TRACED_CONSTANT)


def torchscript_files(directory: Path) -> list[CorpusFile]:
    scripted_path = directory / "r5_scripted.pt"
    traced_path = directory / "r5_traced.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(_Scripted()), str(scripted_path), _extra_files={"notes.txt": "extra"})
        torch.jit.save(torch.jit.trace(_Traced(), torch.randn(2, 3)), str(traced_path))
        scripted = torch.jit.load(str(scripted_path))
        traced = torch.jit.load(str(traced_path))
    return [
        CorpusFile("r5_scripted", scripted_path, "torchscript", expected_from_script(scripted, attributes=("view",))),
        CorpusFile("r5_traced", traced_path, "torchscript",
                   expected_from_script(traced, constants=(torch.tensor(TRACED_CONSTANT),))),
    ]


def r7_big_endian(directory: Path, gen: torch.Generator) -> CorpusFile:
    """Spec R7: a zip whose ``byteorder`` record says ``big`` and whose storages are byte-swapped.

    torch itself loads v3 dtypes from such files wrongly (spec §9), so the oracle is the saved object.
    Storage keys are assigned in the order the pickler meets storages: the order of ``obj``.
    """
    base = random_tensor(torch.float32, BASE_SHAPE, gen)
    obj = {
        "f32": base, "f32_t": base.t(), "i64": random_tensor(torch.int64, (5,), gen),
        "bf16": random_tensor(torch.bfloat16, (2, 3), gen), "f16_t": random_tensor(torch.float16, (3, 2), gen).t(),
        "c64": random_tensor(torch.complex64, (3,), gen).conj(), "c128": random_tensor(torch.complex128, (2,), gen),
        "u16": random_tensor(torch.uint16, (4,), gen), "c32": random_tensor(torch.complex32, (2,), gen),
        "u64": random_tensor(torch.uint64, (2,), gen), "bool": random_tensor(torch.bool, (3,), gen),
        "f8": random_tensor(torch.float8_e5m2, (3,), gen), "q": random_tensor(torch.qint32, (2, 2), gen),
    }
    storages: dict[int, torch.Tensor] = {}
    for t in obj.values():
        storages.setdefault(t.untyped_storage().data_ptr(), t)
    little = directory / "r7_little.pt"
    save_zip(obj, little)
    with zipfile.ZipFile(little) as archive:
        prefix = archive.namelist()[0].split("/")[0]
        data_pkl = archive.read(f"{prefix}/data.pkl")
    path = directory / "r7_big_endian.pt"
    writer = torch._C.PyTorchFileWriter(str(path), True, 64)
    records = {"data.pkl": data_pkl, ".format_version": b"1", ".storage_alignment": b"64", "byteorder": b"big"}
    for key, t in enumerate(storages.values()):
        unit = t.element_size() // (2 if t.is_complex() else 1)
        raw = bytes(t.untyped_storage())
        records[f"data/{key}"] = b"".join(raw[i : i + unit][::-1] for i in range(0, len(raw), unit))
    for name, data in records.items():
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    little.unlink()
    return CorpusFile("r7_big_endian", path, "zip", expected_from_object(obj), byteorder="big")


def build_corpus(directory: Path) -> dict[str, CorpusFile]:
    """The same tensors in every run: module initialisations and the tracing input draw from torch's global
    generator, seeded here (and restored afterwards)."""
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(20240601)
        return _build_corpus(directory)


def _build_corpus(directory: Path) -> dict[str, CorpusFile]:
    gen = torch.Generator().manual_seed(20240601)
    files = [
        *save_both(directory, "r1_views_containers", r1_views_and_containers(gen)),
        *save_both(directory, "r2_every_dtype", r2_every_dtype(gen)),
        *save_both(directory, "r9_protocol4", r9_small(gen), pickle_protocol=4),
        *save_both(directory, "whole_module", _Scripted()),
        *torchscript_files(directory),
        r7_big_endian(directory, gen),
    ]
    r3 = r3_legacy_basics(gen)
    r3_path = save_legacy_reproducibly(r3, directory / "r3_legacy.pt")
    files.append(CorpusFile("r3_legacy", r3_path, "legacy", load_expected(r3_path, r3)))
    r4 = r9_small(gen)
    with torch.serialization.skip_data():
        r4_path = save_zip(r4, directory / "r4_skip_data.pt")
    files.append(CorpusFile("r4_skip_data", r4_path, "zip", load_expected(r4_path, r4)))
    r9 = r9_small(gen)
    with crc32_disabled():
        crc_path = save_zip(r9, directory / "r9_no_crc.pt")
    with storage_alignment(4096):
        aligned_path = save_zip(r9, directory / "r9_align4096.pt")
    files += [CorpusFile("r9_no_crc", crc_path, "zip", load_expected(crc_path, r9)),
              CorpusFile("r9_align4096", aligned_path, "zip", load_expected(aligned_path, r9))]
    return {f.name: f for f in files}


CORPUS_NAMES = (
    "r1_views_containers", "r1_views_containers_legacy", "r2_every_dtype", "r2_every_dtype_legacy",
    "r9_protocol4", "r9_protocol4_legacy", "whole_module", "whole_module_legacy", "r5_scripted", "r5_traced",
    "r7_big_endian", "r3_legacy", "r4_skip_data", "r9_no_crc", "r9_align4096",
)
"""Names of ``build_corpus``'s files, known before it runs (for test parametrisation)."""
