"""libfuse3's low-level API through ctypes: the structures and calls a session answering by inode number needs.

mfusepy binds the high-level API only, whose node table and paths cost a
mount of 200,000 tensors ~146 MiB and ~1 s a listing (scripts/bench_lib's
``listing.c`` against ``listing_ll.c``). Layouts follow ``fuse_lowlevel.h`` and
``fuse_common.h`` of libfuse 3.14 (``FUSE_USE_VERSION`` 34); tests/fuse/test_bindings.py
checks them against the installed headers.
"""

from __future__ import annotations

import ctypes
import signal
from typing import Any

from ckptfs.errors import MountError
from ckptfs.fuse import bindings

mfusepy = bindings.load_mfusepy()

Stat = mfusepy.c_stat
StatVfs = mfusepy.c_statvfs

FUSE_CAP_NO_OPENDIR_SUPPORT = 1 << 24

_INO = ctypes.c_uint64
_REQ = ctypes.c_void_p
_OFF = ctypes.c_int64
_SIZE = ctypes.c_size_t
_PTR = ctypes.c_void_p


class FuseEntryParam(ctypes.Structure):
    _fields_ = [
        ("ino", _INO),
        ("generation", ctypes.c_uint64),
        ("attr", Stat),
        ("attr_timeout", ctypes.c_double),
        ("entry_timeout", ctypes.c_double),
    ]


class FuseConnInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint) for name in (
        "proto_major", "proto_minor", "max_write", "max_read", "max_readahead", "capable", "want", "max_background",
        "congestion_threshold", "time_gran")] + [("reserved", ctypes.c_uint * 22)]


class FuseFileInfo(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_int),
        ("bits", ctypes.c_uint),  # writepage … noflush: bit fields, unused here
        ("padding2", ctypes.c_uint),
        ("fh", ctypes.c_uint64),
        ("lock_owner", ctypes.c_uint64),
        ("poll_events", ctypes.c_uint32),
    ]


class FuseArgs(ctypes.Structure):
    _fields_ = [("argc", ctypes.c_int), ("argv", ctypes.POINTER(ctypes.c_char_p)), ("allocated", ctypes.c_int)]


def _op(*argtypes: Any) -> Any:
    return ctypes.CFUNCTYPE(None, *argtypes)


_FI = ctypes.c_void_p
"""A ``struct fuse_file_info *`` as a plain address: no pointer object made per request."""
INIT = _op(_PTR, ctypes.POINTER(FuseConnInfo))
LOOKUP = _op(_REQ, _INO, ctypes.c_char_p)
BY_INO = _op(_REQ, _INO)
"""``readlink``, ``statfs``."""
WITH_FILE = _op(_REQ, _INO, _FI)
"""``getattr``, ``open``, ``opendir``."""
LISTING = _op(_REQ, _INO, _SIZE, _OFF, _FI)
"""``read``, ``readdir``, ``readdirplus``."""

OPERATIONS = (
    "init", "destroy", "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir",
    "symlink", "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir", "readdir",
    "releasedir", "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr", "removexattr", "access", "create",
    "getlk", "setlk", "bmap", "ioctl", "poll", "write_buf", "retrieve_reply", "forget_multi", "flock", "fallocate",
    "readdirplus", "copy_file_range", "lseek")
"""``struct fuse_lowlevel_ops`` in order; those not set stay NULL (libfuse answers them ENOSYS, FORGETs with none)."""
_TYPES = {"init": INIT, "lookup": LOOKUP, "getattr": WITH_FILE, "readlink": BY_INO, "open": WITH_FILE,
          "read": LISTING, "opendir": WITH_FILE, "readdir": LISTING, "statfs": BY_INO, "readdirplus": LISTING}


class LowLevelOps(ctypes.Structure):
    _fields_ = [(name, _TYPES.get(name, _PTR)) for name in OPERATIONS]


def _load() -> ctypes.CDLL:
    try:
        return ctypes.CDLL(bindings.LIBFUSE3)
    except OSError as exc:
        raise MountError(f"FUSE is not available: cannot load {bindings.LIBFUSE3} ({exc}); "
                         f"{bindings.INSTALL_HINT}") from None


