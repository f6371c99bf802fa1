"""torch.export ``.pt2`` archives written by torch 2.13: every tensor equals ``torch.export.load``'s, byte for byte."""

from __future__ import annotations

import io
import json
import pickle
import random
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from checks import assert_tensor_matches
from corpus import torch_bytes
from pt2_writer import Weights, exported, load, save
from torch import nn
from torch.export.pt2_archive import PT2ArchiveWriter
from torch.export.pt2_archive._package import load_pt2, package_pt2
from torch.testing._internal.two_tensor import TwoTensor

import ckptfs
from ckptfs.errors import UnsupportedError
from ckptfs.pickle.values import PickledObject
from ckptfs.sources import BytesSource


@pytest.fixture(scope="module")
def weights_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(exported(), tmp_path_factory.mktemp("pt2") / "weights.pt2")


def assert_program_matches(ck: ckptfs.Checkpoint, model: str, ep: torch.export.ExportedProgram) -> None:
    """Every weight and constant of ``ep`` is a tensor of the tree at ``(model, kind, FQN)``, and nothing else is."""
    rng = random.Random(14)
    expected = {(model, "weights", fqn): t for fqn, t in ep.state_dict.items()}
    expected.update({(model, "constants", fqn): t for fqn, t in ep.constants.items()})
    assert set(ck.root[model]["weights"]) == set(ep.state_dict)
    assert set(ck.root[model]["constants"]) == set(ep.constants)
    for path, t in expected.items():
        assert_tensor_matches(ck, path, t, isinstance(t, nn.Parameter), rng)


def local_data_offset(path: Path, name: str) -> int:
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        info = archive.getinfo(name)
        f.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
        return info.header_offset + 30 + name_length + extra_length


def test_every_weight_and_constant_equals_torch_export_load(weights_pt2: Path) -> None:
    ep = load(weights_pt2)
    with ckptfs.open(weights_pt2) as ck:
        assert ck.format == "pt2"
        assert ck.details["archive_prefix"] == "weights" and ck.details["models"] == "model"
        assert_program_matches(ck, "model", ep)
        dtypes = {t.dtype.name for t in ck}
        assert {"float32", "bfloat16", "int64", "float16", "complex64", "uint16", "float8_e5m2", "bool"} <= dtypes


def test_shared_storages_once_and_tied_weights_one_tensor(weights_pt2: Path) -> None:
    with ckptfs.open(weights_pt2) as ck:
        weights = ck.root["model"]["weights"]
        assert weights["tied.weight"] is weights["lin.weight"] and weights["tied.bias"] is weights["lin.bias"]
        assert len(ck) == len(weights) - 2 + len(ck.root["model"]["constants"])
        lin, lin2 = weights["lin.weight"], weights["lin2.weight"]
        assert lin2 is not lin and lin2.storage is lin.storage and lin2.stride == (1, 4)
        pa, pb = weights["pa"], weights["pb"]
        assert pa.storage is pb.storage and (pa.storage_offset, pb.storage_offset) == (2, 6)
        assert pa.storage.nbytes == 40, "the whole base storage is stored, elements no tensor views included"
        assert len(ck.storages) == len({id(s) for s in ck.storages})
        record = f"weights/{pa.storage.record}"
        assert pa.storage.offset == local_data_offset(weights_pt2, record)
        [extent] = ck.extents(pa)
        assert (extent.offset, extent.length) == (pa.storage.offset + 8, 16)
        assert ck.extents(lin2) is None
        assert ck.read(weights["empty"]) == b"" and weights["empty"].shape == (0, 3)


