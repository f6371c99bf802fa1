"""The listing loop (``fuse.dirents``): the compiled loop against the Python one, entry for entry, with libfuse's
own formatting functions; then the compiled loop alone under AddressSanitizer and UBSan."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.fuse import dirents
from ckptfs.fuse import lowlevel as ll

ENTRY_SIZE = ctypes.sizeof(ll.FuseEntryParam)
ATTR = ll.FuseEntryParam.attr.offset
HERE = Path(__file__).parent

pytestmark = pytest.mark.skipif(dirents.COMPILED is None, reason=f"the listing loop is {dirents.PATH_NAME}")

_NAMES = st.lists(st.text(st.characters(blacklist_characters="\0/", blacklist_categories=("Cs",)), min_size=1,
                          max_size=90), min_size=0, max_size=40)


def _entries(count: int, seed: int) -> bytearray:
    """``count`` ``fuse_entry_param``s one after another: inodes, sizes and modes of every kind of entry."""
    memory = bytearray(ENTRY_SIZE * (count + 1))  # one more: an empty window still has an address
    for i in range(count):
        entry = ll.FuseEntryParam.from_buffer(memory, i * ENTRY_SIZE)
        entry.ino = entry.attr.st_ino = (seed * 7919 + i) % (1 << 64) or 1
        entry.attr.st_size = (seed * i) % (1 << 40)
        entry.attr.st_mode = (0o040555, 0o100444, 0o120777)[i % 3]
        entry.attr_timeout = entry.entry_timeout = 86400.0
    return memory


def _run(loop: object, plus: bool, names: dirents.Names, memory: bytearray, size: int, used: int, start: int,
         first: int) -> tuple[bytes, int, int]:
    buffer = ctypes.create_string_buffer(b"\xa5" * size, size)  # what the loop does not write stays as it was
    entries = ctypes.addressof(ctypes.c_char.from_buffer(memory)) + (0 if plus else ATTR)
    add = ll.add_direntry_plus if plus else ll.add_direntry
    taken, added = loop(add, 0, ctypes.addressof(buffer), size, used, names, entries, ENTRY_SIZE, start, first)
    return buffer.raw, taken, added


@settings(max_examples=300, deadline=None)
@given(names=_NAMES, plus=st.booleans(), size=st.integers(0, 6000), used=st.integers(0, 6000),
       start=st.integers(0, 1 << 40), first=st.integers(0, 40), seed=st.integers(0, 1 << 32))
def test_the_compiled_loop_adds_what_the_python_loop_adds(names: list[str], plus: bool, size: int, used: int,
                                                          start: int, first: int, seed: int) -> None:
    """The same bytes in the same places, the same bytes taken and the same first entry left out, for any names,
    buffer sizes (too small for one entry too), part of the buffer taken before and first entry."""
    listed = dirents.Names(names)
    memory = _entries(len(names), seed)
    used, first = min(used, size), min(first, len(names))
    compiled = _run(dirents.add_entries, plus, listed, memory, size, used, start, first)
    python = _run(dirents._add_entries, plus, listed, memory, size, used, start, first)
    assert compiled == python
    buffer, taken, added = compiled
    assert used <= taken <= size and first <= added <= len(names)
    assert listed.names == [name.encode("utf-8") for name in names]
    assert (added == len(names)) == (taken - used == sum(_length(name.encode(), plus) for name in names[first:]))


def _length(name: bytes, plus: bool) -> int:
    """An entry's bytes in a reply: fuse_kernel.h's ``fuse_direntplus`` (or ``fuse_dirent``) padded to 8."""
    return (len(name) + (24 + 128 if plus else 24) + 7) & ~7


def test_a_whole_window_is_added_in_one_call_and_names_are_in_place() -> None:
    texts = [".", "..", "é" * 3, "w.json", "x" * 255]
    names = [text.encode("utf-8") for text in texts]
    listed = dirents.Names(texts)
    assert listed._text == b"" and listed._names is None  # each made where a loop takes it
    buffer, taken, added = _run(dirents.add_entries, True, listed, _entries(5, 3), 4096, 0, 10, 0)
    assert listed._text == b"\0".join(names) + b"\0" and listed._names is None
    assert (taken, added) == (sum(_length(name, True) for name in names), 5)
    position = 0
    for index, name in enumerate(names):
        dirent = position + 128
        assert int.from_bytes(buffer[dirent + 8 : dirent + 16], "little") == 10 + index + 1  # the next offset
        assert buffer[dirent + 24 : dirent + 24 + len(name)] == name
        position += _length(name, True)


def test_a_window_with_a_nul_in_a_name_is_added_by_the_python_loop() -> None:
    """C would read such a name cut short and every name after it misplaced; no layout makes one (names escape
    control characters), but the loop must not depend on that."""
    listed = dirents.Names(["a", "b\0c", "d"])
    assert listed.text is None
    made = _run(dirents.add_entries, True, listed, _entries(3, 1), 4096, 0, 0, 0)
    assert made == _run(dirents._add_entries, True, listed, _entries(3, 1), 4096, 0, 0, 0)
    assert made[2] == 3 and made[1] == _length(b"a", True) + _length(b"b", True) + _length(b"d", True)


def test_the_compiled_loop_under_sanitizers(tmp_path: Path) -> None:
    """Random windows (names up to 300 bytes, buffers from empty to several entries, allocated to their exact size)
    through libfuse's functions: no read or write out of bounds, no undefined behaviour."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (scripts/setup --test installs it)"
    driver = tmp_path / "dirents_fuzz"
    built = subprocess.run([gcc, "-std=c11", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                            "-fno-omit-frame-pointer", "-o", str(driver), str(HERE / "dirents_fuzz.c"),
                            str(HERE.parents[1] / "ckptfs" / "fuse" / "_cdirents.c"), "-l:libfuse3.so.3"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(driver), "20000"], capture_output=True, text=True, timeout=600)
    assert (run.returncode, run.stderr) == (0, "")
    windows, added = re.fullmatch(r"windows (\d+) entries added (\d+)\n", run.stdout).groups()  # type: ignore[union-attr]
    assert int(windows) == 20000 and int(added) > 20000  # full windows and partly filled ones
