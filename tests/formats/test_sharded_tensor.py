"""torch.save of ``torch.distributed._shard`` ShardedTensors (the torch 1.13-era sharding API, still in torch 2.13):
a wrapper subclass whose state lists the rank's local shards. Each shard's tensor appears, with its
``ShardMetadata`` (offsets, sizes, placement) beside it, holding torch's bytes. Where the local shards cover the
whole tensor (a one-rank save), the whole tensor appears too, as ``__gathered__``: torch's ``gather`` bytes, read
from the shards; a rank's file of a larger job says why it has none, in ``__not_gathered__``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from dcp_writers import raw_bytes
from mount.helpers import run_cli
from sharded_tensor_writer import write_ranks

import ckptfs
from ckptfs.cache.errors import NotCacheable
from ckptfs.cache.parsed_codec import encode_parsed
from ckptfs.formats.detect import open_parsed
from ckptfs.pickle.values import PickledObject
from ckptfs.sources import open_source

SHARDED = ("rows", "cols", "grid", "uneven")
SHARDS = {"rows": 3, "cols": 2, "grid": 4, "uneven": 4}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("sharded1")
    write_ranks(out, 1)
    return out / "rank0.pt", torch.load(out / "gathered.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sharded2")
    write_ranks(out, 2)
    return out


def test_local_shards_appear_with_their_bytes(one_rank: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, gathered = one_rank
    with ckptfs.open(path) as ck:
        wrapper = ck.root["rows"]
        assert isinstance(wrapper, PickledObject)
        assert wrapper.callable.qualname == "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
        local = wrapper.state[0]
        assert len(local) == 3
        rows = raw_bytes(gathered["rows"])
        for shard, (start, end) in zip(local, [(0, 48), (48, 96), (96, 112)]):
            assert ck.read(shard.state[1]["tensor"]) == rows[start:end]
        assert local[2].state[1]["metadata"].state[1]["shard_sizes"] == [1, 4]
        assert [t.path for t in ck.tensors][:4] == [("rows", "__gathered__"), *(("rows", "__state__", 0, n, "tensor")
                                                                                 for n in range(3))]


@pytest.mark.parametrize("name", SHARDED)
def test_the_whole_tensor_is_torch_s_gather(one_rank: tuple[Path, dict[str, torch.Tensor]], name: str) -> None:
    path, gathered = one_rank
    want = raw_bytes(gathered[name])
    with ckptfs.open(path) as ck:
        whole = ck.tensor((name, "__gathered__"))
        assert (whole.dtype.name, whole.shape) == (str(gathered[name].dtype).removeprefix("torch."),
                                                   tuple(gathered[name].shape))
        assert len(whole.chunks) == SHARDS[name] and "__not_gathered__" not in dict(ck.root[name].dict_items)
        assert ck.read(whole) == want
        rng = random.Random(7)
        for _ in range(40):
            offset = rng.randrange(len(want))
            size = rng.randrange(1, len(want) - offset + 1)
            assert ck.read(whole, offset, size) == want[offset : offset + size]


def test_a_split_along_rows_is_served_from_the_file(one_rank: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """Shards of consecutive rows are consecutive runs of the whole tensor: its extents are theirs (zero-copy
    reads in a mount); a split along columns must be gathered."""
    path, _ = one_rank
    with ckptfs.open(path) as ck:
        shards = [ck.extents(shard.state[1]["tensor"])[0] for shard in ck.root["rows"].state[0]]
        assert ck.extents(ck.tensor(("rows", "__gathered__"))) == shards
        assert ck.extents(ck.tensor(("cols", "__gathered__"))) is None


def test_a_rank_s_file_says_why_there_is_no_whole_tensor(two_ranks: Path) -> None:
    held = {0: {"rows": 16, "cols": 15, "grid": 12, "uneven": 10}, 1: {"rows": 12, "cols": 15, "grid": 12,
                                                                       "uneven": 5}}
    numel = {"rows": 28, "cols": 30, "grid": 24, "uneven": 15}
    for rank in (0, 1):
        with ckptfs.open(two_ranks / f"rank{rank}.pt") as ck:
            for name in SHARDED:
                assert ck.root[name].dict_items == [("__not_gathered__", (
                    f"the local shards do not make the whole tensor: they hold {held[rank][name]} of its "
                    f"{numel[name]} elements (the rest were on other ranks)"))]
            assert all("__gathered__" not in t.path for t in ck.tensors)
            for tensor in ck.tensors:
                assert len(ck.read(tensor)) == tensor.nbytes


def test_ls_cat_and_info(one_rank: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, gathered = one_rank
    listing = run_cli("ls", path)
    assert listing.returncode == 0, listing.stderr
    lines = [line.split() for line in listing.stdout.splitlines()]
    assert ["grid/__gathered__", "int64", "4x6", "192", "B"] in lines
    cat = run_cli("cat", path, "grid/__gathered__", "-o", path.with_name("grid.bin"))
    assert cat.returncode == 0, cat.stderr
    assert path.with_name("grid.bin").read_bytes() == raw_bytes(gathered["grid"])
    info = run_cli("info", path)
    assert "sharded: 4 ShardedTensors gathered from 13 local shards (tensors listed too)" in " ".join(info.stdout.split())


def test_the_description_names_each_shard_s_tensor(one_rank: tuple[Path, dict[str, torch.Tensor]]) -> None:
    from ckptfs.fs.describe import tensor_metadata

    path, _ = one_rank
    with ckptfs.open(path) as ck:
        meta = tensor_metadata(ck.tensor(("grid", "__gathered__")))
        assert meta["chunks"] == [{"offsets": [r, c], "sizes": [2, 3], "tensor": ["grid", "__state__", 0, n, "tensor"]}
                                  for n, (r, c) in enumerate([(0, 0), (0, 3), (2, 0), (2, 3)])]
        shards = [ck.extents(shard.state[1]["tensor"]) for shard in ck.root["grid"].state[0]]
        assert meta["source_ranges"] == [[e[0].offset, e[0].offset + e[0].length] for e in shards]


def test_a_gathered_tensor_is_not_cached(one_rank: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """The cache has no column for a chunk that is a tensor of the same file: such a parse is not kept."""
    path, _ = one_rank
    source = open_source(path)
    try:
        parsed = open_parsed(source, ckptfs.Limits())
        ckptfs.Checkpoint(source, parsed)
        with pytest.raises(NotCacheable, match="a ShardedTensor gathered from its shards"):
            encode_parsed(parsed, source)
    finally:
        source.close()
