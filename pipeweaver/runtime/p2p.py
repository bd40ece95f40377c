# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Point-to-point transfers between the stages of one pipeline, one process group per direction.

The schedule IR's contract (``pipeweaver.checker``) is that a send never blocks its rank and
transfers between an ordered pair of ranks match in order. With one communicator per pipeline,
NCCL runs every p2p kernel of a rank on one stream, so a send waiting for its peer would hold
up that rank's later receives: exactly the blocking the contract rules out. Giving each ordered
pair ``(a, b)`` its own process group makes ``a -> b`` traffic independent of every other
direction (its own NCCL stream, or its own gloo pair), and FIFO within the direction is the
in-order matching the IR relies on. Receive buffers are allocated on the caller's device.

Every wait is bounded by the run's timeout (``--distributed-timeout-minutes``): the groups are
created with it and :meth:`PipelineP2P.wait` passes it to ``Work.wait``, so a peer that stops
answering (hung, stopped, swapped out) ends the wait with a :class:`TransferError` naming both
ends and the action, instead of blocking forever. On NCCL the explicit timeout makes the wait
block the host until the transfer completes, as gloo's waits always do.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist


class TransferError(Exception):
    """A send or receive that failed, or did not complete within the timeout; the message names
    this rank, the action waited on and the peer.

    Attributes:
        rank: this process's global rank.
        action: the schedule action waited on, in the IR's string form (``r1:L1B0``).
        peer_rank: the global rank at the other end.
    """

    def __init__(self, message: str, rank: int, action: str, peer_rank: int):
        super().__init__(message)
        self.rank = rank
        self.action = action
        self.peer_rank = peer_rank


class PipelineP2P:
    """isend/irecv between pipeline stages over per-direction process groups."""

    def __init__(self, pp_group: dist.ProcessGroup, timeout: timedelta):
        """Create the groups; collective over the whole world (every rank must call it).

        Args:
            pp_group: this rank's pipeline-parallel group (stages in rank order).
            timeout: the longest any transfer may take to complete.
        """
        self.timeout = timeout
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
                    group = dist.new_group([pipe[a], pipe[b]], timeout=timeout)
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

    def wait(self, work: dist.Work, action: str, peer_stage: int) -> None:
        """Wait for a transfer started by :meth:`isend` or :meth:`irecv`, at most the timeout.

        Args:
            work: the transfer.
            action: what it carries out, for the error (the schedule action's string form).
            peer_stage: the stage at the other end.

        Raises:
            TransferError: the transfer failed, or did not complete within the timeout.
        """
        start = time.monotonic()
        try:
            work.wait(timeout=self.timeout)
        except RuntimeError as e:  # gloo raises RuntimeError, NCCL DistBackendError (a subclass)
            rank, peer_rank = self.stage_ranks[self.stage], self.stage_ranks[peer_stage]
            reason = (str(e).strip() or type(e).__name__).splitlines()[0]
            raise TransferError(
                f"rank {rank} (pipeline stage {self.stage}) gave up waiting on '{action}' with "
                f"stage {peer_stage} (rank {peer_rank}) after {time.monotonic() - start:.1f} s "
                f"(timeout {self.timeout.total_seconds():g} s): {reason}",
                rank,
                action,
                peer_rank,
            ) from e