_lib = _load()


def _function(name: str, restype: Any, *argtypes: Any) -> Any:
    function = getattr(_lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


_SESSION = ctypes.c_void_p
session_new = _function("fuse_session_new", _SESSION, ctypes.POINTER(FuseArgs), ctypes.POINTER(LowLevelOps), _SIZE,
                        _PTR)
set_signal_handlers = _function("fuse_set_signal_handlers", ctypes.c_int, _SESSION)
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""libfuse's handlers end the session on these (its own loop then returns the signal's number): threads other than
the one whose read they must interrupt block them."""
remove_signal_handlers = _function("fuse_remove_signal_handlers", None, _SESSION)
session_mount = _function("fuse_session_mount", ctypes.c_int, _SESSION, ctypes.c_char_p)
session_loop = _function("fuse_session_loop", ctypes.c_int, _SESSION)
session_loop_mt = _function("fuse_session_loop_mt_312", ctypes.c_int, _SESSION, _PTR)
session_receive_buf = _function("fuse_session_receive_buf", ctypes.c_int, _SESSION, _PTR)
session_process_buf = _function("fuse_session_process_buf", None, _SESSION, _PTR)
session_exited = _function("fuse_session_exited", ctypes.c_int, _SESSION)
session_unmount = _function("fuse_session_unmount", None, _SESSION)
session_destroy = _function("fuse_session_destroy", None, _SESSION)
loop_cfg_create = _function("fuse_loop_cfg_create", _PTR)
loop_cfg_destroy = _function("fuse_loop_cfg_destroy", None, _PTR)
opt_free_args = _function("fuse_opt_free_args", None, ctypes.POINTER(FuseArgs))

reply_err = _function("fuse_reply_err", ctypes.c_int, _REQ, ctypes.c_int)
reply_entry = _function("fuse_reply_entry", ctypes.c_int, _REQ, _PTR)
reply_attr = _function("fuse_reply_attr", ctypes.c_int, _REQ, _PTR, ctypes.c_double)
reply_readlink = _function("fuse_reply_readlink", ctypes.c_int, _REQ, ctypes.c_char_p)
reply_open = _function("fuse_reply_open", ctypes.c_int, _REQ, _FI)
reply_buf = _function("fuse_reply_buf", ctypes.c_int, _REQ, _PTR, _SIZE)
reply_data = _function("fuse_reply_data", ctypes.c_int, _REQ, _PTR, ctypes.c_int)
reply_statfs = _function("fuse_reply_statfs", ctypes.c_int, _REQ, _PTR)
add_direntry = _function("fuse_add_direntry", _SIZE, _REQ, _PTR, _SIZE, ctypes.c_char_p, _PTR, _OFF)
add_direntry_plus = _function("fuse_add_direntry_plus", _SIZE, _REQ, _PTR, _SIZE, ctypes.c_char_p, _PTR, _OFF)
session_fd = _function("fuse_session_fd", ctypes.c_int, _SESSION)
session_reset = _function("fuse_session_reset", None, _SESSION)
"""``fuse_session_fd`` and ``reset``, with ``receive_buf`` and ``process_buf``: requests answered after the loop
has ended (``fuse.page_store``)."""
notify_store = _function("fuse_lowlevel_notify_store", ctypes.c_int, _SESSION, _INO, _OFF, _PTR, ctypes.c_int)
"""``(session, ino, offset, struct fuse_bufvec *, enum fuse_buf_copy_flags)``: see ``fuse.page_store``."""


def make_args(arguments: list[bytes]) -> FuseArgs:
    """A ``struct fuse_args`` of ``arguments`` (the first is the program's name); the caller keeps it alive."""
    argv = (ctypes.c_char_p * (len(arguments) + 1))(*arguments, None)
    args = FuseArgs(len(arguments), argv, 0)
    args._keep = argv  # type: ignore[attr-defined]
    return args
