"""TAR checkpoints of torch ≤ 0.3, read as torch 2.13's ``_legacy_load.legacy_load`` reads them.

Layout (spec more-formats §C): an uncompressed tar whose members ``storages``,
``tensors`` and ``pickle`` torch extracts by name (``sys_info`` is never read).
``storages``: pickle(M), then M × [pickle((key, location, torch.XStorage)),
int64 element count, the raw little-endian bytes], then a pickle of storage
views ``[(view_key, root_key, element_offset, numel), …]``. ``tensors``:
pickle(N), then N × [pickle((key, storage_key, torch.XTensor)), int32 ndim and
4 pad bytes, int64 sizes, int64 strides, int64 storage offset]. ``pickle``: the
object, each tensor a persistent id ``str(key)`` (a tuple id is a module class).
Pickles carry no length (protocol ≤ 2 has no frames): each is read up to its
STOP. Opening reads the tar headers, each storage's pickle and count (never
its bytes), and the two metadata members whole; storage bytes stay in the file.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ckptfs.errors import CorruptCheckpointError, LimitExceededError, NotACheckpointError, TruncatedPickleError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import dtype_of_storage_class
from ckptfs.model.records import Storage, Tensor
from ckptfs.pickle.unpickler import load_at
from ckptfs.pickle.values import Global, short_repr
from ckptfs.sources import ByteSource
from ckptfs.sources.memory import BytesSource

BLOCK = 512
MEMBERS = ("storages", "tensors", "pickle")
NOT_A_CHECKPOINT = "a tar archive, but not a torch ≤ 0.3 checkpoint (no {} member)"
PICKLE_WINDOW = 4096
INT64 = struct.Struct("<q")
_KEY = re.compile(r"-?[0-9]+")


class _Member:
    __slots__ = ("offset", "size")

    def __init__(self, offset: int, size: int) -> None:
        self.offset = offset
        self.size = size


def probe(opening: Prefetch, head: bytes, limits: Limits) -> bool:
    """A tar header: ``ustar`` magic (POSIX, PAX and GNU tars alike) at offset 257 of the first block."""
    return len(head) >= 262 and head[257:262] == b"ustar"


def open_tar(opening: Prefetch, limits: Limits) -> ParsedCheckpoint:
    source = opening.source
    members = _members(opening, limits)
    storages = _read_storages(source, members["storages"], limits)
    tensors = _read_tensors(source, members["tensors"], storages, limits)
    main = members["pickle"]
    if main.size > limits.max_pickle_bytes:
        raise LimitExceededError(f"tar member 'pickle' of {main.size} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")

    def persistent_load(pid: Any) -> Any:
        if isinstance(pid, tuple):
            return pid[0] if pid else None
        tensor = tensors.get(_key(pid, "persistent id"))
        if tensor is None:
            raise CorruptCheckpointError(f"the pickle names tensor {short_repr(pid)}, which the tensors member lacks")
        return tensor

    root, _ = load_at(source.read(main.offset, main.size), resolve=rebuild.resolve,
                      persistent_load=persistent_load, limits=limits)
    views = sum(1 for s in storages.values() if s.base is not None)
    details = {"storages": len(storages) - views, "storage_views": views, "tensor_records": len(tensors)}
    return ParsedCheckpoint("tar", root, list(storages.values()), "little", details)


def _members(source: Prefetch, limits: Limits) -> dict[str, _Member]:
    """The offsets and sizes of the members torch reads, from the tar's headers (PAX and GNU long names too)."""
    found: dict[str, _Member] = {}
    pos, count, long_name, pax = 0, 0, None, {}
    while len(found) < len(MEMBERS):
        if pos + BLOCK > source.size:
            raise CorruptCheckpointError(f"tar archive ends at byte {source.size}, inside or before the header "
                                         f"at offset {pos} (truncated?)")
        header = source.read(pos, BLOCK)
        if header == bytes(BLOCK):
            break
        count += 1
        if count > limits.max_zip_entries:
            raise LimitExceededError(f"tar has more than {limits.max_zip_entries} members "
                                     "(limit max_zip_entries)")
        _check_sum(header, pos)
        size = int(pax.get("size", _size(header, pos)))
        data = pos + BLOCK
        if data + size > source.size:
            raise CorruptCheckpointError(f"tar member at offset {pos} ({size} bytes) runs past the end of the file")
        kind = header[156:157]
        if kind in (b"x", b"g", b"L"):
            if size > 1 << 20:
                raise CorruptCheckpointError(f"tar extended header at offset {pos} declares {size} bytes")
            text = source.read(data, size)
            if kind == b"L":
                long_name = text.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"x":
                pax = _pax_records(text, pos)
        else:
            name = long_name or pax.get("path") or _name(header)
            if kind in (b"0", b"\0") and name in MEMBERS and name not in found:
                found[name] = _Member(data, size)
            long_name, pax = None, {}
        pos = data + -(-size // BLOCK) * BLOCK
    for name in MEMBERS:
        if name not in found:
            raise NotACheckpointError(NOT_A_CHECKPOINT.format(repr(name)))
    if pos + 2 * BLOCK > source.size:
        # Every tar writer ends the archive with two zero blocks (or more members): a cut file lacks them.
        raise CorruptCheckpointError(f"tar archive ends at byte {source.size} without its end-of-archive blocks "
                                     "(truncated?)")
    return found


def _check_sum(header: bytes, pos: int) -> None:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    expected = sum(header[:148]) + 8 * 0x20 + sum(header[156:])
    if not stored or not re.fullmatch(rb"[0-7]+", stored) or int(stored, 8) != expected:
        raise CorruptCheckpointError(f"tar header at offset {pos} has a bad checksum")


def _size(header: bytes, pos: int) -> int:
    field = header[124:136]
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    if not re.fullmatch(rb"[0-7]*", text):
        raise CorruptCheckpointError(f"tar header at offset {pos} has a bad size field")
    return int(text or b"0", 8)


def _name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:263] == b"ustar\0" else b""
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "replace")


