"""JSON text of many small values, fast: the C encoder ``json.dumps`` uses, made once.

``json.dumps`` builds a new encoder on every call, which costs more than
encoding a short list; this one is built at import. The text is the same as
``json.dumps(value)`` gives (checked at import; the plain encoder is used if not).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
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


def decimal_lengths(columns: Sequence[tuple[Sequence[int], int]], plus: Sequence[int] = ()) -> list[int]:
    """For each row, the lengths of the decimal texts (``len(str(value + shift))``) of its value in each column
    (``(values, shift)``, all values of one length) summed, plus the row's item of ``plus`` if given."""
    lengths = [map(len, map(int.__repr__, map(shift.__add__, values) if shift else values))
               for values, shift in columns]
    return list(map(sum, zip(plus, *lengths) if plus else zip(*lengths)))


def ascending_decimal_length(values: Sequence[int]) -> int:
    """``sum(len(str(v)) for v in values)`` for ``values`` in ascending order, with no pass over them: the values
    past each power of ten are found by bisection."""
    if not values:
        return 0
    total = len(values) + bisect_left(values, 0)  # a digit each, and the minus signs
    power = 10
    while power <= values[-1] or -power >= values[0]:
        total += len(values) - bisect_left(values, power) + bisect_right(values, -power)
        power *= 10
    return total


TEXT_CHUNK = 1 << 14
"""Texts joined at once where many are checked or counted in one pass (``text_chunks``): 200,000 keys' text joined
at once is 7-16 MB of a daemon's peak, their names and offsets in a ``model.safetensors`` header ~30 MiB."""


def text_chunks(count: int) -> Iterator[slice]:
    """Slices of ``count`` texts, ``TEXT_CHUNK`` at a time: what a pass over many texts joins at once."""
    return (slice(first, first + TEXT_CHUNK) for first in range(0, count, TEXT_CHUNK))


def plain_lengths(texts: list[str]) -> list[int] | None:
    """``[len(quote(t)) for t in texts]`` when no text needs an escape (each is then its own characters in
    quotes), found in one pass over them all (a chunk at a time: ``text_chunks``); None when some does."""
    for chunk in text_chunks(len(texts)):
        joined = "".join(texts[chunk])
        # quote escapes what is outside " " to "~" (isprintable, for ASCII), and the quote and the backslash.
        if not (joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined):
            return None
    return [len(text) + 2 for text in texts]
