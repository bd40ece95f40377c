# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where a step's data-parallel collectives run: the whole DP group, or shard groups and the
copies across them (``--num-distributed-optimizer-instances``).

What megatron-core 0.19 does with ``N`` instances (``parallel_state``,
``param_and_grad_buffer.py``, Megatron-FSDP's ``param_and_grad_buffer.py``;
docs/architecture.md [5]):

* the DP ranks of a stage form ``N`` groups of ``S = DP / N`` consecutive DP ranks (the
  *intra-instance* group, Megatron-FSDP's DP-Shard); the ranks at one position of every group
  form the *inter-instance* group (DP-Outer);
* the distributed optimizer shards its states over the ``S`` ranks of a group, and every
  group keeps a copy; Megatron-FSDP (HSDP, its outer strategy ``no_shard``) shards gradients
  and weights over them too;
* gradients are reduce-scattered within the group, then each shard is all-reduced across the
  groups (the distributed optimizer: per bucket, the all-reduce after the reduce-scatter;
  Megatron-FSDP: the reduce-scatter after every backward, the all-reduce only in the last
  microbatch's); weights are all-gathered within the group.

So a ring spans ``S`` ranks, not ``DP``: at DP 320 with 40 copies (``S = 8``) a collective pays
7 steps of NIC latency instead of 319, for the price of one all-reduce of ``1 / S`` of the
gradients across the copies and ``N`` times the sharded states. One instance is the whole DP
group, as without the flag.

Global rank of (TP rank ``t``, DP rank ``d``, pipeline stage ``r``) is ``t + TP (d + DP r)``,
so a group of consecutive DP ranks sits in one node when its ``TP x S`` ranks fit in one, and
the copies of one shard do when the whole DP group does.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeweaver.semu.model import ModelConfigError
from pipeweaver.semu.timing import CommModel


@dataclass(frozen=True)
class DataParallelGroups:
    """The DP collectives of one layout (built by :meth:`for_layout`)."""

    comm: CommModel
    """The cluster's collective costs."""

    data_parallel: int
    """DP size."""

    instances: int
    """Copies of the sharded state (``--num-distributed-optimizer-instances``; 1: none)."""

    shard_intra: bool
    """A shard group sits in one node (its rings ride NVLink)."""

    outer_intra: bool
    """The copies of one shard sit in one node."""

    @classmethod
    def for_layout(
        cls,
        comm: CommModel,
        data_parallel: int,
        instances: int,
        tp: int,
        devices_per_node: int,
        sharded: bool,
    ) -> "DataParallelGroups":
        """The groups of a stage's ``data_parallel`` ranks of ``tp`` devices each; ``sharded``:
        the optimizer states are sharded (the distributed optimizer, or Megatron-FSDP).

        Raises:
            ModelConfigError: ``instances`` does not divide ``data_parallel`` (Megatron asserts
                it), or copies an optimizer that is not sharded; the message names the flag.
        """
        if instances > 1 and not sharded:
            raise ModelConfigError(
                f"--num-distributed-optimizer-instances {instances} copies a sharded optimizer: "
                "add --use-distributed-optimizer (or Megatron-FSDP's sharding)"
            )
        if instances < 1 or data_parallel % instances:
            raise ModelConfigError(
                f"--num-distributed-optimizer-instances {instances} must divide the "
                f"data-parallel size {data_parallel}"
            )
        shard = data_parallel // instances
        intra = tp * shard <= devices_per_node  # as the whole DP group's rule without the flag
        return cls(comm, data_parallel, instances, intra, tp * data_parallel <= devices_per_node)

    @property
    def shard(self) -> int:
        """Ranks a sharded state is split over: ``DP / instances``."""
        return self.data_parallel // self.instances

    def gather_s(self, nbytes: float) -> float:
        """Seconds of a ring all-gather of a whole tensor of ``nbytes`` within a shard group."""
        return self.comm.all_gather(nbytes, self.shard, self.shard_intra)

    def reduce_scatter_s(self, nbytes: float) -> float:
        """Seconds of a ring reduce-scatter of ``nbytes`` of gradients within a shard group."""
        return self.comm.reduce_scatter(nbytes, self.shard, self.shard_intra)

    def outer_all_reduce_s(self, nbytes: float) -> float:
        """Seconds of the all-reduce across the copies of the shard of a ``nbytes`` tensor (0
        with one instance)."""
        return self.comm.all_reduce(nbytes / self.shard, self.instances, self.outer_intra)

    def all_reduce_s(self, nbytes: float) -> float:
        """Seconds of a ring all-reduce of ``nbytes`` over the whole DP group (gradients that
        no optimizer shards, the loss)."""
        return self.comm.all_reduce(nbytes, self.data_parallel, self.outer_intra)

    def reduce_s(self, nbytes: float) -> float:
        """Seconds of the sharded reduction of ``nbytes`` of gradients: the reduce-scatter
        within the group, then the shard's all-reduce across the copies, one after the
        other."""
        return self.reduce_scatter_s(nbytes) + self.outer_all_reduce_s(nbytes)
