"""Reading views without torch: gathered bytes against numpy's own strided view of the same storage."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ckptfs.model.dtypes import DTYPES
from ckptfs.model.records import Storage, Tensor
from ckptfs.reading.extents import needs_gather, stored_extents
from ckptfs.reading.gather import gather
from ckptfs.sources import BytesSource

DTYPE_NAMES = ["float32", "int16", "float64", "uint8", "complex64"]


@st.composite
def views(draw: st.DrawFn) -> tuple[np.ndarray, Tensor, bytes]:
    """A storage of random bytes and a view of it (any shape, strides with zeros and gaps, an offset)."""
    dtype = DTYPES[draw(st.sampled_from(DTYPE_NAMES))]
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=3)))
    stride = tuple(draw(st.lists(st.integers(0, 7), min_size=len(shape), max_size=len(shape))))
    offset = draw(st.integers(0, 6))
    numel = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1
    raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
    storage = Storage("0", dtype, "cpu", numel, "data/0", offset=0, size=len(raw), source=BytesSource(raw))
    tensor = Tensor(dtype, shape, stride, offset, storage)
    units = np.frombuffer(raw, dtype=f"V{dtype.itemsize}")
    expected = np.lib.stride_tricks.as_strided(units[offset:], shape, [s * dtype.itemsize for s in stride])
    return expected, tensor, raw


def _read(storage: Storage, offset: int, length: int) -> bytes:
    assert storage.source is not None
    return storage.source.read(storage.offset + offset, length)


@given(views(), st.data())
def test_any_range_of_elements_equals_numpys_view(view: tuple[np.ndarray, Tensor, bytes], data: st.DataObject) -> None:
    expected, tensor, _ = view
    first = data.draw(st.integers(0, tensor.numel))
    last = data.draw(st.integers(first, tensor.numel))
    if first == last:
        return
    assert gather(_read, tensor, first, last) == np.ascontiguousarray(expected).reshape(-1)[first:last].tobytes()


@given(views())
def test_a_view_has_extents_exactly_when_it_is_one_stored_range(view: tuple[np.ndarray, Tensor, bytes]) -> None:
    expected, tensor, raw = view
    extents = stored_extents(tensor)
    assert (extents is None) == needs_gather(tensor)
    if extents is not None:
        (extent,) = extents
        assert raw[extent.offset : extent.offset + extent.length] == np.ascontiguousarray(expected).tobytes()
