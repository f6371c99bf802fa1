"""Tensor encodings torch still loads but no longer writes, each compared with what torch 2.13 loads."""

from __future__ import annotations

import copyreg
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
import torch
from corpus import dtype_name, torch_bytes

import ckptfs
from ckptfs.errors import CorruptCheckpointError


class SubTensor(torch.Tensor):
    """A tensor subclass (importable by name, so torch can load it back)."""


class BuiltTensor:
    """Pickles as older torch did: ``cls()`` then ``BUILD`` with ``state``."""

    def __init__(self, cls: type, state: tuple) -> None:
        self.cls, self.state = cls, state

    def __reduce_ex__(self, proto: int) -> tuple:
        return (self.cls, (), self.state)


def _old_state() -> dict[str, Any]:
    floats = torch.arange(12, dtype=torch.float32)
    longs = torch.arange(5, dtype=torch.int64) * (1 << 40)
    halves = torch.tensor([0.5, -2.0, 65504.0], dtype=torch.float16)
    return {
        "plain": BuiltTensor(torch.Tensor, (floats.storage(), 2, (2, 3), (3, 1))),
        "transposed": BuiltTensor(torch.Tensor, (floats.storage(), 0, (3, 4), (1, 3))),
        "long": BuiltTensor(torch.LongTensor, (longs.storage(), 1, (4,), (1,))),
        "half": BuiltTensor(torch.HalfTensor, (halves.storage(), 0, (3,), (1,))),
        "variable": BuiltTensor(torch.Tensor, (torch.ones(2, 2, dtype=torch.float64), None, None, True, None)),
        "empty": BuiltTensor(torch.Tensor, (True, None, None)),
    }


@pytest.fixture(scope="module", params=["zip", "legacy"])
def old_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("old") / f"old_{request.param}.pt"
    torch.save(_old_state(), path, _use_new_zipfile_serialization=request.param == "zip")
    return path


def _same_as_torch(ck: ckptfs.Checkpoint, key: str, expected: torch.Tensor) -> None:
    tensor = ck.root[key]
    assert isinstance(tensor, ckptfs.Tensor), key
    assert (tensor.dtype.name, tensor.shape, tensor.stride, tensor.storage_offset, tensor.requires_grad) == (
        dtype_name(expected.dtype), tuple(expected.shape), expected.stride(), expected.storage_offset(),
        expected.requires_grad), key
    assert ck.read(tensor) == torch_bytes(expected), key


def test_tensors_given_their_data_by_build_read_as_torch_loads_them(old_file: Path) -> None:
    expected = torch.load(old_file, weights_only=False)
    with ckptfs.open(old_file) as ck:
        assert set(ck.root) == set(expected)
        for key, value in expected.items():
            _same_as_torch(ck, key, value)
        assert ck.root["plain"].storage is ck.root["transposed"].storage
        assert ck.root["empty"].shape == (0,) and ck.root["empty"].requires_grad


def test_a_legacy_tensor_class_refuses_a_storage_of_another_dtype_as_torch_does(tmp_path: Path) -> None:
    path = tmp_path / "mismatch.pt"
    torch.save({"t": BuiltTensor(torch.IntTensor, (torch.arange(4).storage(), 0, (4,), (1,)))}, path)
    with pytest.raises(RuntimeError, match="Expected a Storage of type int"):
        torch.load(path, weights_only=True)
    with pytest.raises(CorruptCheckpointError,
                       match="legacy tensor class of dtype int32 is set to a storage of dtype int64"):
        ckptfs.open(path)


def test_a_bad_legacy_state_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save({"t": BuiltTensor(torch.Tensor, (1, 2))}, path)
    with pytest.raises(CorruptCheckpointError, match=r"a legacy tensor's state \(1, 2\) is not a 3, 4 or 5-tuple"):
        ckptfs.open(path)


def test_a_meta_subclass_with_attributes_is_a_data_less_tensor(tmp_path: Path) -> None:
    meta = torch.empty(3, 4, dtype=torch.float16, device="meta").as_subclass(SubTensor)
    meta.note = "kept in the subclass's state"
    path = tmp_path / "meta_sub.pt"
    torch.save({"m": meta}, path)
    loaded = torch.load(path, weights_only=False)["m"]
    with ckptfs.open(path) as ck:
        tensor = ck.root["m"]
        assert isinstance(tensor, ckptfs.Tensor) and ck.tensors == [tensor]
        assert (tensor.dtype.name, tensor.shape, tensor.kind, tensor.has_data) == ("float16", (3, 4), "meta", False)
        assert tensor.type_name == f"{SubTensor.__module__}.SubTensor"
        assert (tuple(loaded.shape), loaded.dtype, loaded.is_meta) == ((3, 4), torch.float16, True)


@pytest.mark.parametrize("zip_format", [True, False])
def test_an_empty_storage_under_two_dtypes_gives_each_reference_its_own(tmp_path: Path, zip_format: bool) -> None:
    floats = torch.empty(0, dtype=torch.float32)
    state = {"f": floats, "i": torch.empty(0, dtype=torch.int8).set_(floats.untyped_storage()),
             "d": torch.empty(0, dtype=torch.float64).set_(floats.untyped_storage())}
    path = tmp_path / "empty.pt"
    torch.save(state, path, _use_new_zipfile_serialization=zip_format)
    loaded = torch.load(path)
    with ckptfs.open(path) as ck:
        assert {k: t.dtype.name for k, t in ck.root.items()} == {k: dtype_name(t.dtype) for k, t in loaded.items()}
        assert {k: ck.read(t) for k, t in ck.root.items()} == dict.fromkeys(state, b"")


def test_a_jagged_nested_tensor_shows_its_components(tmp_path: Path) -> None:
    jagged = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.jagged)
    path = tmp_path / "njt.pt"
    torch.save({"nt": jagged}, path)
    loaded = torch.load(path, weights_only=False)["nt"]
    with ckptfs.open(path) as ck:
        nested = ck.root["nt"]
        assert isinstance(nested, ckptfs.NestedTensor) and set(nested.components) == {"values", "offsets"}
        assert ck.read(nested.components["values"]) == torch_bytes(loaded.values())
        assert ck.read(nested.components["offsets"]) == torch_bytes(loaded.offsets())


def test_a_parameter_made_by_newobj_is_its_tensor(tmp_path: Path) -> None:
    class NewParameter:
        __class__ = torch.nn.Parameter  # type: ignore[assignment]  # pickle checks NEWOBJ's class by this attribute

        def __reduce_ex__(self, proto: int) -> tuple:
            return (copyreg.__newobj__, (torch.nn.Parameter, torch.arange(3.0), False))

    path = tmp_path / "newobj.pt"
    torch.save({"p": NewParameter()}, path)
    loaded = torch.load(path)["p"]
    with ckptfs.open(path) as ck:
        tensor = ck.root["p"]
        assert tensor.is_parameter and not tensor.requires_grad and not loaded.requires_grad
        assert ck.read(tensor) == torch_bytes(loaded)
