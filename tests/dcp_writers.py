"""Writes torch.distributed.checkpoint directories in one process, as N ranks would (spec more-formats.md A.7).

``simulate_ranks`` drives the same planner / storage-writer protocol ``dcp.save``
runs, sequentially for every simulated rank, with a planner that cuts chosen
tensors into boxes (``torch.chunk`` style along one dimension) and gives box i
to rank ``i % world``: the layout a real N-rank job writes.
"""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, StorageMeta, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

Sharding = dict[str, tuple[int, int]]
"""FQN → (dimension cut, number of boxes)."""


def chunk_boxes(shape: torch.Size, dim: int, parts: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    step = -(-shape[dim] // parts)
    boxes = []
    for start in range(0, shape[dim], step):
        offsets, sizes = [0] * len(shape), list(shape)
        offsets[dim], sizes[dim] = start, min(step, shape[dim] - start)
        boxes.append((tuple(offsets), tuple(sizes)))
    return boxes


class ShardingPlanner(DefaultSavePlanner):
    """Writes the ``sharded`` tensors as boxes owned round-robin by ranks; other items on rank 0 only, or on every
    rank (what ``use_collectives=False`` ranks do)."""

    def __init__(self, sharded: Sharding, rank: int = 0, world: int = 1, plain_everywhere: bool = False) -> None:
        super().__init__()
        self.sharded, self.rank, self.world, self.plain_everywhere = sharded, rank, world, plain_everywhere

    def create_local_plan(self) -> Any:
        plan = super().create_local_plan()
        items = []
        for item in plan.items:
            if item.index.fqn not in self.sharded:
                if self.rank == 0 or self.plain_everywhere:
                    items.append(item)
                continue
            tensor = self.state_dict[item.index.fqn]
            dim, parts = self.sharded[item.index.fqn]
            for n, (offsets, sizes) in enumerate(chunk_boxes(tensor.shape, dim, parts)):
                if n % self.world == self.rank:
                    items.append(WriteItem(
                        index=MetadataIndex(item.index.fqn, offsets), type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                                                    properties=TensorProperties.create_from_tensor(tensor),
                                                    size=tensor.size())))
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> Any:
        if write_item.type == WriteItemType.SHARD:
            tensor = self.state_dict[write_item.index.fqn]
            chunk = write_item.tensor_data.chunk
            for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
                tensor = tensor.narrow(dim, offset, size)
            return tensor
        return super().resolve_data(write_item)


class PinnedWriter(FileSystemWriter):
    """A ``FileSystemWriter`` whose ``.metadata`` is the same bytes on every run: the ``storage_meta`` it records
    holds fixed ids, not the directory's path and a random uuid (mutants of it then differ from run to run)."""

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id="/checkpoint", save_id="00000000-0000-4000-8000-000000000024")


def simulate_ranks(state_dict: dict[str, Any], sharded: Sharding, path: Path, world: int, pinned: bool = False,
                   **writer_options: Any) -> None:
    """What ``dcp.save`` does on ``world`` ranks with collectives: one ``.metadata``, ``__<rank>_0.distcp`` each
    (``pinned``: by ``PinnedWriter``s)."""
    shutil.rmtree(path, ignore_errors=True)
    writers = [(PinnedWriter if pinned else FileSystemWriter)(path, **writer_options) for _ in range(world)]
    planners = [ShardingPlanner(sharded, rank, world) for rank in range(world)]
    local = []
    for rank in range(world):
        planners[rank].set_up_planner(state_dict, storage_meta=writers[rank].storage_meta(), is_coordinator=rank == 0)
        writers[rank].set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local.append(writers[rank].prepare_local_plan(planners[rank].create_local_plan()))
    global_plans, metadata = planners[0].create_global_plan(local)
    global_plans = writers[0].prepare_global_plan(global_plans)
    results = [writers[rank].write_data(planners[rank].finish_plan(global_plans[rank]), planners[rank]).wait()
               for rank in range(world)]
    writers[0].finish(metadata=metadata, results=results)


def simulate_ranks_without_collectives(state_dict: dict[str, Any], sharded: Sharding, path: Path,
                                       world: int) -> None:
    """``dcp.save(..., use_collectives=False)`` on ``world`` ranks: ``__<rank>.metadata`` each, no ``.metadata``;
    every rank writes its own copy of the unsharded items."""
    shutil.rmtree(path, ignore_errors=True)
    for rank in range(world):
        writer = FileSystemWriter(path, overwrite=True)
        planner = ShardingPlanner(sharded, rank, world, plain_everywhere=True)
        planner.set_up_planner(state_dict, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected an existing checkpoint": the other ranks' files
            plans, metadata = planner.create_global_plan([writer.prepare_local_plan(planner.create_local_plan())])
        plans = writer.prepare_global_plan(plans)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected an existing checkpoint": the other ranks' files
            result = writer.write_data(planner.finish_plan(plans[0]), planner).wait()
        writer.finish(metadata=metadata, results=[result])


def save(state_dict: dict[str, Any], path: Path, **writer_options: Any) -> None:
    """A plain one-process ``dcp.save``."""
    shutil.rmtree(path, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state_dict, storage_writer=FileSystemWriter(path, **writer_options), no_dist=True)


def torch_view(path: Path, out: Path) -> dict[str, Any]:
    """torch's own reading of the directory: ``dcp_to_torch_save`` (full tensors, the nested dict from
    ``planner_data``), loaded back."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=False)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's logical bytes in C order, for any dtype."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