def _pax_records(text: bytes, pos: int) -> dict[str, str]:
    records, at = {}, 0
    while at < len(text):
        length_text, _, _ = text[at : at + 20].partition(b" ")
        if not length_text.isdigit() or int(length_text) <= len(length_text) or at + int(length_text) > len(text):
            raise CorruptCheckpointError(f"bad pax record in the tar header at offset {pos}")
        record = text[at + len(length_text) + 1 : at + int(length_text) - 1].decode("utf-8", "replace")
        key, _, value = record.partition("=")
        if key == "size" and not value.isdigit():
            raise CorruptCheckpointError(f"bad pax size {value!r} in the tar header at offset {pos}")
        records[key] = value
        at += int(length_text)
    return records


class _Pickles:
    """Reads the pickles and integers laid end to end in one member, each from a small ranged read."""

    def __init__(self, source: ByteSource, member: _Member, name: str, limits: Limits) -> None:
        self.source = source
        self.pos = member.offset
        self.end = member.offset + member.size
        self.name = name
        self.limits = limits

    def pickle(self) -> Any:
        window = PICKLE_WINDOW
        while True:
            length = min(window, self.end - self.pos)
            try:
                value, end = load_at(self.source.read(self.pos, length), limits=self.limits)
            except TruncatedPickleError:
                if length >= min(self.end - self.pos, self.limits.max_pickle_bytes):
                    raise CorruptCheckpointError(f"a pickle of tar member {self.name!r} is truncated") from None
                window *= 4
                continue
            self.pos += end
            return value

    def ints(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > self.end:
            raise CorruptCheckpointError(f"tar member {self.name!r} ends inside its metadata")
        values = struct.unpack(fmt, self.source.read(self.pos, size))
        self.pos += size
        return values

    def skip(self, size: int) -> int:
        """Steps over ``size`` bytes; returns where they start."""
        start = self.pos
        if start + size > self.end:
            raise CorruptCheckpointError(f"tar member {self.name!r} ends inside a storage's {size} bytes")
        self.pos += size
        return start


def _count(value: Any, what: str, limit: int) -> int:
    if type(value) is not int or value < 0:
        raise CorruptCheckpointError(f"the {what} count is {short_repr(value)}, not a count")
    if value > limit:
        raise LimitExceededError(f"{value} {what}s exceed {limit} (limit max_tensors)")
    return value


def _key(value: Any, what: str) -> int:
    """torch keys objects by ``int(saved_id)``: C pointers written as ints, or their text."""
    if type(value) is int:
        return value
    if isinstance(value, str) and _KEY.fullmatch(value):
        return int(value)
    raise CorruptCheckpointError(f"{what} {short_repr(value)} is not an integer key")


def _read_storages(source: ByteSource, member: _Member, limits: Limits) -> dict[int, Storage]:
    reader = _Pickles(source, member, "storages", limits)
    storages: dict[int, Storage] = {}
    for _ in range(_count(reader.pickle(), "storage", limits.max_tensors)):
        entry = reader.pickle()
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[1], str)
                and isinstance(entry[2], Global)):
            raise CorruptCheckpointError(f"storage entry {short_repr(entry)} is not (key, location, class)")
        key = _key(entry[0], "storage key")
        dtype = dtype_of_storage_class(entry[2].module, entry[2].name)
        if dtype is None or dtype.name == "untyped":
            raise CorruptCheckpointError(f"unknown storage class {entry[2].qualname} for storage {key}")
        (numel,) = reader.ints("<q")
        if numel < 0:
            raise CorruptCheckpointError(f"storage {key} has a negative element count {numel}")
        if key in storages:
            raise CorruptCheckpointError(f"storage {key} appears twice")
        storage = Storage(str(key), dtype, entry[1], numel, f"storages:{key}", source=source)
        storage.offset = reader.skip(storage.nbytes)
        storage.size = storage.nbytes
        storages[key] = storage
    views = reader.pickle()
    if not isinstance(views, list):
        raise CorruptCheckpointError(f"storage views are {short_repr(views)}, not a list")
    for view in views:
        _add_view(storages, view)
    return storages


