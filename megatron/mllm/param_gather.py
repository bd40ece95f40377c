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

* right after the optimizer step every bucket's all-gather is dispatched, in the forward's
  order (the first layers' buckets first), asynchronously: megatron-core's own
  ``overlap_param_gather_with_optimizer_step`` path, whose pre-hooks only wait for their bucket;
* a forward pre-hook waits for its bucket's gather when a module first runs (megatron-core's
  hook, unchanged), so the gathers of later buckets run beside the earlier layers' compute;
* before the next optimizer step (:meth:`OrderedParamGather.finish`), a checkpoint or the end of
  training (:meth:`OrderedParamGather.wait`), every gather no forward waited for (a module this
  rank did not run) is waited for.

Between the optimizer step and those waits a bucket's parameters are read only by the forward,
after its wait: nothing else of the step reads them.
"""

from __future__ import annotations

from megatron.core.distributed import DistributedDataParallel


class OrderedParamGather:
    """Dispatches every DP bucket's parameter all-gather after the optimizer step, in one
    order on every rank, and waits for those no forward waited for.

    Args:
        ddp: the model's megatron-core DDP wrapper, built with ``overlap_param_gather`` (which
            megatron-core allows only with the distributed optimizer).
    """

    def __init__(self, ddp: DistributedDataParallel):
        if not ddp.ddp_config.overlap_param_gather:
            raise ValueError("OrderedParamGather needs a DDP built with overlap_param_gather")
        # megatron-core's bucket groups run in the backward's order; the forward needs them in
        # reverse (its chain of next_param_gather_bucket_group runs the same way).
        groups = list(ddp.bucket_groups) + list(ddp.expert_parallel_bucket_groups)
        self._groups = groups[::-1]
        self._started = False
        self.waited_in_forward = 0
        """Buckets of the last step whose gather a forward waited for (the rest, at
        :meth:`finish`): how much of the gathering overlapped with compute."""
        # The pre-hooks now only wait for their bucket's gather, never dispatch the next one.
        ddp.overlap_param_gather_with_optimizer_step = True
        # The parameters are whole and equal on every rank at the start (initialised,
        # broadcast or loaded): nothing to gather before the first step. A bucket not marked
        # dispatched would be dispatched by the first pre-hook that reaches it, on that rank
        # alone.
        for group in self._groups:
            group.param_gather_dispatched = True

    @property
    def num_buckets(self) -> int:
        """How many bucket groups the parameters are gathered in."""
        return len(self._groups)

    def start(self) -> None:
        """Dispatch every bucket's all-gather, first layers first. Call right after the
        optimizer step, on every rank."""
        for group in self._groups:
            group.start_param_sync()
        self._started = True

    def finish(self) -> None:
        """The step's end, before the optimizer step: wait for every gather no forward
        waited for, and count those a forward did (:attr:`waited_in_forward`)."""
        self.waited_in_forward = self.wait()

    def wait(self) -> int:
        """Wait for every gather no forward has waited for; the parameters are then whole. Call
        before anything else that reads them (a checkpoint, the end of training).

        Returns:
            How many of the gathers started by :meth:`start` a forward had already waited for
            (0 when none was in flight).
        """
        waited_in_forward = 0
        for group in self._groups:
            # megatron-core's finish_grad_sync marks every bucket undispatched for its lazy
            # path, and its finish_param_sync would then dispatch a second gather; until
            # start() the parameters are whole, and no pre-hook may gather.
            group.param_gather_dispatched = True
            if group.param_gather_handle is None:
                waited_in_forward += 1
            else:
                group.finish_param_sync(skip_next_bucket_dispatch=True)
        started, self._started = self._started, False
        return waited_in_forward if started else 0