def test_no_pickle_is_read_for_plain_tensors(weights_pt2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ckptfs.formats.pt2_payloads as payloads

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a pickle was read")

    monkeypatch.setattr(payloads, "SafeUnpickler", refuse)
    monkeypatch.setattr(payloads, "open_embedded", refuse)
    with ckptfs.open(weights_pt2) as ck:
        assert len(ck) > 20


@pytest.mark.parametrize("name", ["my.model.v1.pt2", "anything.bin", "no_suffix"])
def test_root_folder_and_file_name_are_free(tmp_path: Path, name: str) -> None:
    ep = exported(Weights())
    buffer = io.BytesIO()
    save(ep, buffer)  # type: ignore[arg-type]
    path = tmp_path / name
    if name == "no_suffix":
        path.write_bytes(buffer.getvalue())
        prefix = "archive"
    else:
        save(ep, path)
        prefix = name.rpartition(".")[0]
    with ckptfs.open(path) as ck:
        assert ck.details["archive_prefix"] == prefix
        assert_program_matches(ck, "model", ep)
    with ckptfs.open(BytesSource(buffer.getvalue(), "in-memory")) as ck:
        assert ck.details["archive_prefix"] == "archive"
        assert_program_matches(ck, "model", ep)


class WithSubclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(TwoTensor(torch.arange(4.0), torch.arange(4.0) * 2))
        self.q = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.p + self.q.sum()


def test_subclass_weight_through_the_restricted_unpickler(tmp_path: Path) -> None:
    with torch.no_grad():
        ep = torch.export.export(WithSubclass(), (torch.randn(4),))
    path = save(ep, tmp_path / "sub.pt2")
    theirs = load(path).state_dict["p"]
    assert type(theirs) is TwoTensor
    with ckptfs.open(path) as ck:
        p = ck.root["model"]["weights"]["p"]
        assert isinstance(p, PickledObject) and p.callable.qualname.endswith("TwoTensor")
        for component in ("a", "b"):
            tensor = ck.tensor(("model", "weights", "p", component))
            assert ck.read(tensor) == torch_bytes(getattr(theirs, component))
            assert ck.extents(tensor) is not None, "an embedded archive's storages are served from the .pt2 itself"
        assert ck.read(ck.tensor(("model", "weights", "q"))) == torch_bytes(load(path).state_dict["q"])


def test_older_layout_of_torch_2_7(tmp_path: Path) -> None:
    """No root folder: the program's JSON beside torch.save archives of the state dict and constants."""
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    ep = exported()
    artifact = serialize(ep)
    path = tmp_path / "legacy.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("serialized_exported_program.json", artifact.exported_program)
        z.writestr("serialized_state_dict.pt", artifact.state_dict)
        z.writestr("serialized_constants.pt", artifact.constants)
        z.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
    theirs = load(path)
    with ckptfs.open(path) as ck:
        assert ck.details["schema_version"] == "8.20"
        assert_program_matches(ck, "model", theirs)
        assert all(ck.extents(t) is not None for t in ck if t.is_contiguous and t.nbytes)


def test_intermediate_layout_one_torch_save_per_model(tmp_path: Path, weights_pt2: Path) -> None:
    """``data/weights/<model>.pt`` and ``data/constants/<model>.pt`` in place of the payload configs."""
    ep = load(weights_pt2)
    path = tmp_path / "intermediate.pt2"
    with zipfile.ZipFile(weights_pt2) as source, PT2ArchiveWriter(str(path)) as writer:
        for name in source.namelist():
            record = name.partition("/")[2]
            if not record.startswith(("data/weights/", "data/constants/", ".data/")):
                writer.write_bytes(record, source.read(name))
        for record, value in (("data/weights/model.pt", ep.state_dict), ("data/constants/model.pt", ep.constants)):
            buffer = io.BytesIO()
            torch.save(value, buffer)
            writer.write_bytes(record, buffer.getvalue())
    theirs = load(path)
    with ckptfs.open(path) as ck:
        assert {s.record.partition("/data/")[0] for s in ck.storages} == {"data/weights/model.pt",
                                                                          "data/constants/model.pt"}
        assert_program_matches(ck, "model", theirs)


def test_several_models_in_one_package(tmp_path: Path) -> None:
    path = tmp_path / "two.pt2"
    programs = {"first": exported(), "second": exported(nn.Sequential(nn.Linear(4, 2)))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package_pt2(str(path), exported_programs=programs, extra_files={"config.json": "{}"})
    theirs = load_pt2(str(path)).exported_programs
    with ckptfs.open(path) as ck:
        assert list(ck.root) == ["first", "second"]
        assert ck.details["extra_files"] == "config.json"
        for model, ep in theirs.items():
            assert_program_matches(ck, model, ep)


def test_aoti_package_with_weights_in_its_library(tmp_path: Path) -> None:
    """The records ``aoti_compile_and_package`` writes by default (spec B.4): no program, no weight file."""
    path = tmp_path / "aoti.pt2"
    with PT2ArchiveWriter(str(path)) as writer:
        writer.write_bytes("data/aotinductor/model/c4wrap.wrapper.cpp", b"// generated")
        writer.write_bytes("data/aotinductor/model/c4wrap.wrapper_metadata.json", b"{}")
        writer.write_bytes("data/aotinductor/model/c4wrap.wrapper.so", b"\x7fELF" + bytes(1000))
    with pytest.raises(UnsupportedError, match=r"aoti\.pt2: an AOTInductor package whose weights are compiled into "
                                                r"its shared library \(data/aotinductor/model/c4wrap\.wrapper\.so\)"):
        ckptfs.open(path)


def test_custom_and_opaque_objects_read_without_running_them(tmp_path: Path, weights_pt2: Path) -> None:
    """``custom_obj_<i>`` (torch._C._pickle_save, a zip) and ``opaque_obj_<i>`` (pickle.dumps) constants."""
    path = tmp_path / "objects.pt2"
    custom = torch._C._pickle_save(torch.arange(3.0))
    opaque = pickle.dumps({"scale": 0.5, "names": ["a", "b"]}, protocol=2)
    with zipfile.ZipFile(weights_pt2) as source, PT2ArchiveWriter(str(path)) as writer:
        for name in source.namelist():
            record = name.partition("/")[2]
            data = source.read(name)
            if record == "data/constants/model_constants_config.json":
                config = json.loads(data)
                config["config"]["custom"] = {"path_name": "custom_obj_0", "is_param": False, "use_pickle": True,
                                              "tensor_meta": None}
                config["config"]["opaque"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                              "tensor_meta": None}
                data = json.dumps(config).encode()
            if not record.startswith(".data/"):
                writer.write_bytes(record, data)
        writer.write_bytes("data/constants/custom_obj_0", custom)
        writer.write_bytes("data/constants/opaque_obj_0", opaque)
    with ckptfs.open(path) as ck:
        constants = ck.root["model"]["constants"]
        assert ck.read(constants["custom"]) == torch_bytes(torch._C._pickle_load_obj(custom))
        assert constants["opaque"] == pickle.loads(opaque)


def test_aoti_package_with_weights_kept_as_files(tmp_path: Path) -> None:
    """``package_constants_in_so=False`` with ``pickle_weights`` (spec B.4): a torch.save archive per weight file
    and ``weights_config.json`` mapping each FQN to a view of it, as torch's ``load_pt2`` reads them."""
    weight = nn.Parameter(torch.randn(3, 4, generator=torch.Generator().manual_seed(4)))
    buffer = io.BytesIO()
    torch.save(weight, buffer)
    path = tmp_path / "aoti_weights.pt2"
    config = {"lin.weight": ["weight_0", [3, 4], [4, 1], 0], "lin.weight_t": ["weight_0", [4, 3], [1, 4], 0],
              "row": ["weight_0", [4], [1], 4]}
    with PT2ArchiveWriter(str(path)) as writer:
        writer.write_bytes("data/aotinductor/model/c4wrap.wrapper.so", b"\x7fELF" + bytes(1000))
        writer.write_bytes("data/weights/weight_0", buffer.getvalue())
        writer.write_string("data/aotinductor/model/weights_config.json", json.dumps(config))
    loaded = torch.load(io.BytesIO(buffer.getvalue()))
    with ckptfs.open(path) as ck:
        assert ck.details["layout"] == "AOTInductor package, weights outside its library"
        weights = ck.root["model"]["weights"]
        assert list(weights) == list(config)
        for fqn, (_, sizes, strides, offset) in config.items():
            theirs = loaded.detach().as_strided(sizes, strides, offset)
            assert weights[fqn].shape == tuple(sizes) and ck.read(weights[fqn]) == torch_bytes(theirs), fqn
        assert weights["lin.weight"].storage is weights["row"].storage


def test_opening_reads_no_weight_and_a_read_only_its_own_bytes(tmp_path: Path) -> None:
    from counting import CountingSource

    from ckptfs.formats.prefetch import TAIL_BYTES
    from ckptfs.sources import LocalFileSource

    path = save(exported(nn.Sequential(*(nn.Linear(4 if n == 0 else 256, 256) for n in range(4)))),
                tmp_path / "layers.pt2")
    source = CountingSource(LocalFileSource(path))
    with ckptfs.open(source) as ck:
        data = [(s.offset, s.offset + s.nbytes) for s in ck.storages]
        tail = min(source.size, TAIL_BYTES)
        assert source.reads[0] == (source.size - tail, tail) and len(source.reads) <= 3, source.reads
        for offset, length in source.reads[1:]:
            assert not any(offset < end and start < offset + length for start, end in data), (offset, length)
        weight = ck.tensor(("model", "weights", "2.weight"))
        source.reads.clear()
        assert ck.read(weight) == torch_bytes(load(path).state_dict["2.weight"])
        header_checks, own = source.reads[:-1], source.reads[-1]
        assert own == (weight.storage.offset, 256 * 256 * 4)
        assert len(header_checks) <= 1, "the record's local header, checked on its first read"
        assert all(weight.storage.offset - 4096 < o and o + n <= weight.storage.offset for o, n in header_checks)
