"""The ``ckptfs`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import IO, Any, Callable, NoReturn, Sequence

from ckptfs.cli.cache_options import add_cache_options
from ckptfs.cli.cat import add_cat_parser
from ckptfs.cli.convert import add_convert_command
from ckptfs.cli.diff import add_diff_parser
from ckptfs.cli.fill import add_fill_parser
from ckptfs.cli.global_options import add_debug_option, add_limit_option
from ckptfs.cli.help_texts import EXAMPLES, LIMITS_POINTER, HelpFormatter, HelpLimits
from ckptfs.cli.info import description_text, indented, overview
from ckptfs.cli.interrupts import INTERRUPTED, RaisingInterrupts, exit_on_interrupt
from ckptfs.cli.listing import json_lines, listed, text_lines
from ckptfs.cli.manpage import ManPage
from ckptfs.cli.mount_commands import add_mount_commands
from ckptfs.cli.output import discard_output, write_text
from ckptfs.cli.printable import printable
from ckptfs.cli.progress import ProgressLine
from ckptfs.cli.remote_options import add_remote_options
from ckptfs.cli.state_dict_option import add_state_dict_option, opened
from ckptfs.errors import CkptfsError
from ckptfs.gc_pause import gc_paused
from ckptfs.limits import Limits, format_quantity

PARSING_COMMANDS = ("ls", "info", "cat", "diff", "mount", "convert", "fill")
"""Commands that parse a checkpoint: a progress line on a terminal, ``--limit`` and ``--debug`` after them too."""
_LIMIT_NAMED = re.compile(r"\(limit (max_\w+)(?:=\d+)?\)")

def cmd_ls(args: argparse.Namespace) -> int:
    with gc_paused(), opened(args, args.file) as ck:
        rows = listed(ck, nest=args.nest)
        lines = json_lines(rows, ck.limits.max_generated_bytes) if args.json else text_lines(rows)
        write_text(lines)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with gc_paused(), opened(args, args.file) as ck:
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




class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's usage and error, the error on one line whatever the arguments hold."""
        super().error(printable(message))

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        """As argparse's, but a failed write (``--help`` to a full disk) is not ignored."""
        if message:
            (file or sys.stderr).write(message)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version (importlib.metadata is only loaded when asked) and which
    parse path opens torch.save zips."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print ckptfs' version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> NoReturn:
        from importlib import metadata

        try:
            version = metadata.version("ckptfs")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        from ckptfs.fuse import dirents
        from ckptfs.pickle import cscan

        print(f"ckptfs {version}\npickle scanner (torch.save zips, DCP .metadata): {cscan.active_path()}\n"
              f"listing loop (mounts): {dirents.PATH_NAME}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ckptfs", usage="%(prog)s [options] COMMAND ...", formatter_class=HelpFormatter,
                     description="Read PyTorch checkpoints without torch: list them, describe them, mount them "
                                 "as a read-only directory of per-tensor files.",
                     epilog=EXAMPLES["ckptfs"] + "\n\n" + LIMITS_POINTER)
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--help-limits", action=HelpLimits)
    parser.add_argument("--man", action=ManPage)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (with mount: also log every request)")
    add_limit_option(parser, "limit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser, prog="ckptfs",
                                title="commands", help="ckptfs COMMAND --help tells more")
    _add_reading_commands(sub)
    convert = add_convert_command(sub)
    add_limit_option(convert, "command_limit")
    add_debug_option(convert)
    add_mount_commands(sub)
    _lay_out_help(sub)
    return parser


def _add_reading_commands(sub: Any) -> None:
    """``ls`` and ``info``."""
    ls = sub.add_parser("ls", usage="%(prog)s [options] FILE", help="one line per tensor: its file in a mount, dtype, shape, size",
                        description="One line per tensor, in the checkpoint's order: its file as a mount of FILE shows "
                                    "it, dtype, shape and size; aliases (its other places: links) follow: b -> a.")
    ls.add_argument("file", metavar="FILE", help="a PyTorch checkpoint (recognised by its content, not its name): a path or a URL")
    ls.add_argument("--json", action="store_true",
                    help="one JSON object a line instead: file, path (the keys: strings and numbers), dtype, shape, "
                         "nbytes")
    ls.add_argument("--nest", action="store_true", help="files as a --nest mount shows them (dotted keys as "
                                                        "directories: model/layers/0/mlp/w1.weight)")
    add_limit_option(ls, "command_limit")
    add_remote_options(ls)
    add_cache_options(ls)
    add_state_dict_option(ls)
    add_debug_option(ls)
    ls.set_defaults(run=cmd_ls)
    info = sub.add_parser("info", usage="%(prog)s [options] FILE", help="sizes, element count, dtypes and format; --json for every tensor and the "
                                       "whole tree",
                          description="An overview of FILE: total size, tensors and aliases, elements, dtypes, "
                                      "storages, format. With --json: the summary, every tensor's metadata (as its "
                                      "sidecar in a mount) and the whole object tree, as one JSON text.")
    info.add_argument("file", metavar="FILE", help="a PyTorch checkpoint (recognised by its content, not its name): a path or a URL")
    info.add_argument("--json", action="store_true", help="machine-readable JSON instead of the overview")
    info.add_argument("--indent", type=_indent, metavar="N",
                      help="with --json: lay the JSON out over lines, N spaces per level (default: one line)")
    add_limit_option(info, "command_limit")
    add_remote_options(info)
    add_cache_options(info)
    add_state_dict_option(info)
    add_debug_option(info)
    info.set_defaults(run=cmd_info, command_parser=info)
    for command in (add_cat_parser(sub), add_diff_parser(sub), add_fill_parser(sub)):
        add_limit_option(command, "command_limit")
        add_debug_option(command)


def _indent(text: str) -> int:
    if not text.isdigit() or int(text) > 64:
        raise argparse.ArgumentTypeError("expected a number of spaces from 0 to 64")
    return int(text)


def _lay_out_help(sub: Any) -> None:
    """Every command's help: examples, and the limits for those that take --limit."""
    for name, command in sub.choices.items():
        command.formatter_class = HelpFormatter
        epilog = [command.epilog, EXAMPLES.get(name) if command.epilog is None else None,
                  LIMITS_POINTER if name in PARSING_COMMANDS else None]
        command.epilog = "\n\n".join(text for text in epilog if text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except BrokenPipeError:
        discard_output()
        return 0
    except OSError as exc:  # --help or --version written to a full disk
        discard_output()
        _error(f"writing the output: {exc.strerror or exc}")
        return 1
    if getattr(args, "indent", None) is not None and not args.json:
        args.command_parser.error("--indent lays out --json's output: give --json too")
    args.limits = Limits(**dict(args.limit + getattr(args, "command_limit", [])))
    try:
        if hasattr(args, "prepare"):
            args.prepare(args)
    except CkptfsError as exc:  # the command's own arguments: no traceback to show, even with --debug
        _error(str(exc))
        return 1
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with RaisingInterrupts(), ProgressLine() if args.command in PARSING_COMMANDS else contextlib.nullcontext():
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
    exit_on_interrupt()
    try:
        code = main()
    except SystemExit as exc:  # argparse after --help, --version or a usage error
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
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
