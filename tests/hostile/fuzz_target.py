"""The fuzz target and mutator: what one input goes through, and how inputs are made.

``exercise`` does what ``ckptfs ls`` (also ``--state-dict``), ``info --json``, ``diff``'s listing of places,
a mount (its layout, ``find -ls``, reads) and ``convert`` to ``.pt`` (its pickle, checked well formed) do with
a file (and for a tenth of the files, what ``mode="r+"`` writes: ``fuzz_write``), or with a directory (a
torch.distributed.checkpoint
directory, given as file name → bytes and read from memory). ckptfs may raise only
``CkptfsError``; anything else escaping ``exercise`` is a crash.
"""

from __future__ import annotations

import io
import pickletools
import random
import struct
import zipfile
import zlib

import ckptfs
from ckptfs.cli.diff_match import entries
from ckptfs.cli.info import description_text
from ckptfs.cli.listing import json_lines, listed, text_lines
from ckptfs.errors import CkptfsError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.fs.pieces import Content, piece_bytes
from ckptfs.sources import BytesSource
from ckptfs.saving.torch_pickle import TorchPickler
from hostile.fuzz_cache import ENTRY_INPUT, ENTRY_MEMBER, entry_sections, mutated_input, open_entry_input
from hostile.fuzz_write import write_in_place
from hostile.memory_directory import BytesDirectory

MAX_NODES = 2000
"""Layout entries visited per input (a mutated file can be large; the budget keeps the rate up)."""
MAX_TENSORS = 32
READ = 256
INTERESTING = (0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
               0xFFFFFFFF, 1 << 32, (1 << 62) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)
OPCODES = bytes(op.code.encode("latin-1")[0] for op in pickletools.opcodes)
DIRECTORY_SHARE = 0.15
"""Of the inputs, the share made from directory seeds (when there are any): they are few among the seeds."""
METADATA_SHARE = 0.6
"""Of a directory's mutations, the share aimed at its ``.metadata`` pickle (the rest at its other files)."""

Input = bytes | dict[str, bytes]
"""A file's bytes, or a directory's files."""


def exercise(data: Input, rng: random.Random) -> None:
    try:
        if isinstance(data, dict):
            opened = open_entry_input(data) if ENTRY_MEMBER in data else ckptfs.open(BytesDirectory(data))
        elif data.startswith(ENTRY_INPUT):
            opened = open_entry_input(data)
        else:
            opened = ckptfs.open(BytesSource(data, "fuzz.pt"))
        with opened as ck:
            _describe(ck)
            _read(ck, rng)
            _mount_walk(ck)
            _torch_pickle(ck)
    except CkptfsError:
        pass
    if isinstance(data, bytes) and not data.startswith(ENTRY_INPUT):
        write_in_place(data, rng)


def _describe(ck: ckptfs.Checkpoint) -> None:
    description_text(ck)
    for view in {id(ck): ck, id(viewed := ck.as_state_dict()): viewed}.values():
        rows = listed(view)
        for _ in text_lines(rows):
            pass
        for _ in json_lines(rows, view.limits.max_generated_bytes):
            pass
    entries(ck)


def _read(ck: ckptfs.Checkpoint, rng: random.Random) -> None:
    for tensor in ck.tensors[:MAX_TENSORS]:
        size = tensor.nbytes
        for offset in (0, max(0, size - READ), rng.randrange(size + 1)):
            try:
                ck.read(tensor, offset, READ)
            except CkptfsError:
                pass


def _torch_pickle(ck: ckptfs.Checkpoint) -> None:
    """The pickle ``convert`` to ``.pt`` writes for the tree: a well-formed stream (pickletools reads it without
    running anything) whose persistent ids name the records made for it, once each."""
    pickler = TorchPickler(ck.root, ck.limits)
    ops = list(pickletools.genops(pickler.dump()))
    assert ops[-1][0].name == "STOP"
    keys = [record.key for record in pickler.records]
    assert keys == [str(i) for i in range(len(keys))]


def _mount_walk(ck: ckptfs.Checkpoint) -> None:
    """What ``find -ls``, ``cat`` of every small file and the first reads of the views do on a mount, up to
    MAX_NODES entries."""
    layout = Layout(ck)
    zarr = layout.lookup("/.zarr")  # not in the root's listing: opened by its path
    pending = [layout.root] if zarr is None else [zarr, layout.root]
    visited = 0
    while pending and visited < MAX_NODES:
        for node in layout.listing(pending.pop()):
            visited += 1
            layout.size(node)
            if isinstance(node, Dir):
                pending.append(node)
            elif node.kind in (Kind.VALUE, Kind.ZARR):
                layout.content(node)
            elif node.kind in (Kind.VIEW, Kind.BUNDLE, Kind.ZARR_CHUNK):
                _read_ends(ck, Content(layout.pieces(node), layout.size(node)))
    layout.index_bytes()


def _read_ends(ck: ckptfs.Checkpoint, content: Content) -> None:
    """The first and last bytes of a file made of pieces (a header, tensors' bytes), as a reader's first reads."""
    for offset in (0, max(0, content.size - READ)):
        for part in content.cover(offset, READ):
            piece_bytes(part.piece, ck.read, part.start, part.length)


