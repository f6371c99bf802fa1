"""A ``.pt2`` archive's weights and constants, from their JSON payload configs (torch.export, archive_version 0).

``data/weights/<model>_weights_config.json`` (and ``data/constants/…``) map each
FQN to a ``PayloadMeta``: the record holding it (``path_name``) and, for plain
tensors, ``tensor_meta`` (dtype code, sizes, strides, storage offset in
elements). The record is a whole untyped storage, raw and little-endian, shared
by every FQN viewing it: no pickle is involved. Tensor subclasses
(``use_pickle``) and TorchScript objects (``custom_obj_*``) are torch.save
archives, opaque objects (``opaque_obj_*``) plain pickles: both are read by the
restricted unpickler, which executes nothing.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from ckptfs.errors import CorruptCheckpointError, UnsupportedError
from ckptfs.formats.embedded import open_embedded
from ckptfs.formats.zip_archive import DEFLATED, STORED, ZipArchive, ZipEntry
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import DType, dtype_by_name
from ckptfs.model.records import Storage, Tensor
from ckptfs.pickle.unpickler import SafeUnpickler
from ckptfs.pickle.values import short_repr

SCALAR_TYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
                8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16",
                28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
                32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64"}
"""``torch._export.serde.schema.ScalarType`` codes (torch 2.13's ``_SERIALIZE_TO_TORCH_DTYPE``)."""
OPAQUE_PREFIX = "opaque_obj_"
"""Records of opaque constants: ``pickle.dumps`` of the object; every other pickled payload is a torch.save archive."""
AOTI_WEIGHTS_DIR = "data/weights/"
"""Where an AOTInductor package keeps the weights it does not compile into its library."""
STORAGE_ALIGNMENT = 64
"""PyTorchFileWriter's data alignment, used to predict the records' data offsets (checked on one header)."""


class PayloadLoader:
    """Turns payload configs into ckptfs values; storages and pickled payloads are shared across configs."""

    def __init__(self, archive: ZipArchive, limits: Limits) -> None:
        self.archive = archive
        self.limits = limits
        self.storages: dict[str, Storage] = {}
        """Raw storage records, by record name."""
        self.embedded_storages: list[Storage] = []
        self._views: dict[tuple[Any, ...], Tensor] = {}
        self._pending: list[tuple[dict[str, Any], str, ZipEntry, View | None]] = []
        """Pickled payloads to read once every record's data offset is known: (container, FQN, record, and the
        view of the tensor it holds to take, for AOTInductor weights)."""

    def load(self, text: bytes, config_record: str, directory: str) -> dict[str, Any]:
        """The FQN → value dict a payload config describes; pickled payloads are filled in by ``finish``."""
        values: dict[str, Any] = {}
        for fqn, meta in _config(text, config_record).items():
            where = f"{config_record}: {fqn!r}"
            if not isinstance(meta, dict):
                raise CorruptCheckpointError(f"{where} is {short_repr(meta)}, not a payload description")
            path_name = meta.get("path_name")
            if not isinstance(path_name, str):
                raise CorruptCheckpointError(f"{where} has path_name {short_repr(path_name)}, not a string")
            record = directory + path_name
            entry = self.archive.entry(record)
            if entry is None:
                raise CorruptCheckpointError(f"{where} is stored in record {record!r}, which is missing")
            use_pickle = meta.get("use_pickle", False)
            tensor_meta = meta.get("tensor_meta")
            if use_pickle is True:
                self.defer(values, fqn, entry)
            elif use_pickle is not False:
                raise CorruptCheckpointError(f"{where} has use_pickle {short_repr(use_pickle)}, not true or false")
            elif not isinstance(tensor_meta, dict):
                raise CorruptCheckpointError(f"{where} is a raw tensor without tensor_meta")
            else:
                values[fqn] = self._tensor(where, meta, tensor_meta, entry)
        return values

    def defer(self, container: dict[str, Any], key: str, entry: ZipEntry, view: View | None = None) -> None:
        """``container[key]`` is to be the pickled payload of ``entry`` (or ``view`` of the tensor it holds),
        read by ``finish``."""
        container[key] = None
        self._pending.append((container, key, entry, view))

    def load_aoti(self, text: bytes, config_record: str) -> dict[str, Any]:
        """An AOTInductor model's weights kept out of its library: ``{FQN: [file, sizes, strides, offset]}``,
        each file (in ``data/weights/``) a torch.save archive of a tensor whose storage the FQN views."""
        values: dict[str, Any] = {}
        for fqn, spec in _json(text, config_record).items():
            where = f"{config_record}: {fqn!r}"
            if not (isinstance(spec, list) and len(spec) == 4 and isinstance(spec[0], str)):
                raise CorruptCheckpointError(f"{where} is {short_repr(spec)}, not [file, sizes, strides, offset]")
            record = AOTI_WEIGHTS_DIR + spec[0]
            entry = self.archive.entry(record)
            if entry is None:
                raise CorruptCheckpointError(f"{where} is stored in record {record!r}, which is missing")
            sizes, strides = _list(spec[1], where, "sizes"), _list(spec[2], where, "strides")
            self.defer(values, fqn, entry, View(where, tuple(sizes), tuple(strides), spec[3]))
        return values

    def finish(self) -> None:
        """Resolves every record's data offset (one local header read where torch's alignment rule holds),
        then reads the pickled payloads."""
        raw = [self.archive.entries[self.archive.prefix + s.record] for s in self.storages.values()]
        self.archive.resolve_data_offsets(raw + [entry for _, _, entry, _ in self._pending], STORAGE_ALIGNMENT)
        for storage, entry in zip(self.storages.values(), raw):
            storage.offset = entry.data_offset
        loaded: dict[str, Any] = {}
        for container, fqn, entry, view in self._pending:
            if entry.name not in loaded:
                loaded[entry.name] = self._pickled(entry)
            container[fqn] = loaded[entry.name] if view is None else _viewed(loaded[entry.name], view)

    def _tensor(self, where: str, meta: dict[str, Any], tensor_meta: dict[str, Any], entry: ZipEntry) -> Tensor:
        code = tensor_meta.get("dtype")
        dtype = dtype_by_name(SCALAR_TYPES.get(code, "")) if type(code) is int else None
        if dtype is None:
            raise CorruptCheckpointError(f"{where} has an unknown dtype code {short_repr(code)}")
        sizes = tuple(_symint(s, where, "size") for s in _list(tensor_meta.get("sizes"), where, "sizes"))
        strides = tuple(_symint(s, where, "stride") for s in _list(tensor_meta.get("strides"), where, "strides"))
        offset = _symint(tensor_meta.get("storage_offset"), where, "storage_offset")
        requires_grad = _flag(tensor_meta.get("requires_grad", False), where, "requires_grad")
        is_param = _flag(meta.get("is_param", False), where, "is_param")
        storage = self._storage(where, entry, dtype, _location(tensor_meta.get("device"), where))
        # An empty record for a non-empty tensor (a fake tensor when saved): torch loads zeros; no bytes to show.
        no_data = storage.nbytes == 0 and math.prod(sizes) != 0
        try:
            tensor = rebuild.make_tensor(None if no_data else storage, offset, sizes, strides, dtype, requires_grad,
                                         kind="no_data" if no_data else "dense")
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{where}: {exc.reason}") from None
        tensor.is_parameter = is_param
        key = (entry.name, dtype.name, tensor.shape, tensor.stride, tensor.storage_offset, requires_grad, is_param)
        return self._views.setdefault(key, tensor)

    def _storage(self, where: str, entry: ZipEntry, dtype: DType, location: str) -> Storage:
        record = entry.name[len(self.archive.prefix):]
        known = self.storages.get(record)
        if known is not None:
            if known.dtype is not dtype:
                raise CorruptCheckpointError(f"{where} views record {record!r} as {dtype.name}, "
                                             f"another entry as {known.dtype.name}")
            return known
        if entry.method not in (STORED, DEFLATED):
            raise UnsupportedError(f"record {record!r} uses compression method {entry.method}")
        if entry.size % dtype.itemsize:
            raise CorruptCheckpointError(f"record {record!r} holds {entry.size} bytes, not a whole number of "
                                         f"{dtype.name} elements")
        storage = Storage(record, dtype, location, entry.size // dtype.itemsize, record, size=entry.size,
                          source=self.archive.source, compressed=entry.method == DEFLATED)
        self.storages[record] = storage
        return storage

    def _pickled(self, entry: ZipEntry) -> Any:
        record = entry.name[len(self.archive.prefix):]
        if not record.rpartition("/")[2].startswith(OPAQUE_PREFIX):
            parsed = open_embedded(self.archive, entry, self.limits)
            self.embedded_storages.extend(parsed.storages)
            return parsed.root
        data = self.archive.read_records({record: self.limits.max_pickle_bytes})[record]
        try:
            return SafeUnpickler(data, resolve=rebuild.resolve, limits=self.limits).load()
        except CorruptCheckpointError as exc:
            raise type(exc)(f"record {record!r} (a pickled object): {exc.reason}") from None


class View(NamedTuple):
    where: str
    sizes: tuple[Any, ...]
    strides: tuple[Any, ...]
    offset: Any


def _viewed(base: Any, view: View) -> Tensor:
    """``base.as_strided(sizes, strides, offset)``, as torch's loader makes an AOTInductor weight."""
    if not isinstance(base, Tensor) or base.storage is None:
        raise CorruptCheckpointError(f"{view.where}: its file holds {short_repr(base)}, not a tensor with data")
    try:
        return rebuild.make_tensor(base.storage, view.offset, view.sizes, view.strides, base.dtype,
                                   base.requires_grad)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{view.where}: {exc.reason}") from None


def _json(text: bytes, record: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{record} is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(document, dict):
        raise CorruptCheckpointError(f"{record} is {short_repr(document)}, not a JSON object")
    return document


def _config(text: bytes, record: str) -> dict[str, Any]:
    config = _json(text, record).get("config")
    if not isinstance(config, dict):
        raise CorruptCheckpointError(f"{record} has no \"config\" object")
    return config


def _list(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > rebuild.MAX_RANK:
        raise CorruptCheckpointError(f"{where} has {what} {short_repr(value)}, not a list of at most "
                                     f"{rebuild.MAX_RANK} dimensions")
    return value


def _symint(value: Any, where: str, what: str) -> int:
    if isinstance(value, dict) and type(value.get("as_int")) is int:
        return value["as_int"]
    if isinstance(value, dict) and "as_expr" in value:
        raise UnsupportedError(f"{where} has a symbolic {what} {short_repr(value)}")
    raise CorruptCheckpointError(f"{where} has {what} {short_repr(value)}, not {{\"as_int\": N}}")


def _flag(value: Any, where: str, what: str) -> bool:
    if type(value) is not bool:
        raise CorruptCheckpointError(f"{where} has {what} {short_repr(value)}, not true or false")
    return value


def _location(device: Any, where: str) -> str:
    """``cpu``, ``cuda:0`` …: where torch puts the tensor (the bytes are always the host copy)."""
    if device is None:
        return "cpu"
    kind = device.get("type") if isinstance(device, dict) else None
    index = device.get("index") if isinstance(device, dict) else None
    if not isinstance(kind, str) or not kind.isidentifier() or len(kind) > 64 or not (
            index is None or (type(index) is int and 0 <= index < 1 << 16)):
        raise CorruptCheckpointError(f"{where} has device {short_repr(device)}")
    return kind if index is None else f"{kind}:{index}"
