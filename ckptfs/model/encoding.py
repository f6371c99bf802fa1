"""Model values as JSON-ready values, and keys as JSON text.

Values JSON cannot hold are encoded as one-key objects whose key starts with
``$`` (documented in docs/formats.md, "JSON encodings"): ``$bytes`` (base64), ``$int`` (decimal text,
for integers beyond ±2**53), ``$float`` (``nan``, ``inf``, ``-inf``),
``$complex``, ``$tuple``, ``$set``, ``$global``, ``$ndarray``, ``$str``
(a string that is not valid UTF-8), ``$unhashable`` and ``$repr``.
"""

from __future__ import annotations

import math
from typing import Any

from ckptfs.model.jsontext import quote, scalar_text
from ckptfs.model.records import Key
from ckptfs.model.tree import is_container
from ckptfs.model.values import NumpyArray
from ckptfs.pickle.values import Global, UnhashableKey, short_repr

JSON_SAFE_INT = 1 << 53
SET_DEPTH = 8
"""Sets nested deeper than this inside a set are shown as ``$repr``; sets are leaves, not walked."""
SET_TEXT = 1 << 16
"""Sets holding more text than this (strings and bytes, counted with repeats) are shown as ``$repr``:
a set's elements can be one long string's references, and every listing of it would spell them out."""


def encode_key(key: Any) -> Any:
    """A path element as JSON: str and int as themselves, anything else encoded."""
    if isinstance(key, str) and not has_surrogates(key):
        return key
    if type(key) is int and abs(key) < JSON_SAFE_INT:
        return key
    if type(key) is tuple:
        return {"$tuple": [encode_key(k) for k in key]}
    return encode_leaf(key)


def encode_leaf(value: Any, set_depth: int = SET_DEPTH) -> Any:
    """A non-container value as JSON (see the module docstring for the ``$`` forms)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < JSON_SAFE_INT else {"$int": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, str):
        return value if not has_surrogates(value) else {"$str": _base64(value.encode("utf-8", "surrogatepass"))}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": _base64(bytes(value))}
    if isinstance(value, complex):
        return {"$complex": [encode_leaf(value.real), encode_leaf(value.imag)]}
    if isinstance(value, Global):
        return {"$global": value.qualname}
    if isinstance(value, (set, frozenset)) and set_depth > 0 and _text_within(value, SET_TEXT):
        return {"$set": sorted((encode_leaf(v, set_depth - 1) for v in value), key=repr)}
    if isinstance(value, UnhashableKey):
        if is_container(value.value):
            return {"$unhashable": short_repr(value.value, 200)}
        return encode_leaf(value.value)
    if isinstance(value, NumpyArray):
        return {"$ndarray": {"dtype": value.dtype, "shape": list(value.shape), "fortran_order": value.fortran_order,
                             "data": _base64(value.data or b"")}}
    return {"$repr": short_repr(value, 200)}


def _base64(data: bytes) -> str:
    import base64  # here: few values need it, and a mount's start does without it

    return base64.b64encode(data).decode("ascii")


def _text_within(value: Any, limit: int) -> bool:
    """Whether the strings, bytes and elements inside ``value`` (a set: sets and tuples in it walked) come to
    at most ``limit`` characters, counting each element at least 8."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, (set, frozenset, tuple)):
            limit -= 8 * len(item)
            pending.extend(item)
        elif isinstance(item, (str, bytes)):
            limit -= len(item) * (2 if isinstance(item, bytes) else 1)
        if limit < 0:
            return False
    return True


def has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def key_text(key: Key) -> str:
    if type(key) is str and key.isascii():  # no surrogates: the key is its own JSON value
        return quote(key)
    if type(key) is int and -JSON_SAFE_INT < key < JSON_SAFE_INT:  # a list's index
        return int.__repr__(key)
    return scalar_text(encode_key(key))


def key_size(key: Any) -> int:
    """About the length of a key's JSON text: exact for str keys without escapes, and for ints."""
    kind = type(key)
    if kind is str:
        return len(key) + 2
    if kind is int:
        return len(int.__repr__(key))
    return len(key_text(key))
