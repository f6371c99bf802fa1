"""torch's rebuild calls interpreted by name: the records they make and the lies they refuse."""

from __future__ import annotations

import pytest

from ckptfs.errors import CorruptCheckpointError
from ckptfs.model import rebuild
from ckptfs.model.dtypes import DTYPES
from ckptfs.model.records import Storage, Tensor
from ckptfs.pickle.values import Global

FLOAT32 = DTYPES["float32"]


def _storage(numel: int) -> Storage:
    return Storage("0", FLOAT32, "cpu", numel, "data/0", offset=64, size=numel * 4)


def _handler(name: str):  # type: ignore[no-untyped-def]
    handler = rebuild.resolve(Global("torch._utils", name))
    assert handler is not None
    return handler


def test_rebuild_tensor_v2_makes_the_view_it_names() -> None:
    storage = _storage(12)
    tensor = _handler("_rebuild_tensor_v2")((storage, 2, (2, 5), (5, 1), True, {}))
    assert isinstance(tensor, Tensor)
    assert (tensor.dtype, tensor.shape, tensor.stride, tensor.storage_offset, tensor.storage) == (
        FLOAT32, (2, 5), (5, 1), 2, storage)
    assert tensor.requires_grad and tensor.is_contiguous and tensor.nbytes == 40


def test_rebuild_parameter_marks_its_tensor() -> None:
    tensor = _handler("_rebuild_tensor_v2")((_storage(4), 0, (4,), (1,), False, {}))
    parameter = _handler("_rebuild_parameter")((tensor, True, {}))
    assert parameter is tensor and tensor.is_parameter and tensor.requires_grad


@pytest.mark.parametrize("args, message", [
    ((_storage(4), 1, (4,), (1,), False, {}),
     r"tensor of size \(4,\), stride \(1,\), offset 1 \(float32\) needs 20 bytes but storage '0' holds 16"),
    ((_storage(4), 0, (2, 2), (2,), False, {}), r"tensor size \(2, 2\) and stride \(2,\) differ in rank"),
    ((_storage(4), -1, (4,), (1,), False, {}), "negative storage offset -1"),
    ((_storage(4), 0, (-4,), (1,), False, {}), r"tensor size \(-4,\) has a negative entry"),
    ((_storage(4), 0, (4,)), "_rebuild_tensor_v2 takes 6 or 7 arguments, got 3"),
])
def test_views_that_do_not_fit_their_storage_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=message):
        _handler("_rebuild_tensor_v2")(args)


def test_unknown_names_stay_inert() -> None:
    assert rebuild.resolve(Global("os", "system")) is None
    assert rebuild.resolve(Global("torch._utils", "_rebuild_anything_else")) is None
    assert rebuild.resolve(Global("collections", "OrderedDict")) is not None


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (2, 0, 3), (3, 0), (0, 4, 1), (1, 1, 7), (4, 5, 6, 7)])
def test_contiguous_strides_are_torchs(shape: tuple[int, ...]) -> None:
    torch = pytest.importorskip("torch")
    from ckptfs.model.records import contiguous_strides

    assert contiguous_strides(shape) == torch.empty(shape).stride()
