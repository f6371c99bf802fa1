"""Mount options: ``ckptfs mount``'s flags and its ``-o`` lists, spelled as sshfs, fstab lines and mount(8) spell them.

``-o`` takes ``rw`` (a writable mount, ``fuse.writable``; ``ro``, the default, undoes it), libfuse's own options
(``allow_other``, ``allow_root``,
``auto_unmount``, ``fsname=``), the owner and modes of every file (``uid=``,
``gid=``, ``umask=``, applied by ckptfs), the views shown (``views=json,npy``, ``noviews``: see
``fs.views.VIEW_NAMES``), ``/.zarr``'s chunk bytes (``zarr_chunk=4MiB``), a remote object's
connections (``max_connections=16``), the kernel's mount flags
(``noexec``, ``noatime`` …, passed on), and the options mount(8) and systemd
keep for themselves (``defaults``, ``noauto``, ``nofail``, ``x-systemd.*`` …),
which say when and by whom to mount and are ignored here. libfuse 3 refuses any
option it does not know, so every option is checked here first.
"""

from __future__ import annotations

import dataclasses
import grp
import pwd
from dataclasses import dataclass
from typing import Any, Iterable

from ckptfs.errors import MountError
from ckptfs.fs.views import VIEW_NAMES, UnknownViewError, view_names
from ckptfs.fs.zarr import ZARR_CHUNK
from ckptfs.limits import parse_quantity
from ckptfs.sources.remote.options import MAX_CONNECTIONS


@dataclass(frozen=True)
class MountOptions:
    foreground: bool = False
    debug: bool = False
    """libfuse logs every request (on stderr with ``-f``, else in the log file)."""
    allow_other: bool = False
    allow_root: bool = False
    auto_unmount: bool = False
    multithreaded: bool = False
    uid: int | None = None
    """Owner of every entry; None: the source file's owner."""
    gid: int | None = None
    umask: int | None = None
    """Mode bits taken from 0555 (directories) and 0444 (files); None: the source file's read bits."""
    fsname: str | None = None
    """The mount's source in the mount table; None: the checkpoint's absolute path."""
    log_file: str | None = None
    kernel_flags: tuple[str, ...] = ()
    """Mount flags passed on to libfuse (``noexec``, ``noatime`` …)."""
    nest: bool = False
    """Dicts' dotted keys shown as directories (``fs.nest``)."""
    state_dict: bool = False
    """A whole pickled ``nn.Module`` shown as its ``state_dict()`` (``-o state_dict``)."""
    views: frozenset[str] = frozenset(VIEW_NAMES)
    """The views shown (``fs.views.VIEW_NAMES``): ``-o views=json,npy``, ``-o noviews``."""
    cache_dir: str | None = None
    """``-o cache_dir=DIR``: the cache folder (``--cache-dir``); None: the command's choice."""
    no_cache: bool = False
    """``-o nocache``: no cache on disk (``--no-cache``)."""
    rw: bool = False
    """``-o rw``: writable tensors' files take writes into the checkpoint, in place (``fuse.writable``)."""
    zarr_chunk: int = ZARR_CHUNK
    """``-o zarr_chunk=SIZE``: bytes of a ``/.zarr`` array's chunk (whole rows; 0: one chunk an array)."""
    max_connections: int | None = None
    """``-o max_connections=N``: a remote object's GETs in flight at once (``--max-connections``); None: the
    command's."""


FUSE_FLAGS = ("allow_other", "allow_root", "auto_unmount", "debug")
ALWAYS = ("default_permissions",)
"""Accepted: every ckptfs mount is so."""
KERNEL_FLAGS = frozenset({
    "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "nodiratime", "diratime",
    "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime", "nolazytime", "sync", "async", "dirsync",
})
MOUNT8_FLAGS = frozenset({"defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "nofail",
                          "_netdev"})
