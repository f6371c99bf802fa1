"""Byte sources: where a checkpoint's bytes come from (a local file, bytes in memory, a URL, a file object, a file
of an fsspec file system; a directory or URL prefix as a set of them).

``open_source`` turns what a user names into a source. Everything above this
package reads through ``ByteSource``: a size and positioned reads.
"""

from __future__ import annotations

import os
import re

from ckptfs.sources.base import BUFFERS, ByteSource, SourceStat, hint_extents, tail_hint, version_identity
from ckptfs.sources.directory import DirectorySource, SourceSet
from ckptfs.sources.file_object import FileObjectSource
from ckptfs.sources.fsspec_source import FsspecSource
from ckptfs.sources.local import LocalFileSource
from ckptfs.sources.memory import BytesSource
from ckptfs.sources.prefix import PrefixSet
from ckptfs.sources.remote import DiskCacheSetting, RemoteOptions, open_remote
from ckptfs.sources.window import WindowSource

__all__ = ["BUFFERS", "ByteSource", "BytesSource", "DirectorySource", "DiskCacheSetting", "FileObjectSource",
           "FsspecSource", "LocalFileSource", "PrefixSet", "RemoteOptions", "SourceSet", "SourceStat", "WindowSource",
           "hint_extents", "is_url", "open_source", "tail_hint", "version_identity"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a URL other than ``file://`` (a local path otherwise)."""
    name = os.fspath(target)
    return _URL.match(name) is not None and not name.lower().startswith("file://")


def open_source(target: str | os.PathLike[str], remote: RemoteOptions = RemoteOptions()) -> ByteSource:
    """The source a path or URL names; ``file://`` URLs are local paths; ``remote`` configures URLs."""
    name = os.fspath(target)
    if _URL.match(name) is None:
        return LocalFileSource(name)
    if name.lower().startswith("file://"):
        return LocalFileSource(name[len("file://"):])
    return open_remote(name, remote)
