"""ckptfs' own ctypes layouts of libfuse3 structures, checked against the installed C headers.

mfusepy has no public way to hand ``read_buf`` raw addresses or to build a
multi-buffer ``fuse_bufvec``; ckptfs defines those layouts itself. Should an
mfusepy or libfuse release lay them out differently, these tests fail by name
before a mount could misread memory.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll

mfusepy = libfuse.load_mfusepy()

PROBE = r"""
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <stddef.h>
#include <stdio.h>
#define FIELD(type, field) printf(#type "." #field " %zu %zu\n", offsetof(struct type, field), sizeof(((struct type *)0)->field))
int main(void) {
    printf("fuse_buf %zu\n", sizeof(struct fuse_buf));
    FIELD(fuse_buf, size); FIELD(fuse_buf, flags); FIELD(fuse_buf, mem); FIELD(fuse_buf, fd); FIELD(fuse_buf, pos);
    printf("fuse_bufvec %zu\n", sizeof(struct fuse_bufvec));
    FIELD(fuse_bufvec, count); FIELD(fuse_bufvec, idx); FIELD(fuse_bufvec, off); FIELD(fuse_bufvec, buf);
    FIELD(fuse_file_info, fh);
    FIELD(fuse_operations, getattr); FIELD(fuse_operations, readdir); FIELD(fuse_operations, read_buf);
    FIELD(fuse_operations, init);
    printf("fuse_operations %zu\n", sizeof(struct fuse_operations));
    printf("FUSE_BUF_IS_FD %d\nFUSE_BUF_FD_SEEK %d\n", FUSE_BUF_IS_FD, FUSE_BUF_FD_SEEK);
    printf("FUSE_CAP_READDIRPLUS %d\nFUSE_CAP_READDIRPLUS_AUTO %d\nFUSE_CAP_CACHE_SYMLINKS %d\n",
           FUSE_CAP_READDIRPLUS, FUSE_CAP_READDIRPLUS_AUTO, FUSE_CAP_CACHE_SYMLINKS);
    printf("FUSE_CAP_NO_OPEN_SUPPORT %d\n", FUSE_CAP_NO_OPEN_SUPPORT);
    printf("FUSE_READDIR_PLUS %d\nFUSE_FILL_DIR_PLUS %d\n", FUSE_READDIR_PLUS, FUSE_FILL_DIR_PLUS);
    return 0;
}
"""


def _probe(tmp_path_factory: pytest.TempPathFactory, name: str, program: str,
           header_file: str) -> dict[str, tuple[int, ...]]:
    """The ``NAME NUMBER...`` lines a C program compiled against the installed libfuse3 headers prints."""
    if shutil.which("gcc") is None or not Path("/usr/include/fuse3", header_file).exists():
        pytest.fail("gcc and libfuse3-dev are needed (scripts/setup --test installs them)")
    directory = tmp_path_factory.mktemp(name)
    (directory / "probe.c").write_text(program)
    subprocess.run(["gcc", "-I/usr/include/fuse3", "-o", str(directory / "probe"), str(directory / "probe.c")],
                   check=True)
    output = subprocess.run([str(directory / "probe")], check=True, capture_output=True, text=True).stdout
    return {name: tuple(int(n) for n in rest) for name, *rest in (line.split() for line in output.splitlines())}


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, ...]]:
    """What the installed libfuse3 headers say, by a C program compiled against them."""
    return _probe(tmp_path_factory, "probe", PROBE, "fuse.h")


def _field(structure: type[ctypes.Structure], name: str) -> tuple[int, int]:
    descriptor = getattr(structure, name)
    return descriptor.offset, descriptor.size


def test_fuse_buf_and_bufvec_match_fuse_common_h(header: dict[str, tuple[int, ...]]) -> None:
    assert (ctypes.sizeof(libfuse.FuseBuf),) == header["fuse_buf"]
    for name in ("size", "flags", "mem", "fd", "pos"):
        assert _field(libfuse.FuseBuf, name) == header[f"fuse_buf.{name}"], name
    assert (ctypes.sizeof(libfuse.FuseBufvec),) == header["fuse_bufvec"]
    for name in ("count", "idx", "off", "buf"):
        assert _field(libfuse.FuseBufvec, name) == header[f"fuse_bufvec.{name}"], name


def test_flags_and_capabilities_match_the_headers(header: dict[str, tuple[int, ...]]) -> None:
    for name in ("FUSE_BUF_IS_FD", "FUSE_BUF_FD_SEEK", "FUSE_CAP_READDIRPLUS", "FUSE_CAP_READDIRPLUS_AUTO",
                 "FUSE_CAP_CACHE_SYMLINKS", "FUSE_CAP_NO_OPEN_SUPPORT", "FUSE_READDIR_PLUS", "FUSE_FILL_DIR_PLUS"):
        assert (getattr(libfuse, name),) == header[name], name


def test_the_operations_table_and_file_handle_match_fuse_h(header: dict[str, tuple[int, ...]]) -> None:
    operations = libfuse.operations_table(mfusepy)
    assert (ctypes.sizeof(operations),) == header["fuse_operations"]
    for name in ("getattr", "readdir", "read_buf", "init"):
        assert _field(operations, name) == header[f"fuse_operations.{name}"], name
    assert _field(mfusepy.fuse_file_info, "fh") == header["fuse_file_info.fh"]


LOWLEVEL_PROBE = r"""
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/statvfs.h>
#define FIELD(type, field) printf(#type "." #field " %zu %zu\n", offsetof(struct type, field), sizeof(((struct type *)0)->field))
#define OP(field) FIELD(fuse_lowlevel_ops, field)
int main(void) {
    printf("fuse_lowlevel_ops %zu\n", sizeof(struct fuse_lowlevel_ops));
    OP(init); OP(destroy); OP(lookup); OP(forget); OP(getattr); OP(setattr); OP(readlink); OP(mknod); OP(mkdir);
    OP(unlink); OP(rmdir); OP(symlink); OP(rename); OP(link); OP(open); OP(read); OP(write); OP(flush); OP(release);
    OP(fsync); OP(opendir); OP(readdir); OP(releasedir); OP(fsyncdir); OP(statfs); OP(setxattr); OP(getxattr);
    OP(listxattr); OP(removexattr); OP(access); OP(create); OP(getlk); OP(setlk); OP(bmap); OP(ioctl); OP(poll);
    OP(write_buf); OP(retrieve_reply); OP(forget_multi); OP(flock); OP(fallocate); OP(readdirplus);
    OP(copy_file_range); OP(lseek);
    printf("fuse_entry_param %zu\n", sizeof(struct fuse_entry_param));
    FIELD(fuse_entry_param, ino); FIELD(fuse_entry_param, generation); FIELD(fuse_entry_param, attr);
    FIELD(fuse_entry_param, attr_timeout); FIELD(fuse_entry_param, entry_timeout);
    printf("fuse_conn_info %zu\n", sizeof(struct fuse_conn_info));
    FIELD(fuse_conn_info, max_read); FIELD(fuse_conn_info, max_readahead); FIELD(fuse_conn_info, capable);
    FIELD(fuse_conn_info, want); FIELD(fuse_conn_info, reserved);
    printf("fuse_file_info %zu\n", sizeof(struct fuse_file_info));
    FIELD(fuse_file_info, flags); FIELD(fuse_file_info, fh); FIELD(fuse_file_info, poll_events);
    printf("fuse_args %zu\n", sizeof(struct fuse_args));
    FIELD(fuse_args, argc); FIELD(fuse_args, argv); FIELD(fuse_args, allocated);
    printf("statvfs %zu\n", sizeof(struct statvfs));
    FIELD(statvfs, f_bsize); FIELD(statvfs, f_frsize); FIELD(statvfs, f_blocks); FIELD(statvfs, f_bfree);
    FIELD(statvfs, f_bavail); FIELD(statvfs, f_files); FIELD(statvfs, f_ffree); FIELD(statvfs, f_namemax);
    printf("stat %zu\n", sizeof(struct stat));
    printf("FUSE_CAP_NO_OPENDIR_SUPPORT %d\n", FUSE_CAP_NO_OPENDIR_SUPPORT);
    return 0;
}
"""


@pytest.fixture(scope="module")
def lowlevel_header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, ...]]:
    """What the installed ``fuse_lowlevel.h`` says, as ``header`` (FUSE_USE_VERSION 34, ckptfs' own)."""
    return _probe(tmp_path_factory, "lowlevel_probe", LOWLEVEL_PROBE, "fuse_lowlevel.h")


def test_the_lowlevel_operations_table_matches_fuse_lowlevel_h(lowlevel_header: dict[str, tuple[int, ...]]) -> None:
    assert (ctypes.sizeof(ll.LowLevelOps),) == lowlevel_header["fuse_lowlevel_ops"]
    for name in ll.OPERATIONS:
        assert _field(ll.LowLevelOps, name) == lowlevel_header[f"fuse_lowlevel_ops.{name}"], name
    assert len(ll.OPERATIONS) == len([key for key in lowlevel_header if key.startswith("fuse_lowlevel_ops.")])


@pytest.mark.parametrize(("structure", "c_name", "fields"), [
    (ll.FuseEntryParam, "fuse_entry_param", ("ino", "generation", "attr", "attr_timeout", "entry_timeout")),
    (ll.FuseConnInfo, "fuse_conn_info", ("max_read", "max_readahead", "capable", "want", "reserved")),
    (ll.FuseFileInfo, "fuse_file_info", ("flags", "fh", "poll_events")),
    (ll.FuseArgs, "fuse_args", ("argc", "argv", "allocated")),
    (ll.StatVfs, "statvfs", ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                             "f_namemax")),
])
def test_lowlevel_structures_match_the_headers(lowlevel_header: dict[str, tuple[int, ...]],
                                               structure: type[ctypes.Structure], c_name: str,
                                               fields: tuple[str, ...]) -> None:
    assert (ctypes.sizeof(structure),) == lowlevel_header[c_name]
    for name in fields:
        assert _field(structure, name) == lowlevel_header[f"{c_name}.{name}"], name
    assert (ctypes.sizeof(ll.Stat),) == lowlevel_header["stat"]
    assert (ll.FUSE_CAP_NO_OPENDIR_SUPPORT,) == lowlevel_header["FUSE_CAP_NO_OPENDIR_SUPPORT"]


