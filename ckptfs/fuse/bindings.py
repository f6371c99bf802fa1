"""libfuse3 through mfusepy, and the C pieces mfusepy does not get right.

mfusepy picks libfuse2 when both libraries are installed; ckptfs needs libfuse3
(requests up to 1 MiB, reads answered from a file descriptor), so it names the
library before mfusepy is first imported.

mfusepy 3.1.1 declares ``fuse_bufvec.buf`` as a pointer; in
``fuse_common.h`` it is an array of one ``fuse_buf`` inside the struct, so
``FuseBuf``/``FuseBufvec`` here follow the header. libfuse frees the bufvec
(and any memory buffer in it) with ``free``, so both come from libc's malloc.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
from types import ModuleType
from typing import Any, Iterator

from ckptfs.errors import MountError

LIBFUSE3 = "libfuse3.so.3"
INSTALL_HINT = "install fuse3 (Debian/Ubuntu: apt-get install fuse3)"

FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2

FUSE_CAP_SPLICE_WRITE = 1 << 7
FUSE_CAP_READDIRPLUS = 1 << 13
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14
FUSE_CAP_NO_OPEN_SUPPORT = 1 << 17
FUSE_CAP_CACHE_SYMLINKS = 1 << 23

FUSE_READDIR_PLUS = 1 << 0
FUSE_FILL_DIR_PLUS = 1 << 1

MAX_READ = (1 << 20) - (64 << 10)
"""Largest read request: a reply this large, its header and a page per buffer fit a pipe of 1 MiB (the most a
process without CAP_SYS_RESOURCE may have), so that libfuse splices it from the file descriptor (a local file's, the
memfd of remote blocks) into /dev/fuse rather than copying it through a buffer (``FUSE_CAP_SPLICE_WRITE``)."""

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 128 << 20


def load_mfusepy() -> ModuleType:
    """mfusepy bound to libfuse3; MountError saying how to install it when it is missing."""
    os.environ.setdefault("FUSE_LIBRARY_PATH", LIBFUSE3)
    try:
        import mfusepy
    except (OSError, AttributeError) as exc:
        raise MountError(f"FUSE is not available: cannot load {LIBFUSE3} ({exc}); {INSTALL_HINT}") from None
    if mfusepy.fuse_version_major != 3:
        raise MountError(f"FUSE is not available: {os.environ['FUSE_LIBRARY_PATH']} is libfuse "
                         f"{mfusepy.fuse_version_major}, ckptfs needs libfuse3; {INSTALL_HINT}")
    return mfusepy


class FuseBuf(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),
    ]


class FuseBufvec(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_size_t),
        ("idx", ctypes.c_size_t),
        ("off", ctypes.c_size_t),
        ("buf", FuseBuf * 1),
    ]


_BUFVEC = struct.Struct("=QQQQi4xQi4xq")
"""A one-buffer ``FuseBufvec`` packed in one call: count, idx, off, then size, flags, mem, fd, pos."""
assert _BUFVEC.size == ctypes.sizeof(FuseBufvec)
assert FuseBufvec.buf.offset + FuseBuf.pos.offset == _BUFVEC.size - 8

_libc = ctypes.CDLL(None, use_errno=True)
_malloc = _libc.malloc
_malloc.restype = ctypes.c_void_p
_malloc.argtypes = [ctypes.c_size_t]
_free = _libc.free
_free.restype = None
_free.argtypes = [ctypes.c_void_p]


def free_received(buf: FuseBuf) -> None:
    """Frees the memory ``fuse_session_receive_buf`` allocated into the ``FuseBuf`` ``buf`` (none: a no-op)."""
    _free(buf.mem)


_mallopt = _libc.mallopt
_mallopt.restype = ctypes.c_int
_mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
_memmove = ctypes.memmove


def keep_large_buffers_on_heap(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> None:
    """Pins glibc's malloc to the heap so each request's ~1 MiB buffers reuse warm pages.

    By default every allocation above 128 KiB is a fresh mmap, and freeing the
    top of the heap gives it back to the kernel; either way the pages fault in
    again on the next request, and libfuse allocates a reply buffer per read.
    """
    _mallopt(M_MMAP_THRESHOLD, mmap_threshold)
    _mallopt(M_TRIM_THRESHOLD, trim_threshold)


def fd_bufvec(fd: int, pos: int, size: int) -> int:
    """A malloc'ed bufvec telling libfuse to read ``size`` bytes of ``fd`` at ``pos`` itself."""
    address = _malloc(_BUFVEC.size)
    if not address:
        raise MemoryError("malloc failed for a fuse_bufvec")
    _memmove(address, _BUFVEC.pack(1, 0, 0, size, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, 0, fd, pos), _BUFVEC.size)
    return address


