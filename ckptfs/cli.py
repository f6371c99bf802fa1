"""The ``ckptfs`` command line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Callable, NoReturn

from ckptfs.checkpoint import open_checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.info import description_text, summary
from ckptfs.limits import Limits
from ckptfs.mount import MountOptions, mount, unmount
from ckptfs.model.trails import key_lists


def human_size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def cmd_ls(args: argparse.Namespace) -> int:
    with open_checkpoint(args.file, args.limits) as ck:
        names = key_lists(str)
        rows = [("/".join(names.leaf(t.trail)) or ".", t.dtype.name, "x".join(map(str, t.shape)) or "scalar",
                 human_size(t.nbytes)) for t in ck]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    out = sys.stdout
    for row in rows:
        out.write(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}\n")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with open_checkpoint(args.file, args.limits) as ck:
        if args.json:
            sys.stdout.write(description_text(ck) + "\n")
        else:
            for key, value in summary(ck).items():
                print(f"{key}: {value}")
    return 0


def cmd_mount(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(name)s: %(message)s")
    options = MountOptions(foreground=args.foreground, debug=args.debug, allow_other=args.allow_other,
                           multithreaded=args.multithreaded)
    mount(args.source, args.mountpoint, options, args.limits)
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    unmount(args.mountpoint, lazy=args.lazy)
    return 0


def _parse_limit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or name not in Limits.names() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=INTEGER with NAME one of {', '.join(Limits.names())}")
    return name, int(value)


def _add_limit_option(parser: argparse.ArgumentParser, dest: str) -> None:
    """``--limit`` before or after the command (two destinations: a command's namespace replaces the top one's)."""
    parser.add_argument("--limit", action="append", type=_parse_limit, default=[], dest=dest, metavar="NAME=VALUE",
                        help="raise a safety limit, e.g. --limit max_pickle_bytes=4294967296")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckptfs", description="Read PyTorch checkpoints without torch.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks (and, when mounting, log requests)")
    _add_limit_option(parser, "limit")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="one line per tensor: path, dtype, shape, size")
    ls.add_argument("file")
    _add_limit_option(ls, "command_limit")
    ls.set_defaults(run=cmd_ls)
    info = sub.add_parser("info", help="checkpoint summary; --json for every tensor and the whole tree")
    info.add_argument("file")
    info.add_argument("--json", action="store_true")
    _add_limit_option(info, "command_limit")
    info.set_defaults(run=cmd_info)
    mnt = sub.add_parser("mount", help="mount a checkpoint read-only: a file per tensor, JSON metadata",
                         description="Mount SOURCE read-only at MOUNTPOINT (an empty directory) and return once "
                                     "the mount answers; the daemon runs in the background. "
                                     "Unmount with: ckptfs umount MOUNTPOINT")
    mnt.add_argument("source", metavar="SOURCE")
    mnt.add_argument("mountpoint", metavar="MOUNTPOINT")
    mnt.add_argument("-f", "--foreground", action="store_true", help="serve in the foreground until unmounted")
    mnt.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="log every request on stderr (best with -f)")
    mnt.add_argument("--allow-other", action="store_true", help="let other users see the mount (FUSE allow_other)")
    mnt.add_argument("--multithreaded", action="store_true",
                     help="answer requests on several threads (default: one, which streams fastest)")
    _add_limit_option(mnt, "command_limit")
    mnt.set_defaults(run=cmd_mount)
    umount = sub.add_parser("umount", help="unmount a ckptfs mount (also a dead one whose daemon was killed)")
    umount.add_argument("mountpoint", metavar="MOUNTPOINT")
    umount.add_argument("-l", "--lazy", action="store_true",
                        help="detach now even if files in it are open; the daemon exits once the last is closed")
    umount.set_defaults(run=cmd_umount)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.limits = Limits(**dict(args.limit + getattr(args, "command_limit", [])))
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except CkptfsError as exc:
        if args.debug:
            raise
        print(f"ckptfs: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def run() -> NoReturn:
    """The ``ckptfs`` command: ``main``, then an exit that leaves the parsed checkpoint to the kernel.

    Freeing a large checkpoint's records one by one at interpreter exit takes
    tens of milliseconds, and ``ckptfs mount`` would spend them after the
    mount is already up and its daemon holds its own copy.
    """
    code = main()
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
