"""Numbers and plurals for people, one way in every command."""

from __future__ import annotations

from ckptfs.counts import counted, number, plural


def test_thousands_are_separated_by_commas() -> None:
    assert [number(n) for n in (0, 999, 1000, 20_000, 1_234_567)] == ["0", "999", "1,000", "20,000", "1,234,567"]


def test_one_is_singular_and_every_other_count_plural() -> None:
    assert [counted(n, "tensor") for n in (0, 1, 2, 20_000)] == ["0 tensors", "1 tensor", "2 tensors",
                                                                  "20,000 tensors"]
    assert [counted(n, "attempt") for n in (1, 3)] == ["1 attempt", "3 attempts"]
    assert [plural(n, "alias") for n in (1, 2)] == ["alias", "aliases"]
    assert counted(3, "tensor path") == "3 tensor paths" and counted(1, "other value") == "1 other value"
