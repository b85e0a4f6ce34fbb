"""Minimal multi-process support for ``accelerate launch`` / ``torchrun``.

Both launchers set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR``/``PORT``;
we initialise ``torch.distributed`` from them. Python objects (DataFrames) are gathered
over a separate gloo group so that the same code works with NCCL on GPUs and across
nodes without a shared filesystem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    group: Any = None  # gloo group for object collectives

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (a one-element list when not distributed)."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)


def dist_context() -> DistContext:
    """Initialise torch.distributed if launched with several processes; else single-process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    group = dist.new_group(backend="gloo")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, group=group)


def split_contiguous(n: int, world_size: int, rank: int) -> range:
    """The contiguous block of ``range(n)`` that ``rank`` owns (blocks differ by at most one)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))
