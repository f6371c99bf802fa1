"""Tensor and storage records: every field through the constructor, defaults kept out of each instance, copies."""

from __future__ import annotations

import copy
import pickle
from typing import Any

from ckptfs.model.dtypes import DTYPES
from ckptfs.model.records import Chunk, Quantization, RecordPrefix, Storage, Tensor, replace

_F32, _F16 = DTYPES["float32"], DTYPES["float16"]


def _storage_values(base: Storage) -> dict[str, Any]:
    return {"key": "7", "dtype": _F16, "location": "cuda:1", "numel": 12, "record": "archive/data/7", "offset": 64,
            "size": 24, "byteorder": "big", "compressed": True, "written": False, "inline_data": b"xy",
            "base": base, "base_offset": 3, "source": None}


def _tensor_values(storage: Storage) -> dict[str, Any]:
    return {"dtype": _F16, "shape": (3, 4), "stride": (1, 3), "storage_offset": 2, "storage": storage,
            "requires_grad": True, "is_parameter": True, "kind": "meta", "conj": True, "neg": True,
            "quantization": Quantization("per_tensor_affine", 0.5, 3), "type_name": "m.Sub", "trail": ("k", None),
            "chunks": [Chunk((0,), (2,), "f", 0, 8)]}


def test_every_field_is_set_by_position_and_by_name() -> None:
    base = Storage("0", _F32, "cpu", 4)
    values = _storage_values(base)
    assert tuple(values) == Storage.FIELDS
    for storage in (Storage(*values.values()), Storage(**values)):
        assert {name: getattr(storage, name) for name in Storage.FIELDS} == values
    tensor_values = _tensor_values(base)
    assert tuple(tensor_values) == Tensor.FIELDS
    for tensor in (Tensor(*tensor_values.values()), Tensor(**tensor_values)):
        assert {name: getattr(tensor, name) for name in Tensor.FIELDS} == tensor_values


def test_defaults_are_the_classes_not_each_records() -> None:
    """A state dict's 200,000 records each hold their few varying fields only (the point of ``_Record``)."""
    storage = Storage("0", _F32, "cpu", 4, "data/0", 0, 16, "little", False, True, None, None, 0, None)
    tensor = Tensor(_F32, (4,), (1,), 0, storage, False, False, "dense", False, False, None, None, None, None)
    assert storage.__dict__ == {} and tensor.__dict__ == {}
    assert (storage.byteorder, storage.compressed, storage.written, storage.base, storage.base_offset) == (
        "little", False, True, None, 0)
    assert (tensor.requires_grad, tensor.is_parameter, tensor.conj, tensor.neg, tensor.chunks) == (
        False, False, False, False, None)
    tensor.requires_grad = True
    assert tensor.__dict__ == {"requires_grad": True} and Tensor(_F32, (), (), 0, None).requires_grad is False


def test_replace_copies_and_keeps_a_record_prefix() -> None:
    storage = Storage("12", _F32, "cpu", 4, RecordPrefix("data/"), 128, 16)
    alias = replace(storage, dtype=_F16, numel=0, base=storage)
    assert alias is not storage and alias.record == storage.record == "data/12"
    assert (alias.dtype, alias.numel, alias.base, alias.offset) == (_F16, 0, storage, 128)
    assert (storage.dtype, storage.numel, storage.base) == (_F32, 4, None)
    tensor = Tensor(_F32, (4,), (1,), 0, storage, requires_grad=True, trail="w")
    bare = replace(tensor, trail=None)
    assert (bare.trail, bare.requires_grad, bare.storage, tensor.trail) == (None, True, storage, "w")


def test_records_survive_pickle_and_copy() -> None:
    base = Storage("0", _F32, "cpu", 4)
    tensor = Tensor(**_tensor_values(Storage(**_storage_values(base))))
    for made in (pickle.loads(pickle.dumps(tensor)), copy.deepcopy(tensor)):
        assert type(made) is Tensor
        assert repr(made) == repr(tensor)
        assert made.storage is not None and made.storage.base is not None and made.storage.base.key == "0"


def test_each_field_alone_is_kept() -> None:
    """A record differing from the defaults by one field only keeps that field (each one's check counts)."""
    base = Storage("0", _F32, "cpu", 4)
    storage_values, tensor_values = _storage_values(base), _tensor_values(base)
    plain_storage = dict(zip(Storage.FIELDS, ("0", _F32, "cpu", 4, "", -1, 0, "little", False, True, None, None, 0,
                                              None)))
    for name in Storage.FIELDS:
        made = Storage(**{**plain_storage, name: storage_values[name]})
        assert getattr(made, name) == storage_values[name], name
    plain_tensor = dict(zip(Tensor.FIELDS, (_F32, (4,), (1,), 0, None, False, False, "dense", False, False, None,
                                            None, None, None)))
    for name in Tensor.FIELDS:
        made_tensor = Tensor(**{**plain_tensor, name: tensor_values[name]})
        assert getattr(made_tensor, name) == tensor_values[name], name
