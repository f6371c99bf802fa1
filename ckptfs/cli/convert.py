"""``ckptfs convert SRC OUT``: a checkpoint as a torch.save archive, or its tensors as a safetensors file, an
``.npz`` or a directory of ``.npy``.

A ``.pt`` is written by ``ckptfs.saving.save_torch``: what torch cannot load
with ``weights_only=True`` is left out and listed on stderr. The other outputs
are the mount's own views, written from their pieces: ``model.safetensors``
(``fs.safetensors``: every tensor safetensors can hold, by dotted key), or each
tensor's ``NAME.npy`` (``fs.npy``), gathered in an uncompressed ``.npz`` under
its dotted key, or in a directory under its path in the mount. Bytes are copied
a bounded chunk at a time (stored ranges by the kernel: ``copy_file_range``,
or ``sendfile`` where the output is on another file system), so memory stays
flat whatever the checkpoint's size. A file is written beside its final name,
fsynced and renamed when complete; on any error or Ctrl-C nothing is left
behind (``saving.output``).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterator

from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.cli.interrupts import ignore_interrupts
from ckptfs.errors import OutputError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind, Node
from ckptfs.fs.pieces import Piece, SourceBytes, piece_bytes
from ckptfs.fs.safetensors import SAFETENSORS_NAME, key_name
from ckptfs.gc_pause import gc_paused
from ckptfs.output_files import partial_file, writing
from ckptfs.sources import is_url

if TYPE_CHECKING:
    from ckptfs.saving.torch_save import TorchArchive

FORMATS = ("pt", "safetensors", "npz", "dir")
SUFFIXES = {".pt": "pt", ".pth": "pt", ".safetensors": "safetensors", ".npz": "npz"}


class Copied:
    """Bytes written so far of a known total (what the progress line shows)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0


def output_format(args: argparse.Namespace) -> str:
    """``--to``, else what OUT's name says: a trailing ``/`` a directory, else its suffix."""
    as_directory = args.out.endswith(os.sep)
    if args.to:
        if as_directory and args.to != "dir":
            raise OutputError(f"{args.out}: ends in {os.sep}, a directory, but --to {args.to} writes a file")
        return str(args.to)
    if as_directory:
        return "dir"
    suffix = Path(args.out).suffix
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    said = f"the suffix {suffix}" if suffix else "a name without a suffix"
    raise OutputError(f"{args.out}: {said} does not say the format: name it .pt, .safetensors or .npz, end it in "
                      f"{os.sep} for a directory of .npy files, or give --to ({', '.join(FORMATS)})")


def cmd_convert(args: argparse.Namespace) -> int:
    kind = output_format(args)
    out = Path(args.out)
    if out.exists() or out.is_symlink():
        raise OutputError(f"{out}: already exists")
    # An absolute path, as a mount names it: model.safetensors' "source" says where the tensors came from.
    source = args.file if is_url(args.file) else os.path.abspath(args.file)
    # imported here, as in write_pieces and write_npz: the other commands (a mount's start) go without them
    from ckptfs.saving import save_torch

    with gc_paused(), open_checkpoint(source, args.limits) as ck:
        if kind == "pt":
            for name, reason in save_torch(ck, out, ignore_interrupts):
                print(f"ckptfs: {out}: left out {name or 'the whole object'}: {reason}", file=sys.stderr)
            return 0
        layout = Layout(ck)
        if kind == "safetensors":
            node = layout.lookup("/" + SAFETENSORS_NAME)
            if node is None:
                raise OutputError(f"{ck.path}: holds no tensor to convert")
            with partial_file(out, ignore_interrupts) as stream:
                pieces = layout.pieces(node)
                write_pieces(stream, pieces, ck, Copied(layout.size(node)))
        elif kind == "npz":
            with partial_file(out, ignore_interrupts) as stream:
                write_npz(stream, layout)
        else:
            write_directory(out, layout)
    return 0