MOUNT8_PREFIXES = ("x-", "comment=", "user=")
"""mount(8)'s and systemd's own options: when and by whom to mount; the mount itself has nothing to do with them."""
def with_options(options: MountOptions, lists: Iterable[str], *, rw_as_ro: bool = False,
                 sloppy: bool = False) -> MountOptions:
    """``options`` changed by ``-o`` lists (``OPT[,OPT…]``); MountError naming the first option refused.

    ``rw_as_ro``: take ``rw`` as ``ro`` (mount(8) passes ``rw`` to its helper
    unless told ``ro``); ``sloppy``: ignore unknown options (mount -s).
    """
    changes: dict[str, Any] = {}
    flags = list(options.kernel_flags)
    views: list[str] | None = None
    for text in lists:
        listing_views = False
        for option in filter(None, text.split(",")):
            name, has_value, value = option.partition("=")
            if listing_views and not has_value and name in VIEW_NAMES:
                # views=json,npy: the names after views= are its (no view is called as an option is).
                views.append(name)  # type: ignore[union-attr]
                continue
            after_views, listing_views = listing_views, False
            if has_value and name == "views":
                views, listing_views = list(filter(None, value.split(":"))), True
            elif option == "noviews":
                views = []
            elif option in ("nest", "state_dict"):
                changes[option] = True
            elif option == "nocache":
                changes["no_cache"] = True
            elif not has_value and name in FUSE_FLAGS:
                changes[name] = True
            elif not has_value and name in KERNEL_FLAGS:
                flags.append(name)
            elif option in ALWAYS or option in MOUNT8_FLAGS or option.startswith(MOUNT8_PREFIXES):
                pass
            elif option == "rw":
                changes["rw"] = not rw_as_ro
            elif option == "ro":
                changes["rw"] = False
            elif has_value and name in ("uid", "gid", "umask", "fsname", "log_file", "cache_dir", "zarr_chunk",
                                               "max_connections"):
                changes[name] = _value(name, value)
            elif after_views and not has_value and not sloppy:
                # views=json,foo: a misspelt view, refused below as views=zzz is.
                views.append(name)  # type: ignore[union-attr]
                listing_views = True
            elif not sloppy:
                raise MountError("unknown mount option (ckptfs mount --help lists them)", f"-o {option}")
    if views is not None:
        try:
            changes["views"] = view_names(views)
        except UnknownViewError as exc:
            raise MountError(exc.reason, f"-o views={','.join(views)}") from None
    return dataclasses.replace(options, kernel_flags=tuple(dict.fromkeys(flags)), **changes)


def check_options(options: MountOptions) -> None:
    """MountError for options that cannot go together."""
    if options.debug and not options.foreground and options.log_file is None:
        raise MountError("--debug in the background needs --log-file PATH (or -f, to log on the terminal)")


def _value(name: str, text: str) -> int | str:
    where = f"-o {name}={text}"
    if name == "uid":
        return user_id(text, where)
    if name == "gid":
        return group_id(text, where)
    if name == "umask":
        try:
            umask = int(text, 8)
        except ValueError:
            umask = -1
        if not 0 <= umask <= 0o777:
            raise MountError("expected an octal mode from 000 to 777", where)
        return umask
    if name == "max_connections":
        if not text.isdigit() or not 1 <= int(text) <= MAX_CONNECTIONS:
            raise MountError(f"expected a whole number from 1 to {MAX_CONNECTIONS}", where)
        return int(text)
    if name == "zarr_chunk":
        try:
            return parse_quantity(text)
        except ValueError as exc:
            raise MountError(str(exc), where) from None
    if not text:
        raise MountError("expected a value", where)
    return text


def user_id(text: str, where: str) -> int:
    """A user's id from a number or a name (MountError naming ``where`` when there is no such user)."""
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise MountError("no such user", where) from None


def group_id(text: str, where: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise MountError("no such group", where) from None


def libfuse_flags(options: MountOptions) -> list[str]:
    """The ``-o`` flags libfuse gets (besides those ``fuse_ops.serve`` always sets; auto_unmount is ckptfs's own)."""
    flags = [name for name in ("allow_other", "allow_root") if getattr(options, name)]
    if options.allow_root and options.allow_other:
        flags.remove("allow_root")  # libfuse refuses both at once; allow_other already lets root in
    return flags + list(options.kernel_flags)
