"""``ckptfs mount``, ``umount`` and ``mounts``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ckptfs.cli.cache_options import add_cache_options, cache_dir, chosen_cache_dir
from ckptfs.cli.global_options import add_global_options, add_limit_option
from ckptfs.cli.output import write_text
from ckptfs.cli.remote_options import add_remote_options, remote_options
from ckptfs.errors import CkptfsError
from ckptfs.fuse.mount import MountOptions, mount
from ckptfs.fuse.mount_options import check_options, group_id, user_id, with_options


def mount_options(args: argparse.Namespace) -> None:
    """``args.mount_options`` from the flags and ``-o`` lists: a mistake in them is a one-line error before
    anything is opened (with ``--debug`` too, which asks for a log of requests here)."""
    options = MountOptions(
        foreground=args.foreground, debug=args.debug, allow_other=args.allow_other, multithreaded=args.multithreaded,
        nest=args.nest,
        uid=None if args.uid is None else user_id(args.uid, f"--uid {args.uid}"),
        gid=None if args.gid is None else group_id(args.gid, f"--gid {args.gid}"), log_file=args.log_file)
    options = with_options(options, args.options)
    check_options(options)
    if options.no_cache:
        args.no_cache = True
    elif args.cache_dir is None and options.cache_dir is not None:
        args.cache_dir = chosen_cache_dir(False, Path(options.cache_dir), f"-o cache_dir={options.cache_dir}")
        args.no_cache = args.cache_dir is None
    args.mount_options = options


def cmd_mount(args: argparse.Namespace) -> int:
    mount(args.source, args.mountpoint, args.mount_options, args.limits, remote_options(args), cache_dir(args),
          leave_to_exit=True)
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    """Unmounts every mount point given; each failure is its own line, and the others are still unmounted."""
    from ckptfs.fuse.unmount import unmount  # here: it imports subprocess, which a mount does without

    failed = 0
    for mountpoint in args.mountpoints:
        try:
            unmount(mountpoint, lazy=args.lazy)
        except CkptfsError as exc:
            print(f"ckptfs: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def cmd_mounts(args: argparse.Namespace) -> int:
    """One line a mount; a mount whose daemon is gone or does not answer says so (``dead`` or ``unresponsive``
    after its source), and what to do."""
    from ckptfs.fuse.mount_table import ANSWER_TIMEOUT, answering, ckptfs_mounts

    entries = ckptfs_mounts()
    answers = answering([entry.point for entry in entries])
    lines, notes = [], []
    for entry in entries:
        answer = answers[entry.point]
        if args.json:
            lines.append(json.dumps({"mountpoint": entry.point, "source": entry.source, "uid": entry.owner,
                                     "alive": answer is not False, "answering": answer is True},
                                    ensure_ascii=False) + "\n")
        else:
            mark = {True: "", False: " dead", None: " unresponsive"}[answer]
            lines.append(f"{_escaped(entry.point)} {_escaped(entry.source)}{mark}\n")
        point = _escaped(entry.point)
        if answer is False:
            notes.append(f"ckptfs: {point}: dead (its daemon is gone); unmount it with: ckptfs umount {point}")
        elif answer is None:
            notes.append(f"ckptfs: {point}: unresponsive (its daemon did not answer within {ANSWER_TIMEOUT:g} s: "
                         f"stopped or stuck); unmount it with: ckptfs umount {point}")
    write_text(lines)
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def _escaped(path: str) -> str:
    """As /proc/mounts writes it: space, tab, newline and backslash as octal escapes, so one mount is one line."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def add_mount_commands(sub: Any) -> None:
    """``mount``, ``umount`` and ``mounts``."""
    mnt = sub.add_parser(
        "mount", usage="%(prog)s [options] SOURCE MOUNTPOINT", help="mount a checkpoint read-only: a file per tensor, JSON metadata",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount SOURCE read-only (-o rw: a torch.save zip's tensors' files take writes, in place) at\n"
                    "MOUNTPOINT (an empty directory) and return once the mount answers; the daemon runs in the\n"
                    "background. Unmount with: ckptfs umount MOUNTPOINT")
    mnt.add_argument("source", metavar="SOURCE", help="the checkpoint file or DCP directory, or its URL (s3://, "
                                                      "http(s)://, gs://, ...; a DCP directory's ends in /)")
    mnt.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    mnt.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                     help="mount options: allow_other, allow_root, auto_unmount, uid=N, gid=N, umask=NNN (modes "
                          "0555/0444 less NNN), fsname=NAME, log_file=PATH, debug, ro, default_permissions; "
                          "views=LIST (the files shown beside the tensors': json, npy, q_scales, q_zero_points, "
                          "safetensors, zarr; default all), noviews (tensor files and the index only), nest (--nest), "
                          "state_dict (a pickled nn.Module as its state_dict(), as ls --state-dict), "
                          "zarr_chunk=SIZE (/.zarr's chunks: whole rows of at most SIZE bytes, default 4MiB; 0: one "
                          "chunk an array), "
                          "cache_dir=DIR (--cache-dir), nocache (--no-cache), max_connections=N (--max-connections); "
                          "mount flags (noexec, noatime ...) pass on; mount(8)'s own (defaults, noauto, nofail, "
                          "_netdev, x-* ...) are ignored; rw: a torch.save zip's tensors' files take writes into "
                          "it, in place (ro, the default, undoes it)")
    mnt.add_argument("-f", "--foreground", action="store_true", help="serve in the foreground until unmounted")
    mnt.add_argument("--nest", action="store_true",
                     help="show a dict's dotted keys as directories: model.layers.0.mlp.w1.weight as "
                          "model/layers/0/mlp/w1.weight (every dot but the last; exact keys stay in the sidecars and "
                          ".ckptfs/index.json; -o nest)")
    mnt.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="log every request: on stderr with -f, else in --log-file (which it then needs)")
    mnt.add_argument("--log-file", metavar="PATH",
                     help="append the daemon's warnings and errors here, timestamped "
                          "(default: syslog when /dev/log exists, else nowhere; stderr with -f)")
    mnt.add_argument("--allow-other", action="store_true", help="let other users see the mount (-o allow_other)")
    mnt.add_argument("--uid", metavar="USER", help="owner of every file, a name or a number (default: the source's)")
    mnt.add_argument("--gid", metavar="GROUP", help="group of every file, a name or a number (default: the source's)")
    mnt.add_argument("--multithreaded", action="store_true",
                     help="answer requests on several threads (default: one, which streams fastest)")
    add_limit_option(mnt, "command_limit")
    add_remote_options(mnt)
    add_cache_options(mnt)
    mnt.set_defaults(run=cmd_mount, prepare=mount_options)
    umount = sub.add_parser("umount", help="unmount ckptfs mounts (also dead ones whose daemon was killed)",
                            description="Unmount each MOUNTPOINT; a failure is one line and does not stop the "
                                        "others; the exit status is 1 if any failed.")
    umount.add_argument("mountpoints", metavar="MOUNTPOINT", nargs="+", help="a ckptfs mount point (or a symlink "
                                                                             "to one)")
    umount.add_argument("-l", "--lazy", action="store_true",
                        help="detach now even if files in it are open; the daemon exits once the last is closed")
    add_global_options(umount)
    umount.set_defaults(run=cmd_umount)
    mounts = sub.add_parser("mounts", help="list the ckptfs mounts: mount point and source, one per line",
                            description="List the ckptfs mounts this process can see (as findmnt -t fuse.ckptfs "
                                        "does): MOUNTPOINT SOURCE, one mount per line, with space, tab, newline and "
                                        "backslash written as octal escapes (\\040 ...) as in /proc/mounts; a mount "
                                        "whose daemon is gone ends with ' dead' (unmount it with ckptfs umount).")
    mounts.add_argument("--json", action="store_true",
                        help="one JSON object per line: mountpoint, source, uid (the user who mounted it), "
                             "alive (false: its daemon is gone)")
    add_global_options(mounts)
    mounts.set_defaults(run=cmd_mounts)
