"""The ``ckptfs`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from ckptfs.checkpoint import open_checkpoint
from ckptfs.cli.cat import add_cat_parser
from ckptfs.cli.convert import add_convert_command
from ckptfs.cli.diff import add_diff_parser
from ckptfs.cli.info import description_text, indented, overview
from ckptfs.cli.listing import json_lines, listed, text_lines
from ckptfs.cli.output import discard_output, write_text
from ckptfs.cli.printable import printable
from ckptfs.cli.progress import ProgressLine
from ckptfs.cli.cache_options import add_cache_options, cache_dir, chosen_cache_dir
from ckptfs.cli.remote_options import add_remote_options, remote_options
from ckptfs.errors import CkptfsError
from ckptfs.fuse.mount import MountOptions, mount, unmount
from ckptfs.gc_pause import gc_paused
from ckptfs.limits import SUMMARIES, UNITS_HELP, Limits, format_quantity, parse_quantity

INTERRUPTED = 130
"""Exit status after Ctrl-C, as shells report a command killed by SIGINT."""
PARSING_COMMANDS = ("ls", "info", "cat", "diff", "mount", "convert")
"""Commands that parse a checkpoint: a progress line on a terminal, ``--limit`` and ``--debug`` after them too."""
_LIMIT_NAMED = re.compile(r"\(limit (max_\w+)(?:=\d+)?\)")

EXAMPLES = {
    "ckptfs": """\
examples:
  ckptfs ls model.pt                          every tensor: its file in a mount, dtype, shape, size
  ckptfs ls --json model.pt | head            the same, one JSON object a line
  ckptfs info model.pt                        sizes, parameter count, dtypes, format
  ckptfs info --json --indent 2 model.pt      every tensor's metadata and the whole object tree
  ckptfs cat model.pt model.embed.weight | sha256sum      one tensor's bytes
  ckptfs diff before.pt after.pt              which tensors differ, and by how much
  ckptfs mount model.pt /mnt/m                a directory of per-tensor files
  ckptfs umount /mnt/m
  ckptfs convert model.pt model.safetensors   the tensors as one safetensors file (also --to npz, dir)
  ckptfs --limit max_pickle_bytes=2GiB ls huge.pt""",
    "ls": """\
examples:
  ckptfs ls model.pt
  ckptfs ls --json model.pt | jq -r 'select(.dtype == "bfloat16") | .file'
  ckptfs ls model.pt --limit max_pickle_bytes=1GiB""",
    "info": """\
examples:
  ckptfs info model.pt
  ckptfs info --json model.pt | jq '.tensors[0]'
  ckptfs info --json --indent 2 model.pt --limit max_generated_bytes=1GiB""",
    "mount": """\
examples:
  ckptfs mount model.pt /mnt/m
  ckptfs mount -f --debug model.pt /mnt/m""",
    "umount": """\
