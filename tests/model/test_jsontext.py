"""``model.jsontext``'s lengths found in bulk equal those of the texts made one by one."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.model import jsontext
from ckptfs.model.jsontext import ascending_decimal_length, decimal_lengths, plain_lengths, quote

_PLAIN = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=8)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.one_of(_PLAIN, st.text(max_size=4)), max_size=10), chunk=st.sampled_from([1, 3, 1 << 14]))
def test_plain_lengths_are_the_quoted_lengths_or_none(texts: list[str], chunk: int) -> None:
    """Whatever chunk the texts are checked in (``TEXT_CHUNK``): an escape in any chunk is found."""
    with mock.patch.object(jsontext, "TEXT_CHUNK", chunk):
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


_EDGES = [0, 9, 10, 99, 100, 10**17 - 1, 10**17, 10**18 - 1, 10**18, (1 << 63) - 1, 1 << 63]
_INTS = st.one_of(st.integers(-(1 << 63), 1 << 63), st.integers(-(10**40), 10**40),
                  st.sampled_from(_EDGES + [-edge for edge in _EDGES]))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(_INTS, _INTS), max_size=12), shifts=st.tuples(_INTS, _INTS))
def test_decimal_lengths_are_the_lengths_of_the_texts(rows: list[tuple[int, int]], shifts: tuple[int, int]) -> None:
    """Negative, zero and past int64, columns sharing values."""
    firsts, seconds = [row[0] for row in rows], [row[1] for row in rows]
    columns = [(firsts, 0), (seconds, shifts[0]), (firsts, shifts[1])]
    expected = [len(str(a)) + len(str(b + shifts[0])) + len(str(a + shifts[1])) for a, b in rows]
    assert decimal_lengths(columns) == expected
    plus = list(range(len(rows)))
    assert decimal_lengths(columns, plus) == [n + length for n, length in zip(plus, expected)]


def test_decimal_lengths_of_the_edges() -> None:
    values = _EDGES + [-edge for edge in _EDGES]
    assert decimal_lengths([(values, 0)]) == [len(str(v)) for v in values]
    assert decimal_lengths([(values, 1)]) == [len(str(v + 1)) for v in values]
    assert decimal_lengths([]) == []


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(_INTS, st.integers(-(10**300), 10**300)), max_size=20))
def test_ascending_decimal_length_is_the_texts_length(values: list[int]) -> None:
    values.sort()
    assert ascending_decimal_length(values) == sum(len(str(v)) for v in values)
