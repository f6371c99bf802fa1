"""A real 2-rank ``dcp.save`` over gloo on 127.0.0.1 (run by test_dcp_gloo.py): ``python dcp_gloo_job.py OUT PORT``.

DTensors ``Shard(0)`` (uneven), ``Shard(1)`` and ``Replicate()``, a plain tensor that differs by rank (one rank's
copy is saved) and a nested non-tensor item.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, out: str, port: str) -> None:
    warnings.simplefilter("ignore")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    state = {
        "a": distribute_tensor(torch.arange(20, dtype=torch.float32).reshape(5, 4), mesh, [Shard(0)]),
        "b": distribute_tensor(torch.arange(12, dtype=torch.int32).reshape(3, 4), mesh, [Shard(1)]),
        "r": distribute_tensor(torch.ones(2), mesh, [Replicate()]),
        "plain": torch.full((2,), float(rank)),
        "extra": {"step": 3},
    }
    dcp.save(state, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1], sys.argv[2]), nprocs=2, join=True)