examples:
  ckptfs umount /mnt/m
  ckptfs umount -l /mnt/m""",
}


def cmd_ls(args: argparse.Namespace) -> int:
    with gc_paused(), open_checkpoint(args.file, args.limits, remote_options(args), cache_dir(args)) as ck:
        rows = listed(ck, nest=args.nest)
        lines = json_lines(rows, ck.limits.max_generated_bytes) if args.json else text_lines(rows)
        write_text(lines)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with gc_paused(), open_checkpoint(args.file, args.limits, remote_options(args), cache_dir(args)) as ck:
        if not args.json:
            write_text(line + "\n" for line in overview(ck))
            return 0
        text = description_text(ck)
        if args.indent is not None:
            try:
                text = indented(text, args.indent, ck.limits.max_generated_bytes)
            except CkptfsError as exc:
                raise exc.with_path(ck.path) from None
        write_text((text, "\n"))
    return 0


def cmd_mount(args: argparse.Namespace) -> int:
    from ckptfs.fuse.mount_options import group_id, user_id, with_options

    options = MountOptions(
        foreground=args.foreground, debug=args.debug, allow_other=args.allow_other, multithreaded=args.multithreaded,
        nest=args.nest,
        uid=None if args.uid is None else user_id(args.uid, f"--uid {args.uid}"),
        gid=None if args.gid is None else group_id(args.gid, f"--gid {args.gid}"), log_file=args.log_file)
    options = with_options(options, args.options)
    if options.no_cache:
        args.no_cache = True
    elif args.cache_dir is None and options.cache_dir is not None:
        args.cache_dir = chosen_cache_dir(False, Path(options.cache_dir), f"-o cache_dir={options.cache_dir}")
        args.no_cache = args.cache_dir is None
    mount(args.source, args.mountpoint, options, args.limits, remote_options(args), cache_dir(args))
    return 0


def cmd_umount(args: argparse.Namespace) -> int:
    """Unmounts every mount point given; each failure is its own line, and the others are still unmounted."""
    failed = 0
    for mountpoint in args.mountpoints:
        try:
            unmount(mountpoint, lazy=args.lazy)
        except CkptfsError as exc:
            print(f"ckptfs: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def cmd_mounts(args: argparse.Namespace) -> int:
    import json

    from ckptfs.fuse.mount_table import ckptfs_mounts

    for entry in ckptfs_mounts():
        if args.json:
            print(json.dumps({"mountpoint": entry.point, "source": entry.source, "uid": entry.owner},
                             ensure_ascii=False))
        else:
            print(f"{_escaped(entry.point)} {_escaped(entry.source)}")
    return 0


def _escaped(path: str) -> str:
    """As /proc/mounts writes it: space, tab, newline and backslash as octal escapes, so one mount is one line."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def _parse_limit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or name not in Limits.names():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME one of {', '.join(Limits.names())}")
    try:
        return name, parse_quantity(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def _add_limit_option(parser: argparse.ArgumentParser, dest: str) -> None:
    """``--limit`` before or after the command (two destinations: a command's namespace replaces the top one's)."""
    parser.add_argument("--limit", action="append", type=_parse_limit, default=[], dest=dest, metavar="NAME=VALUE",
                        help="raise a safety limit (repeatable; names and defaults below), e.g. "
                             "--limit max_pickle_bytes=1GiB")


def _add_debug_option(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the command too; given nowhere, the top parser's False stands."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")


def limits_help() -> str:
    """The epilog listing every limit with its default."""
    defaults = {name: f"{name}={format_quantity(value, name.endswith('_bytes'))}"
                for name, value in Limits.defaults().items()}
    width = max(map(len, defaults.values()))
    lines = [f"  {defaults[name]:<{width}}  {SUMMARIES[name]}" for name in Limits.names()]
    return ("limits, with their defaults (raise one with --limit NAME=VALUE;\n"
            f"VALUE is {UNITS_HELP}):\n" + "\n".join(lines))


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph texts; keeps texts laid out by hand (epilogs of examples and limits) as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's usage and error, the error on one line whatever the arguments hold."""
        super().error(printable(message))


class _Version(argparse.Action):
    """``--version``: the installed distribution's version (importlib.metadata is only loaded when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print ckptfs' version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> NoReturn:
        from importlib import metadata

        try:
            version = metadata.version("ckptfs")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        print(f"ckptfs {version}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ckptfs", formatter_class=_HelpFormatter,
                     description="Read PyTorch checkpoints without torch: list them, describe them, mount them "
                                 "as a read-only directory of per-tensor files.",
                     epilog=EXAMPLES["ckptfs"] + "\n\n" + limits_help())
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (with mount: also log every request)")
    _add_limit_option(parser, "limit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser,
                                title="commands", help="ckptfs COMMAND --help tells more")
    _add_reading_commands(sub)
    convert = add_convert_command(sub)
    _add_limit_option(convert, "command_limit")
    _add_debug_option(convert)
    _add_mount_commands(sub)
    _lay_out_help(sub)
    return parser


def _add_reading_commands(sub: Any) -> None:
    """``ls`` and ``info``."""
    ls = sub.add_parser("ls", usage="%(prog)s [options] FILE", help="one line per tensor: its file in a mount, dtype, shape, size",
                        description="One line per tensor, in the checkpoint's order: the tensor's file as a mount "
                                    "of FILE shows it (relative to the mount's root), dtype, shape and size.")
    ls.add_argument("file", metavar="FILE", help="a PyTorch checkpoint (recognised by its content, not its name): a path or a URL")
    ls.add_argument("--json", action="store_true",
                    help="one JSON object a line instead: file, path (the keys: strings and numbers), dtype, shape, "
                         "nbytes")
    ls.add_argument("--nest", action="store_true", help="files as a --nest mount shows them (dotted keys as "
                                                        "directories: model/layers/0/mlp/w1.weight)")
    _add_limit_option(ls, "command_limit")
    add_remote_options(ls)
    add_cache_options(ls)
    _add_debug_option(ls)
    ls.set_defaults(run=cmd_ls)
    info = sub.add_parser("info", usage="%(prog)s [options] FILE", help="sizes, parameter count, dtypes and format; --json for every tensor and the "
                                       "whole tree",
                          description="An overview of FILE: total size, parameter count, dtypes, tensors and "
                                      "storages, format. With --json: the summary, every tensor's metadata (as its "
                                      "sidecar in a mount) and the whole object tree, as one JSON text.")
    info.add_argument("file", metavar="FILE", help="a PyTorch checkpoint (recognised by its content, not its name): a path or a URL")
    info.add_argument("--json", action="store_true", help="machine-readable JSON instead of the overview")
    info.add_argument("--indent", type=_indent, metavar="N",
                      help="with --json: lay the JSON out over lines, N spaces per level (default: one line)")
    _add_limit_option(info, "command_limit")
    add_remote_options(info)
    add_cache_options(info)
    _add_debug_option(info)
    info.set_defaults(run=cmd_info)
    for command in (add_cat_parser(sub), add_diff_parser(sub)):
        _add_limit_option(command, "command_limit")
        _add_debug_option(command)


def _add_mount_commands(sub: Any) -> None:
    """``mount``, ``umount`` and ``mounts``."""
    mnt = sub.add_parser(
        "mount", usage="%(prog)s [options] SOURCE MOUNTPOINT", help="mount a checkpoint read-only: a file per tensor, JSON metadata",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount SOURCE read-only at MOUNTPOINT (an empty directory) and return once the mount\n"
                    "answers; the daemon runs in the background. Unmount with: ckptfs umount MOUNTPOINT",
        epilog="examples:\n"
               "  ckptfs mount model.pt /mnt/m\n"
               "  ckptfs mount -o allow_other,uid=1000,umask=022 model.pt /mnt/m\n"
               "  ckptfs mount -o views=json,npy model.pt /mnt/m  # no model.safetensors, no /.zarr\n"
               "  ckptfs mount --log-file /var/log/ckptfs.log model.pt /mnt/m\n"
               "  ckptfs mount -f --debug model.pt /mnt/m     # every request on the terminal")
    mnt.add_argument("source", metavar="SOURCE", help="the checkpoint file or DCP directory, or its URL (s3://, "
                                                      "http(s)://, gs://, ...; a DCP directory's ends in /)")
    mnt.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    mnt.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                     help="mount options: allow_other, allow_root, auto_unmount, uid=N, gid=N, umask=NNN (modes "
                          "0555/0444 less NNN), fsname=NAME, log_file=PATH, debug, ro, default_permissions; "
                          "views=LIST (the files shown beside the tensors': json, npy, q_scales, q_zero_points, "
                          "safetensors, zarr; default all), noviews (tensor files and the index only), nest (--nest), "
                          "zarr_chunk=SIZE (/.zarr's chunks: whole rows of at most SIZE bytes, default 4MiB; 0: one "
                          "chunk an array), "
                          "cache_dir=DIR (--cache-dir), nocache (--no-cache); "
                          "mount flags (noexec, noatime ...) pass on; mount(8)'s own (defaults, noauto, nofail, "
                          "_netdev, x-* ...) are ignored; rw is refused")
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
    _add_limit_option(mnt, "command_limit")
    add_remote_options(mnt)
    add_cache_options(mnt)
    mnt.set_defaults(run=cmd_mount)
    umount = sub.add_parser("umount", help="unmount ckptfs mounts (also dead ones whose daemon was killed)",
                            description="Unmount each MOUNTPOINT; a failure is one line and does not stop the "
                                        "others; the exit status is 1 if any failed.")
    umount.add_argument("mountpoints", metavar="MOUNTPOINT", nargs="+", help="a ckptfs mount point (or a symlink "
                                                                             "to one)")
    umount.add_argument("-l", "--lazy", action="store_true",
                        help="detach now even if files in it are open; the daemon exits once the last is closed")
    umount.set_defaults(run=cmd_umount)
    mounts = sub.add_parser("mounts", help="list the ckptfs mounts: mount point and source, one per line",
                            description="List the ckptfs mounts this process can see (as findmnt -t fuse.ckptfs "
                                        "does): MOUNTPOINT SOURCE, one mount per line, with space, tab, newline and "
                                        "backslash written as octal escapes (\\040 ...) as in /proc/mounts.")
    mounts.add_argument("--json", action="store_true",
                        help="one JSON object per line: mountpoint, source, uid (the user who mounted it)")
    mounts.set_defaults(run=cmd_mounts)


def _indent(text: str) -> int:
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError("expected a number of spaces from 0 to 64")
    return int(text)


def _lay_out_help(sub: Any) -> None:
    """Every command's help: examples, and the limits for those that take --limit."""
    for name, command in sub.choices.items():
        command.formatter_class = _HelpFormatter
        epilog = [command.epilog, EXAMPLES.get(name) if command.epilog is None else None,
                  limits_help() if name in PARSING_COMMANDS else None]
        command.epilog = "\n\n".join(text for text in epilog if text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.limits = Limits(**dict(args.limit + getattr(args, "command_limit", [])))
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with ProgressLine() if args.command in PARSING_COMMANDS else contextlib.nullcontext():
            return run(args)
    except CkptfsError as exc:
        if args.debug:
            raise
        _error(_limit_hint(str(exc), args.limits))
        return getattr(args, "error_status", 1)
    except KeyboardInterrupt:
        if args.debug:
            raise
        _error("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        discard_output()
        return 0


def _error(message: str) -> None:
    """``ckptfs: MESSAGE`` on stderr, one line whatever the message holds."""
    with contextlib.suppress(OSError):
        print(f"ckptfs: {printable(message)}", file=sys.stderr, flush=True)


def _limit_hint(message: str, limits: Limits) -> str:
    """A message naming a limit (``… (limit max_tree_depth)``) ends saying how to raise it."""
    match = _LIMIT_NAMED.search(message)
    if match is None or match.group(1) not in Limits.names():
        return message
    name = match.group(1)
    current = format_quantity(getattr(limits, name), name.endswith("_bytes"))
    return f"{message}; to allow more: --limit {name}=VALUE (now {current})"


def run() -> NoReturn:
    """The ``ckptfs`` command: ``main``, then an exit that leaves the parsed checkpoint to the kernel.

    Freeing a large checkpoint's records one by one at interpreter exit takes
    tens of milliseconds, and ``ckptfs mount`` would spend them after the
    mount is already up and its daemon holds its own copy.
    """
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        discard_output()
    except OSError as exc:
        discard_output()
        _error(f"writing the output: {exc.strerror or exc}")
        code = code or 1
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
