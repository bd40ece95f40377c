# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Point-to-point transfers between the stages of one pipeline, one process group per direction.

The schedule IR's contract (``pipeweaver.checker``) is that a send never blocks its rank and
transfers between an ordered pair of ranks match in order. With one communicator per pipeline,
NCCL runs every p2p kernel of a rank on one stream, so a send waiting for its peer would hold
up that rank's later receives: exactly the blocking the contract rules out. Giving each ordered
pair ``(a, b)`` its own process group makes ``a -> b`` traffic independent of every other
direction (its own NCCL stream, or its own gloo pair), and FIFO within the direction is the
in-order matching the IR relies on. Receive buffers are allocated on the caller's device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class PipelineP2P:
    """isend/irecv between pipeline stages over per-direction process groups."""

    def __init__(self, pp_group: dist.ProcessGroup):
        """Create the groups; collective over the whole world (every rank must call it).

        Args:
            pp_group: this rank's pipeline-parallel group (stages in rank order).
        """
        self.stage_ranks = dist.get_process_group_ranks(pp_group)
        self.stage = self.stage_ranks.index(dist.get_rank())
        world = dist.get_world_size()
        pipelines: list = [None] * world
        dist.all_gather_object(pipelines, tuple(self.stage_ranks))
        self._groups: dict[tuple[int, int], dist.ProcessGroup] = {}
        # Every rank creates every group, in the same order: new_group is collective.
        for pipe in sorted(set(pipelines)):
            for a in range(len(pipe)):
                for b in range(len(pipe)):
                    if a == b:
                        continue
                    group = dist.new_group([pipe[a], pipe[b]])
                    if pipe == tuple(self.stage_ranks):
                        self._groups[(a, b)] = group

    @property
    def num_stages(self) -> int:
        """Stages of this pipeline."""
        return len(self.stage_ranks)

    def isend(self, tensor: torch.Tensor, to_stage: int) -> dist.Work:
        """Start sending ``tensor`` to another stage; keep the tensor alive until it completes."""
        group = self._groups[(self.stage, to_stage)]
        return dist.isend(tensor.contiguous(), dst=self.stage_ranks[to_stage], group=group)

    def irecv(self, tensor: torch.Tensor, from_stage: int) -> dist.Work:
        """Start receiving into ``tensor`` from another stage."""
        group = self._groups[(from_stage, self.stage)]
        return dist.irecv(tensor, src=self.stage_ranks[from_stage], group=group)
