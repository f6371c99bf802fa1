"""Byte sources: where a checkpoint's bytes come from (a local file, bytes in memory; URLs to come).

``open_source`` turns what a user names into a source. Everything above this
package reads through ``ByteSource``: a size and positioned reads.
"""

from __future__ import annotations

import os
import re

from ckptfs.errors import UnsupportedError
from ckptfs.sources.base import ByteSource, SourceStat, tail_hint
from ckptfs.sources.directory import DirectorySource, SourceSet
from ckptfs.sources.local import LocalFileSource
from ckptfs.sources.memory import BytesSource
from ckptfs.sources.window import WindowSource

__all__ = ["ByteSource", "BytesSource", "DirectorySource", "LocalFileSource", "SourceSet", "SourceStat", "WindowSource",
           "open_source", "tail_hint"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def open_source(target: str | os.PathLike[str]) -> ByteSource:
    """The source a path or URL names; ``file://`` URLs are local paths."""
    name = os.fspath(target)
    match = _URL.match(name)
    if match is None:
        return LocalFileSource(name)
    scheme = match.group()[:-3].lower()
    if scheme == "file":
        return LocalFileSource(name[len("file://"):])
    raise UnsupportedError(f"{scheme}:// sources are not supported yet", name)