def write_pieces(stream: BinaryIO, pieces: list[Piece], ck: Checkpoint, copied: Copied) -> None:
    """The pieces' bytes to ``stream``, a chunk at a time."""
    from ckptfs.saving.output import CHUNK, kernel_copies

    copies = kernel_copies()
    for piece in pieces:
        start = 0
        while start < piece.length:
            count = min(CHUNK, piece.length - start)
            fd = piece.extent.source.fileno() if isinstance(piece, SourceBytes) else None
            if fd is not None and copies:
                stream.flush()
                position = stream.tell()
                try:
                    count = copies[0](fd, stream.fileno(), count, piece.extent.offset + start, position)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise
                    copies.pop(0)  # a kernel or file system without it: the next way, at last through memory
                    stream.seek(position)
                    continue
                if count == 0:
                    raise OutputError(f"{ck.path}: ended while being copied")
                stream.seek(position + count)
            else:
                stream.write(piece_bytes(piece, ck.read, start, count))
            start += count
            copied.done += count


def npy_files(layout: Layout) -> Iterator[tuple[Node, Node]]:
    """Each tensor's node at its first place and its ``.npy`` node, for tensors that have one."""
    for tensor in layout.checkpoint.tensors:
        node = layout.node_of(tensor)
        assert node.parent is not None
        npy = layout.entry(node.parent, node.name + ".npy")
        if npy is not None and npy.kind is Kind.VIEW:
            yield node, npy


def write_npz(stream: BinaryIO, layout: Layout) -> None:
    """An uncompressed ``.npz``: each tensor's ``.npy`` under its dotted key (``np.load(out)[key]``)."""
    import zipfile

    from ckptfs.saving.output import CHUNK

    ck = layout.checkpoint
    found = list(npy_files(layout))
    copied = Copied(sum(layout.size(npy) for _, npy in found))
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for node, npy in found:
            name = ".".join(key_name(key) for key in node.value.path) or "arr_0"
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                for piece in layout.pieces(npy):
                    for start in range(0, piece.length, CHUNK):
                        member.write(piece_bytes(piece, ck.read, start, min(CHUNK, piece.length - start)))
                        copied.done += min(CHUNK, piece.length - start)


def write_directory(out: Path, layout: Layout) -> None:
    """Each tensor's ``.npy`` at its path in a mount, below a new directory ``out``."""
    ck = layout.checkpoint
    found = list(npy_files(layout))
    copied = Copied(sum(layout.size(npy) for _, npy in found))
    try:
        with writing(out):
            out.mkdir()
            for _, npy in found:
                target = out / layout.path_of(npy)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as stream:
                    write_pieces(stream, layout.pieces(npy), ck, copied)
            ignore_interrupts()
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def add_convert_command(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    convert = sub.add_parser(
        "convert", help="write a torch.save archive, or the tensors as a safetensors file, an .npz or .npy files",
        description="Write FILE to OUT, streaming (memory stays flat): as a torch.save archive (.pt: dicts, lists, "
                    "tuples, tensors and plain values; what torch.load(weights_only=True) cannot load is left out "
                    "and listed), as safetensors (the mount's "
                    "model.safetensors: what safetensors cannot hold is listed in its __metadata__), as an "
                    "uncompressed .npz of each tensor's .npy under its dotted key, or as a new directory of .npy "
                    "files at the tensors' paths in a mount. The format follows OUT's name unless --to says: "
                    ".pt/.pth, .safetensors, .npz, or a trailing / for a directory.")
    convert.add_argument("file", metavar="FILE", help="a PyTorch checkpoint (recognised by its content, not its name)")
    convert.add_argument("out", metavar="OUT", help="the file or directory to write (must not exist)")
    convert.add_argument("--to", choices=FORMATS,
                         help="the output format (default: from OUT's name: its suffix, or a trailing / for dir)")
    convert.set_defaults(run=cmd_convert)
    return convert


def archive_status(archive: TorchArchive) -> str:
    """The progress line's text while a torch.save archive is written."""
    copied = Copied(archive.total)
    copied.done = archive.output.moved
    return copy_status(copied)


def copy_status(copied: Copied) -> str:
    """The progress line's text while a conversion writes."""
    share = 100 * copied.done // max(copied.total, 1)
    return f"writing: {share}% ({copied.done / (1 << 20):.1f} MiB of {copied.total / (1 << 20):.1f} MiB)"
