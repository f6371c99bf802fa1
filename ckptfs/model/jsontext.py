"""JSON text of many small values, fast: the C encoder ``json.dumps`` uses, made once.

``json.dumps`` builds a new encoder on every call, which costs more than
encoding a short list; this one is built at import. The text is the same as
``json.dumps(value)`` gives (checked at import; the plain encoder is used if not).
"""

from __future__ import annotations

import json
from json import encoder as _encoder
from typing import Any, Callable


def _fast() -> Callable[[Any], str] | None:
    if _encoder.c_make_encoder is None:
        return None
    try:
        iterencode = _encoder.c_make_encoder(None, None, _encoder.encode_basestring_ascii, None, ": ", ", ",
                                             False, False, True)
    except TypeError:
        return None

    def dumps(value: Any) -> str:
        return "".join(iterencode(value, 0))

    probe = {"a": [1, 2.5, None, True, "é\x00"], "b": {"c": float("nan")}}
    return dumps if dumps(probe) == json.dumps(probe) else None


dumps: Callable[[Any], str] = _fast() or json.JSONEncoder().encode

quote: Callable[[str], str] = _encoder.encode_basestring_ascii
"""A str's JSON text (ASCII, as ``dumps`` writes it)."""


def scalar_text(value: Any) -> str:
    """``dumps(value)``, quicker for the str and int most keys and values are."""
    kind = type(value)
    if kind is str:
        return quote(value)
    if kind is int:
        return int.__repr__(value)
    return dumps(value)


_POWERS_OF_TEN = [10**k for k in range(1, 19)]
DECIMAL_LIMIT = 1 << 62
"""``decimal_lengths`` takes values below this (int64 arrays); larger ones (hostile sizes only) are counted as text."""


def decimal_lengths(values: Any) -> Any:
    """The lengths of the decimal texts of the int64 array ``values`` (each in ``[0, DECIMAL_LIMIT)``), an array."""
    import numpy as np  # here: a command line that lists no big directory starts without it

    return 1 + np.searchsorted(np.array(_POWERS_OF_TEN, dtype=np.int64), values, side="right")


def plain_lengths(texts: list[str]) -> list[int] | None:
    """``[len(quote(t)) for t in texts]`` when no text needs an escape (each is then its own characters in
    quotes), found in one pass over them all; None when some does."""
    joined = "".join(texts)
    # quote escapes what is outside " " to "~" (isprintable, for ASCII), and the quote and the backslash.
    if joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined:
        return [len(text) + 2 for text in texts]
    return None
