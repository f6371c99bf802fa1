"""What names an entry: the entry format's version, the checkpoint formats it holds and the digest of its key.
Apart from ``entry_file`` (and numpy, which it needs), so that a command that finds no entry never imports numpy."""

from __future__ import annotations

try:
    from _blake2 import blake2b  # hashlib's own: hashlib itself loads OpenSSL's libcrypto and sets up every digest
except ImportError:  # a Python built without its own blake2
    from hashlib import blake2b

FORMAT_VERSION = 3
"""Raised whenever what an entry holds, or how, changes: an entry of another version is a miss."""
CACHED_FORMATS = ("zip", "torchscript", "legacy", "dcp", "pt2")
"""The formats an entry holds (``parsed_codec``)."""


def key_digest(key: str) -> bytes:
    return blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32).digest()
