"""Writing an output file: beside its final name, renamed when complete; bytes moved by the kernel where it can.

Stored byte ranges of local files go by ``copy_file_range`` (or ``sendfile``
where the output is on another file system), a bounded chunk at a time, so
memory stays flat whatever the size; the rest is written from memory. A file
is written as ``NAME.ckptfs-partial`` in the output's directory, fsynced and
renamed; on any error or interrupt it is removed and nothing is left behind.

The CRC-32 of each range the kernel copied is computed on a thread beside the
copying one, in copy order (``Behind``), read through a mapping of the source's
page cache (``file_crc``); the disk's writeback of the written ranges is started
as they are written (``WriteBack``).
"""

from __future__ import annotations

import errno
import functools
import os
from typing import BinaryIO, Callable

from isal.isal_zlib import crc32

from ckptfs.errors import OutputError
from ckptfs.saving.file_crc import file_crc32
from ckptfs.write_back import Behind, WriteBack

CHUNK = 8 << 20
"""Bytes copied at a time: the most a conversion holds in memory."""

KernelCopy = Callable[[int, int, int, int, int], int]
"""``copy(source_fd, out_fd, count, source_offset, out_offset)``: bytes copied at those offsets."""


class Crc:
    """A CRC-32 carried on over the pieces of one record, in order."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, data: bytes | memoryview) -> None:
        self.value = crc32(data, self.value)

    def carry(self, fd: int, offset: int, count: int) -> None:
        """Carried over a file's range, read through its page cache."""
        self.value = file_crc32(fd, offset, count, self.value)


def _copy_file_range(source: int, out: int, count: int, source_offset: int, out_offset: int) -> int:
    return os.copy_file_range(source, out, count, source_offset, out_offset)


def _sendfile(source: int, out: int, count: int, source_offset: int, out_offset: int) -> int:
    """Through the page cache without a copy in user space (copy_file_range refuses two file systems)."""
    os.lseek(out, out_offset, os.SEEK_SET)
    return os.sendfile(out, source, source_offset, count)


def kernel_copies() -> list[KernelCopy]:
    """The kernel's ways of copying between files, best first."""
    return [copy for name, copy in (("copy_file_range", _copy_file_range), ("sendfile", _sendfile))
            if hasattr(os, name)]


class Output:
    """A file written front to back through its descriptor, counting its position and the bytes moved.

    Use it as a context manager: the work behind the copies stops on leaving the block."""

    def __init__(self, stream: BinaryIO) -> None:
        self.fd = stream.fileno()
        self.position = os.lseek(self.fd, 0, os.SEEK_CUR)
        self.copies = kernel_copies()
        self.moved = 0
        """Data bytes written so far (what a progress line shows)."""
        self.crcs = Behind("crc")
        """CRC-32s of copied ranges, pending: ``crcs.wait()`` before reading a ``Crc`` given to ``copy``."""
        self.write_back = WriteBack(self.fd)

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self.crcs.close()
        self.write_back.close()

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        start = self.position
        while view:
            done = os.pwrite(self.fd, view, self.position)
            self.position += done
            view = view[done:]
        self.write_back.written(start, self.position - start)

    def reserve(self, count: int) -> int:
        """``count`` bytes skipped, to be written later with ``write_at``: where they start."""
        self.position += count
        return self.position - count

    def write_at(self, data: bytes, position: int) -> None:
        """``data`` at ``position``, already passed (a record's descriptor once its CRC is known)."""
        if os.pwrite(self.fd, data, position) != len(data):
            raise OutputError(f"file descriptor {self.fd}: short write of {len(data)} bytes")

    def copy(self, source: int, offset: int, count: int, crc: Crc) -> None:
        """``count`` bytes of file ``source`` from ``offset``, by the kernel where it can; ``crc`` carried on
        (behind the copy: read it after ``crcs.wait()``)."""
        end = offset + count
        while offset < end:
            step = min(CHUNK, end - offset)
            if self.copies:
                try:
                    done = self.copies[0](source, self.fd, step, offset, self.position)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EIO, errno.EDQUOT):
                        raise
                    self.copies.pop(0)  # a kernel or file system without it: the next way, at last through memory
                    continue
                if done == 0:
                    raise OutputError(f"file descriptor {source}: ended while being copied")
                self.crcs.submit(functools.partial(crc.carry, source, offset, done))
                self.write_back.written(self.position, done)
                self.position += done
            else:
                data = os.pread(source, step, offset)
                if not data:
                    raise OutputError(f"file descriptor {source}: ended while being copied")
                done = len(data)
                self.crcs.wait()  # the ranges copied before this one come first in the CRC
                crc.add(data)
                self.write(data)
            offset += done
            self.moved += done
