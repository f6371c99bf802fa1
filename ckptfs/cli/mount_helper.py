"""``mount.ckptfs``: the helper mount(8) runs for file system type ``ckptfs`` (and ``fuse.ckptfs``).

mount(8), and through it /etc/fstab and systemd mount units, calls
``/sbin/mount.TYPE SPEC DIR [-sfnvrw] [-N NAMESPACE] [-o OPTIONS] [-t TYPE]``
(util-linux's "external helpers"; ``-t`` only for a ``fuse.*`` type). For
``fuse.ckptfs`` it looks for ``/sbin/mount.fuse.ckptfs`` before
``mount.fuse3``, so installing this helper under both names serves both types.
It passes ``rw`` unless told ``ro``: a ckptfs mount is read-only either way.
The parse is cached as ``ckptfs mount`` caches it: ``-o cache_dir=DIR``, ``-o nocache``, else the user's cache
folder (root's, for an fstab line mounted at boot).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from ckptfs.cli.cache_options import chosen_cache_dir
from ckptfs.errors import CkptfsError
from ckptfs.fuse.mount import mount
from ckptfs.fuse.mount_options import MountOptions, with_options

FAILED = 32
"""mount(8)'s status for a mount failure (1: bad usage)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"mount.ckptfs: {message} (usage: mount.ckptfs SOURCE MOUNTPOINT [-sfnvrw] [-o OPTIONS])",
              file=sys.stderr)
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mount.ckptfs", description="mount(8)'s helper for ckptfs: mount -t ckptfs SOURCE DIR")
    parser.add_argument("source", metavar="SOURCE", help="the checkpoint file")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    parser.add_argument("-o", dest="options", action="append", default=[], metavar="OPTIONS",
                        help="ckptfs mount's -o options (see ckptfs mount --help)")
    parser.add_argument("-s", dest="sloppy", action="store_true", help="ignore unknown options")
    parser.add_argument("-f", dest="fake", action="store_true", help="check the options, mount nothing")
    parser.add_argument("-n", action="store_true", help="no /etc/mtab to write (there is none): accepted")
    parser.add_argument("-v", action="store_true", help="verbose: accepted")
    parser.add_argument("-r", dest="ro", action="store_true", help="read-only (always so)")
    parser.add_argument("-w", dest="rw", action="store_true", help="taken as -r: a ckptfs mount is read-only")
    parser.add_argument("-N", dest="namespace", metavar="NAMESPACE", help="refused: not supported")
    parser.add_argument("-t", dest="type", metavar="TYPE", help="ckptfs or fuse.ckptfs: accepted")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.namespace is not None:
            raise CkptfsError("mounting in another mount namespace is not supported", f"-N {args.namespace}")
        options = with_options(MountOptions(), args.options, rw_as_ro=True, sloppy=args.sloppy)
        if not args.fake:
            chosen = None if options.cache_dir is None else Path(options.cache_dir)
            mount(args.source, args.mountpoint, options,
                  cache_dir=chosen_cache_dir(options.no_cache, chosen, f"-o cache_dir={options.cache_dir}"),
                  leave_to_exit=True)
    except CkptfsError as exc:
        print(f"ckptfs: {exc}", file=sys.stderr)
        return FAILED
    return 0


def run() -> NoReturn:
    """The ``mount.ckptfs`` command (see ``ckptfs.cli.run`` for the quick exit)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