class Mutator:
    """Mutations of seed files, aimed at their pickles half of the time, and of seed directories, aimed at their
    ``.metadata`` pickle more than half of the time."""

    def __init__(self, seeds: list[Input], rng: random.Random) -> None:
        self.seeds = [s for s in seeds if isinstance(s, bytes)]
        self.directories = [s for s in seeds if isinstance(s, dict)]
        self.rng = rng
        self.regions = [_pickle_region(s) for s in self.seeds]
        """Where each seed's pickle is: a zip's stored data.pkl, or the head of a legacy file."""
        self.entries = [(sections, seed) for seed in [*self.seeds, *self.directories]
                        if (sections := entry_sections(seed)) is not None]
        """Metadata cache entries of the seeds (files and directories) ckptfs caches, mutated for a tenth of the
        inputs."""

    def __call__(self) -> Input:
        rng = self.rng
        if self.entries and rng.random() < 0.1:
            return mutated_input(*rng.choice(self.entries), rng)
        if self.directories and (not self.seeds or rng.random() < DIRECTORY_SHARE):
            return self._mutate_directory(rng.choice(self.directories))
        index = rng.randrange(len(self.seeds))
        data = bytearray(self.seeds[index])
        start, end, is_zip = self.regions[index]
        if is_zip and start < end and rng.random() < 0.4:
            pickle = bytearray(data[start:end])
            for _ in range(rng.choice((1, 1, 2, 3, 4))):
                self._mutate(pickle, 0, len(pickle), shifting=rng.random() < 0.5)
            try:
                return _replace_record(bytes(data), bytes(pickle))
            except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, zlib.error):
                pass  # a hand-made seed Python's zipfile cannot rewrite: mutate its bytes instead
        # Moving bytes breaks the zip directory or the legacy storage layout at once; mostly overwrite.
        shifting = rng.random() < 0.2
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
            focused = start < end and rng.random() < 0.7
            lo, hi = (start, end) if focused else (0, len(data))
            self._mutate(data, lo, hi, shifting)
        return bytes(data)

    def _mutate_directory(self, files: dict[str, bytes]) -> dict[str, bytes]:
        """One file of the directory mutated (its ``.metadata`` mostly), or one file dropped or emptied."""
        rng = self.rng
        out = dict(files)
        names = sorted(out)
        roll = rng.random()
        if roll < 0.04 and len(names) > 1:
            del out[rng.choice(names)]
            return out
        if roll < 0.08:
            out[rng.choice(names)] = b""
            return out
        name = ".metadata" if ".metadata" in out and rng.random() < METADATA_SHARE else rng.choice(names)
        data = bytearray(out[name])
        shifting = rng.random() < 0.3
        for _ in range(rng.choice((1, 1, 2, 3, 4))):
            self._mutate(data, 0, len(data), shifting)
        out[name] = bytes(data)
        return out

    def _mutate(self, data: bytearray, lo: int, hi: int, shifting: bool) -> None:
        rng = self.rng
        hi = min(hi, len(data))
        if hi <= lo:
            data.extend(rng.randbytes(rng.randrange(1, 16)))
            return
        at = rng.randrange(lo, hi)
        if not shifting:
            choice = rng.randrange(4)
            if choice == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif choice == 1:
                data[at] = rng.randrange(256)
            elif choice == 2:
                width = min(rng.choice((1, 2, 4, 8)), len(data) - at)
                value = rng.choice(INTERESTING) & ((1 << (8 * width)) - 1)
                data[at : at + width] = value.to_bytes(width, "little")
            else:
                data[at] = rng.choice(OPCODES)
            return
        choice = rng.randrange(6)
        if choice == 0:
            data[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif choice == 1:
            del data[at : at + rng.randrange(1, 33)]
        elif choice == 2:
            data[at:at] = data[rng.randrange(lo, hi) :][: rng.randrange(1, 65)]
        elif choice == 3:
            del data[rng.randrange(at, len(data) + 1) :]
        elif choice == 4 and self.seeds:
            donor = rng.choice(self.seeds)
            cut = rng.randrange(len(donor) + 1)
            data[at:] = donor[cut : cut + rng.randrange(1, 4096)]
        else:
            argument = rng.choice((b"", bytes([rng.randrange(256)]), b"os\nsystem\n", b"torch\nFloatStorage\n",
                                   struct.pack("<I", rng.choice(INTERESTING) & 0xFFFFFFFF), b"0\n"))
            data[at:at] = bytes([rng.choice(OPCODES)]) + argument


def _pickle_region(data: bytes) -> tuple[int, int, bool]:
    """(start, end, is_zip) of the seed's pickle bytes; a legacy file's pickles are at its head."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/data.pkl"))
    except (zipfile.BadZipFile, StopIteration):
        return 0, min(len(data), 65536), False
    if info.compress_type != zipfile.ZIP_STORED:
        return 0, 0, True
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    return start, start + info.compress_size, True


def _replace_record(data: bytes, pickle: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    buffer = io.BytesIO()
    with source, zipfile.ZipFile(buffer, "w") as out:
        for info in source.infolist():
            content = pickle if info.filename.endswith("/data.pkl") else source.read(info)
            out.writestr(info.filename, content, compress_type=info.compress_type)
    return buffer.getvalue()
