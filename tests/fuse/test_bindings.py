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


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, ...]]:
    """What the installed libfuse3 headers say, by a C program compiled against them."""
    if shutil.which("gcc") is None or not Path("/usr/include/fuse3/fuse.h").exists():
        pytest.fail("gcc and libfuse3-dev are needed (scripts/setup --test installs them)")
    directory = tmp_path_factory.mktemp("probe")
    (directory / "probe.c").write_text(PROBE)
    subprocess.run(["gcc", "-I/usr/include/fuse3", "-o", str(directory / "probe"), str(directory / "probe.c")],
                   check=True)
    output = subprocess.run([str(directory / "probe")], check=True, capture_output=True, text=True).stdout
    return {name: tuple(int(n) for n in rest) for name, *rest in (line.split() for line in output.splitlines())}


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
