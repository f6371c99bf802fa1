"""torch 1.13's ``torch.distributed._shard.checkpoint`` directories (DCP's predecessor), written as 1.13 wrote them
(``dcp_1_13_writer``): the same records as DCP's under 1.13's class names, no flattening of the state dict, one
file per item by default. They open as DCP directories, with the bytes torch saved."""

from __future__ import annotations

import pickletools
from pathlib import Path

import pytest
import torch
from dcp_1_13_writer import save_1_13
from dcp_writers import raw_bytes
from mount.helpers import run_cli

import ckptfs

STATE = {
    "w": torch.randn(4, 6, generator=torch.Generator().manual_seed(1)),
    "b": torch.arange(5, dtype=torch.int64),
    "half": torch.randn(3, 5, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).t(),
    "step": 7,
    "opt": {"lr": 0.5, "t": torch.ones(2)},
}


@pytest.fixture(scope="module", params=["file_per_item", "file_per_rank"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcp_1_13") / request.param
    save_1_13(STATE, path, sharded={"w": (1, 3)}, world=2, single_file_per_rank=request.param == "file_per_rank")
    return path


def _globals(data: bytes) -> set[str]:
    strings, found = [], set()
    for opcode, argument, _ in pickletools.genops(data):
        if opcode.name == "STACK_GLOBAL":
            found.add(".".join(strings[-2:]))
        if isinstance(argument, str):
            strings.append(argument)
    return found


def test_the_writer_writes_1_13_s_names(written: Path) -> None:
    names = _globals((written / ".metadata").read_bytes())
    assert "torch.distributed._shard.checkpoint.metadata.Metadata" in names
    assert "torch.distributed._shard.checkpoint.filesystem._StorageInfo" in names
    assert not any(name.startswith("torch.distributed.checkpoint.") for name in names)
    files = sorted(p.name for p in written.iterdir())
    if written.name == "file_per_item":  # rank 0: w's two boxes, b, half, step, opt; rank 1: w's third box
        assert files == [".metadata", *(f"__0_{n}.distcp" for n in range(6)), "__1_0.distcp"]
    else:
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_tensors_and_objects_read_as_torch_saved_them(written: Path) -> None:
    with ckptfs.open(written) as ck:
        assert ck.format == "dcp"
        assert ck.details["written_by"] == "torch 1.13's torch.distributed._shard.checkpoint"
        for name in ("w", "b", "half"):
            assert ck.read(ck.tensor((name,))) == raw_bytes(STATE[name]), name
        assert len(ck.tensor(("w",)).chunks) == 3
        assert ck.root["step"] == 7 and ck.root["opt"]["lr"] == 0.5  # not flattened: one bytes item each
        assert ck.read(ck.root["opt"]["t"]) == raw_bytes(STATE["opt"]["t"])


def test_the_cli_lists_and_reads_it(written: Path, tmp_path: Path) -> None:
    listing = run_cli("ls", written)
    assert listing.returncode == 0, listing.stderr
    assert ["w", "float32", "4x6", "96", "B"] in [line.split() for line in listing.stdout.splitlines()]
    cat = run_cli("cat", written, "half", "-o", tmp_path / "half.bin")
    assert cat.returncode == 0, cat.stderr
    assert (tmp_path / "half.bin").read_bytes() == raw_bytes(STATE["half"])
    info = run_cli("info", written)
    assert "written by: torch 1.13's torch.distributed._shard.checkpoint" in info.stdout


def test_its_metadata_file_alone_names_the_directory(written: Path) -> None:
    from ckptfs.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match=r"the \.metadata file of a torch\.distributed\.checkpoint directory: "
                                               r"mount the directory"):
        ckptfs.open(written / ".metadata")
