"""``ckptfs cat``: one tensor's bytes, or its ``.npy`` view, without mounting."""

from __future__ import annotations

import argparse
from typing import Any, Iterator

from ckptfs.cli.cache_options import add_cache_options
from ckptfs.cli.output import write_binary
from ckptfs.cli.remote_options import add_remote_options
from ckptfs.cli.state_dict_option import add_state_dict_option, opened
from ckptfs.cli.tensor_keys import find_tensor
from ckptfs.errors import CkptfsError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Node
from ckptfs.fs.pieces import Content, read_content
from ckptfs.gc_pause import gc_paused

CHUNK = 8 << 20
"""Bytes read and written at a time: memory stays bounded whatever the tensor's size."""
NPY_SUFFIX = ".npy"


def add_cat_parser(sub: Any) -> argparse.ArgumentParser:
    cat = sub.add_parser(
        "cat", help="write one tensor's bytes (or an .npy) to stdout or a file, without mounting",
        description="Write the logical bytes of the tensor KEY names (C order, little-endian: the bytes of its file "
                    "in a mount) to stdout, or to OUT. KEY is any path `ckptfs ls` or `ckptfs ls --nest` prints "
                    "(an alias's too), or the tensor's dotted state-dict key (model.embed.weight).")
    cat.add_argument("source", metavar="SRC", help="a checkpoint")
    cat.add_argument("key", metavar="KEY", help="a tensor's file (as ckptfs ls or ls --nest prints it) or dotted key")
    cat.add_argument("-o", "--output", metavar="OUT", help="write to this file instead of stdout")
    cat.add_argument("--npy", action="store_true", help="write the tensor's .npy file (as a mount shows beside it)")
    add_state_dict_option(cat)
    add_remote_options(cat)
    add_cache_options(cat)
    cat.set_defaults(run=cmd_cat)
    return cat


def cmd_cat(args: argparse.Namespace) -> int:
    with gc_paused(), opened(args, args.source) as ck:
        layout, node = find_tensor(ck, args.key)
        if args.npy:
            node = _npy_view(layout, node)
        write_binary(_chunks(layout, node), args.output)
    return 0


def _npy_view(layout: Layout, node: Node) -> Node:
    assert node.parent is not None
    view = layout.entry(node.parent, node.name + NPY_SUFFIX)
    if view is None:
        raise CkptfsError(f"{layout.path_of(node)} ({node.value.dtype.name}) has no {NPY_SUFFIX} view",
                          layout.checkpoint.path)
    return view


def _chunks(layout: Layout, node: Node) -> Iterator[bytes]:
    """The file's bytes a chunk at a time; a failed read names the checkpoint (a failed write names the output)."""
    try:
        content = Content(layout.pieces(node), layout.size(node))
        for offset in range(0, content.size, CHUNK):
            yield read_content(layout.checkpoint, content, offset, CHUNK)
    except CkptfsError as exc:
        raise exc.with_path(layout.checkpoint.path) from None
