"""torch.save of a ``torch.distributed._shard`` ShardedTensor (the torch 1.13-era sharding API, still in torch 2.13):
a wrapper subclass whose state lists the rank's local shards. Each shard's tensor appears, with its
``ShardMetadata`` (offsets, sizes, placement) beside it, holding torch's bytes; the wrapper itself has no data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import ckptfs
from ckptfs.pickle.values import PickledObject

WRITER = """
import os, sys, warnings
import torch
import torch.distributed as dist
warnings.simplefilter("ignore")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:0/cpu"])
st = sharded_tensor.rand(spec, 5, 3)
torch.save({"st": st, "w": torch.arange(3.0)}, sys.argv[1])
torch.save([s.tensor for s in st.local_shards()], sys.argv[1] + ".shards")
dist.destroy_process_group()
"""


def test_local_shards_appear_with_their_bytes(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "sharded.pt"
    subprocess.run([sys.executable, "-c", WRITER, str(path), str(port)], check=True, timeout=120,
                   capture_output=True)
    shards = torch.load(str(path) + ".shards")
    with ckptfs.open(path) as ck:
        wrapper = ck.root["st"]
        assert isinstance(wrapper, PickledObject)
        assert wrapper.callable.qualname == "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
        local = wrapper.state[0]
        assert len(local) == len(shards) == 2
        for shard, tensor in zip(local, shards):
            assert ck.read(shard.state[1]["tensor"]) == tensor.numpy().tobytes()
            assert shard.state[1]["metadata"].state[1]["shard_sizes"] == list(tensor.shape)
        assert [t.path[:4] for t in ck.tensors][:2] == [("st", "__state__", 0, 0), ("st", "__state__", 0, 1)]
