# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's ``--overlap-param-gather`` for steps whose DP ranks run different modules.

With the distributed optimizer each DP rank updates only its shard of every bucket, and the
updated parameters are all-gathered before they are used again. megatron-core 0.19.2 overlaps
that all-gather with the next forward lazily: the forward pre-hook of the first module that
uses a bucket dispatches its gather if nobody has, waits for it, and dispatches the next
bucket's in the chain. So the order of the collectives follows the order in which a rank's
forward first touches each bucket. In a multimodal batch the ranks differ: a rank whose batch
holds no image runs no vision forward, so it dispatches the buckets in another order (and never
the vision ones), and the ranks' gathers no longer match.

:class:`OrderedParamGather` takes the dispatch from the forward to the step, which is the same
on every rank:

* the step dispatches every bucket's all-gather, asynchronously and in the forward's order (the
  bucket holding the parameter the forward uses first goes first), just before its first
  forward (``TrainingStep.before_forward``: after the loader's metadata gather and the balanced
  steps' input exchange, which run on OrchWeave's own DP group and on a 2-core host ran slower
  beside the gathers); megatron-core's pre-hooks then only wait for their bucket (its own
  ``overlap_param_gather_with_optimizer_step`` path);
* a forward pre-hook waits for its bucket's gather when a module first runs (megatron-core's
  hook, unchanged), so the gathers of later buckets run beside the earlier layers' compute;
* the gathers still in flight when the step's first gradient reduction is about to start (a
  module this rank's forward did not run) are waited for there
  (:meth:`OrderedParamGather.drain`), and before the optimizer step every one
  (:meth:`OrderedParamGather.finish`); a checkpoint or the end of training gathers what the
  last optimizer step updated at once (:meth:`OrderedParamGather.sync`).

Between the optimizer step and the next step's gathers the model's parameters are stale outside
each rank's shard; only the forward reads them, after its bucket's wait.

On gloo each bucket's gather is dispatched as a collective of its own
(:func:`start_bucket_gathers`), not as megatron-core's one coalesced collective per bucket group:
torch 2.14's gloo all-gather of a coalesced group (``AsyncAllgatherCoalescedWork``) corrupts the
heap when several are in flight in one process group, which is what dispatching every bucket at
once does. A two-rank stress of megatron-core's pattern (1,000 steps of 32 gathers in flight at
once on a loaded 2-core host) failed 20 of 27 launches with coalesced gathers, with one gloo
device per process or per group (the first read: SIGSEGV in the work's destructor, and
``malloc(): unaligned tcache chunk detected`` in the same process; one launch hung), and none of 16
with one all-gather per bucket on the same buffers (2026-12-07).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from megatron.core.distributed import DistributedDataParallel
from megatron.core.distributed.param_and_grad_buffer import shard_buffer
from megatron.mllm.grad_overlap import first_use


class BucketGathers:
    """The handle of one bucket group's gathers dispatched one per bucket: megatron-core waits
    for it as for its coalesced handle (``wait()``)."""

    def __init__(self, works: list):
        self._works = works

    def wait(self) -> None:
        """Wait for every bucket's gather."""
        for work in self._works:
            work.wait()
        self._works = []


def gathers_per_bucket(group) -> bool:
    """Whether the group's gathers must be dispatched one per bucket: the distributed
    optimizer's plain parameter buffers (no FP8 or MXFP8 post-processing) gathered over gloo."""
    ddp_config = group.ddp_config
    if not ddp_config.use_distributed_optimizer or ddp_config.reuse_grad_buf_for_mxfp8_param_ag:
        return False
    if not group.buckets or any(bucket.param_data is None for bucket in group.buckets):
        return False
    return dist.get_backend(group.intra_distributed_optimizer_instance_group) == "gloo"


def start_bucket_gathers(group) -> None:
    """Dispatch the all-gather of each of ``group``'s buckets, asynchronously, as a collective of
    its own: the same buffers, shards and process group as megatron-core 0.19.2's
    ``start_param_sync`` (each rank's equal slice of the bucket's parameter buffer, gathered in
    place), whose bookkeeping it sets the same way."""
    assert group.param_gather_handle is None, "a bucket group's gather is already in flight"
    pg = group.intra_distributed_optimizer_instance_group
    size = group.intra_distributed_optimizer_instance_size
    rank = group.intra_distributed_optimizer_instance_rank
    works = []
    for bucket in group.buckets:
        mine = shard_buffer(bucket.param_data, size)[rank]  # megatron-core's own cut
        works.append(dist.all_gather_single(bucket.param_data, mine, group=pg, async_op=True))
    group.param_gather_handle = BucketGathers(works)
    group.param_gather_dispatched = True


