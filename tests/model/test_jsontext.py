"""``model.jsontext``'s lengths found in bulk equal those of the texts made one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.model.jsontext import DECIMAL_LIMIT, decimal_lengths, plain_lengths, quote

_PLAIN = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=8)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.one_of(_PLAIN, st.text(max_size=4)), max_size=10))
def test_plain_lengths_are_the_quoted_lengths_or_none(texts: list[str]) -> None:
    found = plain_lengths(texts)
    if found is None:
        assert any(quote(text) != f'"{text}"' for text in texts)
    else:
        assert found == [len(quote(text)) for text in texts]


@given(texts=st.lists(_PLAIN, max_size=10))
def test_texts_without_escapes_are_counted(texts: list[str]) -> None:
    assert plain_lengths(texts) == [len(text) + 2 for text in texts]


def test_escapes_are_not_counted() -> None:
    for text in ['a"', "a\\", "\x7f", "\x1f", "é", "\ud800"]:
        assert plain_lengths(["x", text]) is None


@given(values=st.lists(st.integers(0, DECIMAL_LIMIT - 1), max_size=10))
def test_decimal_lengths(values: list[int]) -> None:
    edges = [0, 9, 10, 99, 100, 10**17 - 1, 10**17, 10**18 - 1, 10**18, DECIMAL_LIMIT - 1]
    values = values + edges
    assert decimal_lengths(np.array(values, dtype=np.int64)).tolist() == [len(str(v)) for v in values]