def bytes_bufvec(data: bytes) -> int:
    """A malloc'ed one-buffer bufvec holding a malloc'ed copy of ``data`` (``bufvec([data])`` in fewer calls)."""
    memory = _malloc(len(data) or 1)
    address = _malloc(_BUFVEC.size) if memory else None
    if not address:
        _free(memory)
        raise MemoryError("malloc failed for a fuse_bufvec")
    _memmove(memory, data, len(data))
    _memmove(address, _BUFVEC.pack(1, 0, 0, len(data), 0, memory, -1, 0), _BUFVEC.size)
    return address  # type: ignore[no-any-return]


_BUFVEC_HEAD = struct.Struct("=QQQ")
_BUF = struct.Struct("=Qi4xQi4xq")
"""One ``fuse_buf``: size, flags, mem, fd, pos."""
assert _BUFVEC_HEAD.size == FuseBufvec.buf.offset and _BUF.size == ctypes.sizeof(FuseBuf)

FdRange = tuple[int, int, int]
"""``(fd, pos, size)``: bytes libfuse reads from a file descriptor itself."""


def bufvec(buffers: list[FdRange | bytes]) -> int:
    """A malloc'ed bufvec of several buffers, in order: file-descriptor ranges and malloc'ed copies of bytes."""
    address = _malloc(_BUFVEC_HEAD.size + _BUF.size * len(buffers))
    if not address:
        raise MemoryError("malloc failed for a fuse_bufvec")
    packed = [_BUFVEC_HEAD.pack(len(buffers), 0, 0)]
    for buffer in buffers:
        if isinstance(buffer, tuple):
            fd, pos, size = buffer
            packed.append(_BUF.pack(size, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, 0, fd, pos))
            continue
        memory = _malloc(len(buffer) or 1)
        if not memory:
            raise MemoryError("malloc failed for a fuse_buf")
        _memmove(memory, buffer, len(buffer))
        packed.append(_BUF.pack(len(buffer), 0, memory, -1, 0))
    data = b"".join(packed)
    _memmove(address, data, len(data))
    return address


def free_bufvec(address: int) -> None:
    """Frees a bufvec made here and the memory buffers in it (libfuse's high-level API does so itself)."""
    count = _BUFVEC_HEAD.unpack(ctypes.string_at(address, _BUFVEC_HEAD.size))[0]
    for index in range(count):
        size, flags, memory, fd, pos = _BUF.unpack(ctypes.string_at(address + _BUFVEC_HEAD.size + index * _BUF.size,
                                                                    _BUF.size))
        if not flags & FUSE_BUF_IS_FD:
            _free(memory)
    _free(address)


class RawReadBuf(ctypes._CFuncPtr):  # type: ignore[misc,name-defined]
    """``read_buf``'s prototype with plain integers, the callable unwrapped from mfusepy's try/except partial:
    a read costs no path bytes, pointer objects or wrapper (the callback catches its own errors)."""

    _flags_ = ctypes._FUNCFLAG_CDECL  # type: ignore[attr-defined]
    _restype_ = ctypes.c_int
    _argtypes_ = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p)

    def __new__(cls, func: Any) -> Any:
        if isinstance(func, functools.partial):
            func = func.args[0]
        return super().__new__(cls, func)


@functools.cache
def operations_table(mfusepy: ModuleType) -> type[ctypes.Structure]:
    """mfusepy's ``struct fuse_operations`` with ``read_buf`` as ``RawReadBuf`` (layout checked by the tests
    against the installed ``fuse.h``)."""
    fields = [(name, RawReadBuf if name == "read_buf" else proto, *rest)
              for name, proto, *rest in mfusepy.fuse_operations._fields_]
    return type("FuseOperations", (ctypes.Structure,), {"_fields_": fields})


@contextlib.contextmanager
def raw_read_buf(mfusepy: ModuleType) -> Iterator[None]:
    """While mfusepy's FUSE is made (and its loop runs), it fills ``operations_table`` instead of its own:
    mfusepy has no other way to take a callback's prototype."""
    own = mfusepy.fuse_operations
    mfusepy.fuse_operations = operations_table(mfusepy)
    try:
        yield
    finally:
        mfusepy.fuse_operations = own
