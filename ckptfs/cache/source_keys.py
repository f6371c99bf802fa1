"""What a metadata cache entry is valid for: the source's identity and state, as a string whose digest names
the entry. Any change of the source is another key, hence a miss; a source none of these describe is not cached.

* A local file: device, inode, size, modification and change times.
* A remote object (``sources.base.version_identity``): endpoint, public URL (never a credential or a query),
  size, and the ETag, generation or version id its first answer pinned, with its Last-Modified.
* A local directory (a torch.distributed.checkpoint): the directory's own state and every file's in it, so a
  file added, removed, renamed or rewritten is a miss; at most ``MAX_DIRECTORY_FILES`` files.
* A URL prefix: its ``.metadata``'s version (opened here, by the request its parse would make first). Its data
  files are not looked at: a checkpoint saved again writes a new ``.metadata``; a prefix without one (per-rank
  metadata) is not cached.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from ckptfs.cache.entry_key import FORMAT_VERSION
from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource, DirectorySource, LocalFileSource, PrefixSet, version_identity

MAX_DIRECTORY_FILES = 4096
"""A directory of more files is not cached: stating each on every open would cost what the cache saves."""
METADATA = ".metadata"


def source_key(source: ByteSource, limits: Limits) -> str | None:
    kind = type(source)
    what: Any
    if kind is LocalFileSource:
        fd = source.fileno()
        what = None if fd is None else _state(fd)
    elif kind is DirectorySource:
        what = _directory_state(source)  # type: ignore[arg-type]
    elif kind is PrefixSet:
        what = _prefix_version(source)  # type: ignore[arg-type]
    else:
        identity = version_identity(source)
        what = None if identity is None else ["object", identity]
    if what is None:
        return None
    return json.dumps({"entry_format": FORMAT_VERSION, "limits": dataclasses.asdict(limits), "file": what},
                      sort_keys=True)


def _state(file: int | str) -> list[int] | None:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _directory_state(directory: DirectorySource) -> list[Any] | None:
    names = directory.names()
    if len(names) > MAX_DIRECTORY_FILES:
        return None
    states = {name: _state(os.path.join(directory.name, name)) for name in names}
    own = _state(directory.name)
    if own is None or any(state is None for state in states.values()):
        return None
    return ["directory", own, states]


def _prefix_version(prefix: PrefixSet) -> list[str] | None:
    try:
        identity = version_identity(prefix.open(METADATA))
    except CkptfsError:
        return None
    return None if identity is None else ["prefix", prefix.name, identity]
