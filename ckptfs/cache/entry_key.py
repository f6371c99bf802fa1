"""What names an entry: the entry format's version and the digest of its key. Apart from ``entry_file`` (and
numpy, which it needs), so that a command that finds no entry never imports numpy."""

from __future__ import annotations

import hashlib

FORMAT_VERSION = 2
"""Raised whenever what an entry holds, or how, changes: an entry of another version is a miss."""


def key_digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32).digest()