def test_a_bufvec_of_fd_ranges_and_bytes_is_freed_whole() -> None:
    address = libfuse.bufvec([(5, 100, 10), b"abc", b""])
    vec = libfuse.FuseBufvec.from_address(address)
    bufs = (libfuse.FuseBuf * vec.count).from_address(address + libfuse.FuseBufvec.buf.offset)
    assert [(b.size, b.fd, b.pos) for b in bufs][0] == (10, 5, 100)
    assert ctypes.string_at(bufs[1].mem, bufs[1].size) == b"abc" and bufs[2].size == 0
    libfuse.free_bufvec(address)  # glibc aborts the process on a bad or double free: the test would not pass


STORE_PROBE = r"""
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <stdio.h>
_Static_assert(__builtin_types_compatible_p(__typeof__(&fuse_lowlevel_notify_store),
    int (*)(struct fuse_session *, fuse_ino_t, off_t, struct fuse_bufvec *, enum fuse_buf_copy_flags)),
    "fuse_lowlevel_notify_store is declared otherwise");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fuse_session_fd), int (*)(struct fuse_session *)), "fd");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fuse_session_reset), void (*)(struct fuse_session *)),
    "reset");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fuse_session_receive_buf),
    int (*)(struct fuse_session *, struct fuse_buf *)), "receive_buf");
_Static_assert(__builtin_types_compatible_p(__typeof__(&fuse_session_process_buf),
    void (*)(struct fuse_session *, const struct fuse_buf *)), "process_buf");
int main(void) {
    printf("notify_store %zu %zu %zu %zu %zu\n", sizeof(struct fuse_session *), sizeof(fuse_ino_t), sizeof(off_t),
           sizeof(struct fuse_bufvec *), sizeof(enum fuse_buf_copy_flags));
    return 0;
}
"""


def test_page_store_calls_are_bound_as_fuse_lowlevel_h_declares_them(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The program does not build if a function is declared with other types; notify_store's arguments' sizes are
    those ctypes passes, the others take the session and a ``struct fuse_buf`` by address."""
    found = _probe(tmp_path_factory, "store_probe", STORE_PROBE, "fuse_lowlevel.h")
    assert ll.notify_store.restype is ctypes.c_int
    assert found["notify_store"] == tuple(ctypes.sizeof(t) for t in ll.notify_store.argtypes)
    assert (ll.session_fd.restype, ll.session_receive_buf.restype) == (ctypes.c_int, ctypes.c_int)
    assert ll.session_reset.restype is None and ll.session_process_buf.restype is None
    assert [len(f.argtypes) for f in (ll.session_fd, ll.session_reset, ll.session_receive_buf,
                                      ll.session_process_buf)] == [1, 1, 2, 2]