def _add_view(storages: dict[int, Storage], view: Any) -> None:
    if not (isinstance(view, tuple) and len(view) == 4):
        raise CorruptCheckpointError(f"storage view {short_repr(view)} is not (key, root, offset, numel)")
    key, root_key = _key(view[0], "storage view key"), _key(view[1], "storage view root")
    offset, numel = view[2], view[3]
    root = storages.get(root_key)
    if root is None or root.base is not None:
        raise CorruptCheckpointError(f"storage view {key} names {root_key}, which is not a stored storage")
    if not (type(offset) is int and type(numel) is int and 0 <= offset and 0 <= numel
            and offset + numel <= root.numel):
        raise CorruptCheckpointError(f"storage view {key} ({short_repr(offset)} + {short_repr(numel)} elements) "
                                     f"runs past storage {root_key} of {root.numel}")
    if key in storages:
        raise CorruptCheckpointError(f"storage view {key} reuses a storage key")
    storage = Storage(str(key), root.dtype, root.location, numel, root.record, base=root, base_offset=offset,
                      source=root.source)
    storage.offset = root.offset + offset * root.dtype.itemsize
    storage.size = storage.nbytes
    storages[key] = storage


def _read_tensors(source: ByteSource, member: _Member, storages: dict[int, Storage],
                  limits: Limits) -> dict[int, Tensor]:
    if member.size > limits.max_pickle_bytes:
        raise LimitExceededError(f"tar member 'tensors' of {member.size} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")
    # Metadata alone, bounded like a pickle: read whole rather than in one read per tensor.
    whole = BytesSource(source.read(member.offset, member.size), source.name)
    reader = _Pickles(whole, _Member(0, member.size), "tensors", limits)
    tensors: dict[int, Tensor] = {}
    for _ in range(_count(reader.pickle(), "tensor", limits.max_tensors)):
        entry = reader.pickle()
        if not (isinstance(entry, tuple) and len(entry) == 3):
            raise CorruptCheckpointError(f"tensor entry {short_repr(entry)} is not (key, storage, class)")
        key, storage_key = _key(entry[0], "tensor key"), _key(entry[1], "tensor storage key")
        storage = storages.get(storage_key)
        if storage is None:
            raise CorruptCheckpointError(f"tensor {key} names storage {storage_key}, which the storages lack")
        (ndim, _pad) = reader.ints("<ii")
        if not 0 <= ndim <= rebuild.MAX_RANK:
            raise CorruptCheckpointError(f"tensor {key} has {ndim} dimensions")
        sizes, strides, (offset,) = reader.ints(f"<{ndim}q"), reader.ints(f"<{ndim}q"), reader.ints("<q")
        tensors[key] = rebuild.make_tensor(storage, offset, sizes, strides, storage.dtype)
    return tensors