class OrderedParamGather:
    """Dispatches every DP bucket's parameter all-gather at one point of the step, in one order
    on every rank, and waits for those no forward waited for.

    Args:
        ddp: the model's megatron-core DDP wrapper, built with ``overlap_param_gather`` (which
            megatron-core allows only with the distributed optimizer).
        forward_order: every parameter of the model in the order its forward first uses them
            (the same on every rank of the DP group); None: megatron-core's bucket order in
            reverse.
    """

    def __init__(
        self,
        ddp: DistributedDataParallel,
        forward_order: Sequence[torch.nn.Parameter] | None = None,
    ):
        if not ddp.ddp_config.overlap_param_gather:
            raise ValueError("OrderedParamGather needs a DDP built with overlap_param_gather")
        # megatron-core's bucket groups run in the backward's order, its chain of gathers in
        # reverse: the parameters' registration order, which puts a chunk's input layer (the
        # LLM's embeddings) after its layers, so its first forward would wait for them all.
        groups = list(ddp.bucket_groups) + list(ddp.expert_parallel_bucket_groups)
        self._groups = groups[::-1]
        if forward_order is not None:
            first = first_use(groups, forward_order)  # the bucket the forward needs first, first
            self._groups = [groups[i] for i in sorted(first, key=lambda i: first[i])]
        self._whole = True
        """The parameters are whole and equal on every rank: initialised, broadcast or loaded,
        or gathered since the last optimizer step; nothing to gather."""
        self._started = False
        self._drained = 0  # gathers of this step waited for by drain(), not by a forward
        self.waited_in_forward = 0
        """Buckets of the last step whose gather a forward waited for (the rest, at
        :meth:`finish`): how much of the gathering overlapped with compute."""
        # The pre-hooks now only wait for their bucket's gather, never dispatch the next one.
        ddp.overlap_param_gather_with_optimizer_step = True
        self._mark_dispatched()
        self._per_bucket = [gathers_per_bucket(g) for g in self._groups]

    @property
    def num_buckets(self) -> int:
        """How many bucket groups the parameters are gathered in."""
        return len(self._groups)

    def _mark_dispatched(self) -> None:
        # megatron-core's finish_grad_sync marks every bucket undispatched for its lazy path; a
        # pre-hook would then dispatch its bucket's gather on this rank alone, and
        # finish_param_sync a second one.
        for group in self._groups:
            group.param_gather_dispatched = True

    def start(self) -> None:
        """Dispatch every bucket's all-gather in the forward's order, unless the parameters
        are whole. The step calls it before its first forward, on every rank."""
        if self._whole:
            return
        for group, per_bucket in zip(self._groups, self._per_bucket):
            if per_bucket:
                start_bucket_gathers(group)  # gloo (the module docstring says why)
            else:
                group.start_param_sync()
        self._started, self._whole = True, True

    def drain(self) -> None:
        """Wait for the gathers still in flight. Called before the step's first gradient
        reduction starts on the same process group, so that a gather and a reduce-scatter of
        the group never run at once: with them at once, the balanced step once hung in gloo's
        all-gather and once aborted on a corrupted heap here (2026-12-07; the README says what
        is not proven)."""
        for group in self._groups:
            if group.param_gather_handle is not None:
                self._drained += 1
                group.finish_param_sync(skip_next_bucket_dispatch=True)

    def finish(self) -> None:
        """Before the optimizer step: wait for every gather no forward waited for, and count
        those a forward did (:attr:`waited_in_forward`). The parameters are stale after it."""
        self._mark_dispatched()  # finalize_model_grads has just reset them
        self.drain()
        waited_in_forward = len(self._groups) - self._drained
        self.waited_in_forward = waited_in_forward if self._started else 0
        self._started, self._whole, self._drained = False, False, 0

    def sync(self) -> None:
        """Gather the parameters now, and wait: before a checkpoint or anything else that
        reads them outside a forward. The next step then has nothing to gather."""
        self.start()
        self.drain()
        self._started, self._drained = False, 0  # waited for here, not by a forward
