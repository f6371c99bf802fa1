"""Numbers in text for people, the same in every command and message: ``20,000``, ``1 tensor``, ``2 tensors``."""

from __future__ import annotations

IRREGULAR = {"alias": "aliases", "entry": "entries", "is": "are", "was": "were"}


def number(n: int) -> str:
    """``20,000``: thousands separated by commas."""
    return f"{n:,}"


def plural(n: int, noun: str) -> str:
    """``noun`` as it goes with ``n``: ``tensor`` for 1, ``tensors`` otherwise (``alias`` -> ``aliases``)."""
    if n == 1:
        return noun
    head, _, last = noun.rpartition(" ")
    many = IRREGULAR.get(last, last + "s")
    return f"{head} {many}" if head else many


def counted(n: int, noun: str) -> str:
    """``1 tensor``, ``20,000 tensors``, ``3 tensor paths``: the number and the noun that goes with it."""
    return f"{number(n)} {plural(n, noun)}"
