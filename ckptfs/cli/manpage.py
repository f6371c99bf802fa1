"""The manual pages ckptfs(1) and mount.ckptfs(8), made from the argparse parsers so that they cannot drift.

A small generator rather than argparse-manpage: it walks the sub-commands (each a section with its usage,
description, options and examples), adds the limits and the exit statuses, and needs nothing at run time,
so ``ckptfs --man`` works on any install. The copies in ``man/`` (``ckptfs --man > man/ckptfs.1``,
``ckptfs --man mount.ckptfs > man/mount.ckptfs.8``) are installed to ``share/man`` (pyproject.toml), and
tests/docs/test_manpages.py checks they are what this module makes.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn, Sequence

from ckptfs.cli.help_texts import EXAMPLES, limits_help

PAGES = {"ckptfs": ("ckptfs.1", "1"), "mount.ckptfs": ("mount.ckptfs.8", "8")}
SEE_ALSO = ("mount.ckptfs(8), fusermount3(1), mount(8), fstab(5), systemd.mount(5); the documentation in the "
            "docs/ folder of ckptfs' source (docs/cli.md, docs/mount.md, docs/limits.md)")


def text(value: str) -> str:
    """Roff-safe text: backslashes and hyphens escaped, no line starting with a control character."""
    value = value.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in value.split("\n"))


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else " " + (action.metavar or action.dest.upper())
            names = ", ".join(f"\\fB{text(name)}\\fR" for name in action.option_strings)
            lines += [".TP", f"{names}{text(str(metavar))}"]
        else:
            lines += [".TP", f"\\fI{text(str(action.metavar or action.dest))}\\fR"]
        lines.append(text(action.help or ""))
    return lines


def _block(body: str) -> list[str]:
    return [".PP", ".nf", ".RS 2", text(body), ".RE", ".fi"]


def _usage(parser: argparse.ArgumentParser) -> str:
    return re.sub(r"\s+", " ", parser.format_usage().removeprefix("usage: ")).strip()


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [".SH COMMANDS"]
    for name, command in sub.choices.items():
        lines += [f".SS {name}", f"\\fB{text(_usage(command))}\\fR", ".PP", text(command.description or "")]
        lines += _options(command)
        if name in EXAMPLES:
            lines += _block(EXAMPLES[name])
    return lines


def _mount_options_help(parser: argparse.ArgumentParser) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a.help or "" for a in sub.choices["mount"]._actions if "-o" in a.option_strings)


def page(name: str, ckptfs_parser: argparse.ArgumentParser) -> str:
    """The roff source of one page, ``ckptfs`` or ``mount.ckptfs``, from ``ckptfs``'s parser (and the helper's)."""
    from ckptfs.cli.mount_helper import build_parser as build_helper_parser

    parser = ckptfs_parser if name == "ckptfs" else build_helper_parser()
    section = PAGES[name][1]
    title = "User Commands" if section == "1" else "System Administration"
    lines = [f".TH {name.upper()} {section} \"\" ckptfs \"{title}\"",
             ".SH NAME", f"{text(name)} \\- {text(parser.description or '')}",
             ".SH SYNOPSIS", f"\\fB{text(_usage(parser))}\\fR", ".SH OPTIONS", *_options(parser)]
    if name == "ckptfs":
        lines += _commands(parser)
        lines += [".SH LIMITS", *_block(limits_help())]
        lines += [".SH EXIT STATUS", "0 success; 1 an error, reported on one line as \\fBckptfs: FILE: what is "
                  "wrong\\fR; 2 a bad command line (and \\fBdiff\\fR: trouble reading); 130 interrupted (Ctrl\\-C)."]
    else:
        lines += [".SH DESCRIPTION", text("mount(8) runs this helper for file system type ckptfs (and fuse.ckptfs, "
                                          "installed as /sbin/mount.fuse.ckptfs), so that an /etc/fstab line such as"),
                  *_block("/data/model.pt  /mnt/m  ckptfs  ro,allow_other  0 0"),
                  ".PP", text("or a systemd mount unit with Type=ckptfs mounts a checkpoint at boot. mount(8)'s own "
                              "options (defaults, noauto, nofail, _netdev, x-*) are ignored; rw is taken as ro. "
                              "The others are those of ckptfs mount -o: " + _mount_options_help(ckptfs_parser)),
            ".SH EXIT STATUS", "0 mounted; 1 bad usage; 32 the mount failed (the reason on one line)."]
    lines += [".SH SEE ALSO", text(SEE_ALSO), ""]
    return "\n".join(lines)


class ManPage(argparse.Action):
    """``--man [PAGE]``: the manual page ckptfs(1), or mount.ckptfs(8), as roff (``ckptfs --man | man -l -``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", const="ckptfs", choices=tuple(PAGES),
                         default=argparse.SUPPRESS, metavar="PAGE",
                         help="print the manual page of ckptfs, or of mount.ckptfs, as roff and exit "
                              "(read it with: ckptfs --man | man -l -)", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> NoReturn:
        sys.stdout.write(page(values, parser))
        parser.exit()
