"""torch.save of ``torch.distributed._shard`` ShardedTensors, one process per rank over gloo on 127.0.0.1.

``python sharded_tensor_writer.py OUT PORT RANK WORLD`` writes ``OUT/rank<RANK>.pt``: a state dict of
ShardedTensors (``rows``: float32 7×4 cut along dimension 0; ``cols``: bfloat16 5×6 along dimension 1; ``grid``:
int64 4×6 as a 2×2 grid of blocks; ``uneven``: float64 3×5, more placements than rows, so one shard is empty) and
a plain tensor ``w``. Every shard is placed round-robin on the ranks. With one rank, ``OUT/gathered.pt`` holds
each ShardedTensor gathered by torch (``ShardedTensor.gather``): the bytes ckptfs must show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from remote_servers import free_port

warnings.simplefilter("ignore")


def main(out: str, port: str, rank: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec

    places = [f"rank:{n % world}/cpu" for n in range(4)]
    torch.manual_seed(0)
    grid = EnumerableShardingSpec([ShardMetadata([r, c], [2, 3], places[2 * (r // 2) + c // 3])
                                   for r in (0, 2) for c in (0, 3)])
    state = {
        "rows": sharded_tensor.rand(ChunkShardingSpec(dim=0, placements=places[:3]), 7, 4),
        "cols": sharded_tensor.rand(ChunkShardingSpec(dim=1, placements=places[:2]), 5, 6, dtype=torch.bfloat16),
        "grid": sharded_tensor.zeros(grid, 4, 6, dtype=torch.int64),
        "uneven": sharded_tensor.rand(ChunkShardingSpec(dim=0, placements=places), 3, 5, dtype=torch.float64),
        "w": torch.arange(3.0),
    }
    for shard in state["grid"].local_shards():
        offsets = shard.metadata.shard_offsets
        shard.tensor.copy_(torch.arange(6, dtype=torch.int64).reshape(2, 3) + 100 * offsets[0] + 10 * offsets[1])
    torch.save(state, f"{out}/rank{rank}.pt")
    if world == 1:
        gathered = {}
        for name, value in state.items():
            if name != "w":
                gathered[name] = torch.empty(value.size(), dtype=value.dtype)
                value.gather(dst=0, out=gathered[name], dtype=value.dtype)  # else its buffers are float32
        torch.save(gathered, f"{out}/gathered.pt")
    dist.destroy_process_group()


def write_ranks(out: Path, world: int) -> None:
    """Runs the ``world`` ranks, each in a process of its own, writing into ``out``."""
    port = str(free_port())
    out.mkdir(parents=True, exist_ok=True)
    ranks = [subprocess.Popen([sys.executable, __file__, str(out), port, str(rank), str(world)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for rank in range(world)]
    for rank in ranks:
        output, _ = rank.communicate(timeout=180)
        assert rank.returncode == 0, output.decode(errors="replace")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
