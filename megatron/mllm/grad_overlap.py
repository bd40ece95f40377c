# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's ``--overlap-grad-reduce`` for steps whose DP ranks run different modules.

megatron-core's DDP starts a bucket's reduction (all-reduce, or reduce-scatter with the
distributed optimizer) when every parameter in it has had its gradient in the last microbatch,
counted against the counts it recorded in the first batch. In a multimodal batch that breaks
twice: a rank whose batch holds no image computes no vision gradient, so the vision buckets
never start (megatron-core asserts at the end of the step); and ranks that complete their
buckets in different orders issue their collectives in different orders, which no backend
matches.

:class:`OrderedGradReduce` takes the decision from the counts to the step, which knows when a
parameter's gradient is final:

* at the parameter's backward hook in a step's last microbatch, outside ``no_sync``
  (megatron-core's hook, which calls the bucket group's ``register_grad_ready``; one backward
  pass accumulates each parameter once): Megatron's steps, and the per-phase balanced step
  (``megatron.mllm.steps.phase_balanced``), whose last LLM microbatch and encoders' backward
  run outside ``no_sync``;
* where a step says so through ``config.grad_sync_func`` (megatron-core's hook for "these
  parameters' gradients are done", which its 1F1B schedules call): the balanced step after its
  LLM loop and after each encoder's backward, for what those did not reach; the pipeline
  runtime after each chunk's last backward on its rank;
* every parameter at ``finalize_model_grads``: what no hook or step declared (a module this
  rank did not run) is final there.

Buckets are reduced strictly in one order, each as soon as it and every bucket before it are
final. So every rank issues the same collectives in the same order whatever its batch holds;
only when differs. ``finalize_model_grads`` then waits for them (megatron-core's
``finish_grad_sync``). The order is the one in which a backward completes the buckets: by the
parameter each bucket's forward uses first, latest first (``forward_order``, from the model:
``PlacedModel.forward_parameters``). megatron-core's own bucket order follows the parameters'
registration in reverse, which puts a chunk's input layer (the LLM's embeddings, an encoder's
input embedding; registered after the layers) in the chunk's first buckets: in that order the
whole chunk's buckets would wait for its last gradient.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch

from megatron.core.distributed import DistributedDataParallel


def first_use(groups: Sequence, forward_order: Sequence[torch.nn.Parameter]) -> dict[int, int]:
    """Per bucket group (by index), the position in ``forward_order`` of its parameter that the
    forward uses first.

    Raises:
        ValueError: a bucketed parameter is not in ``forward_order``.
    """
    position = {p: i for i, p in enumerate(forward_order)}
    missing = [p for g in groups for p in g.params if p not in position]
    if missing:
        raise ValueError(f"{len(missing)} bucketed parameters are not in forward_order")
    return {i: min(position[p] for p in g.params) for i, g in enumerate(groups)}


class OrderedGradReduce:
    """Starts each DP gradient bucket's reduction once it, and every bucket before it, is final.

    Args:
        ddp: the model's megatron-core DDP wrapper, built with ``overlap_grad_reduce``.
        forward_order: every parameter of the model in the order its forward first uses them
            (the same on every rank of the DP group); None: megatron-core's bucket order.
        before_first: called once per step before its first reduction starts (the parameter
            gathers still in flight are waited for there:
            :meth:`megatron.mllm.param_gather.OrderedParamGather.drain`).
    """

    def __init__(
        self,
        ddp: DistributedDataParallel,
        forward_order: Sequence[torch.nn.Parameter] | None = None,
        before_first: Callable[[], None] | None = None,
    ):
        if not ddp.ddp_config.overlap_grad_reduce:
            raise ValueError("OrderedGradReduce needs a DDP built with overlap_grad_reduce")
        self._groups = list(ddp.bucket_groups) + list(ddp.expert_parallel_bucket_groups)
        if forward_order is not None:
            # A bucket is final once the backward has reached the parameter of it that the
            # forward used first: the latest such parameter goes first (stable: megatron-core's
            # order among equals).
            first = first_use(self._groups, forward_order)
            self._groups = [self._groups[i] for i in sorted(first, key=lambda i: -first[i])]
        self._before_first = before_first
        self._group_of = {p: i for i, g in enumerate(self._groups) for p in g.params}
        self._pending: list[set] = []
        self._next = 0
        self.started_early = 0
        """Buckets of the last finished step that started before ``finalize_model_grads``,
        i.e. overlapped with the backward."""
        self._reset()
        for group in self._groups:
            group.register_grad_ready = self._make_hook(group)
            # megatron-core's first batch counts the hooks and starts every bucket in
            # finish_grad_sync; here the buckets have always started by then, and a second start
            # (its synchronous path with several optimizer instances has no handle to detect it)
            # would reduce them twice.
            group.is_first_batch = False

    @property
    def num_buckets(self) -> int:
        """How many bucket groups the model's gradients are reduced in."""
        return len(self._groups)

    def _reset(self) -> None:
        self._pending = [set(g.params) for g in self._groups]
        self._next = 0

    def _make_hook(self, group) -> Callable:
        def register_grad_ready(param: torch.nn.Parameter, force_all_reduce: bool = False):
            # megatron-core's backward hook calls this in every microbatch; inside no_sync
            # (every microbatch but the last) the gradient is not final yet.
            if group.is_last_microbatch:
                self.mark_final([param])

        return register_grad_ready

    def mark_final(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Declare these parameters' gradients final for this step, and start every bucket
        that is now complete and next in order. Parameters outside DDP's buffers (frozen ones)
        are ignored."""
        for p in params:
            i = self._group_of.get(p)
            if i is not None:
                self._pending[i].discard(p)
        while self._next < len(self._groups) and not self._pending[self._next]:
            if self._next == 0 and self._before_first is not None:
                self._before_first()
            self._groups[self._next].start_grad_sync()
            self._next += 1

    def finish(self) -> None:
        """Every gradient is final: start the buckets still waiting, in order, and get ready
        for the next step (``finalize_model_grads`` waits for them)."""
        self.started_early = self._next
        for i in range(self._next, len(self._groups)):
            self._pending[i].clear()
        self.mark_final(())
        self._reset()


def install(
    ddp: DistributedDataParallel,
    config,
    forward_order: Sequence[torch.nn.Parameter] | None = None,
    before_first: Callable[[], None] | None = None,
) -> OrderedGradReduce:
    """Route megatron-core's overlapped reduction of ``ddp`` through an
    :class:`OrderedGradReduce`: its hooks, ``config.grad_sync_func`` (the steps' "these
    gradients are final") and ``config.finalize_model_grads_func`` (everything is final, then
    megatron-core's finalization, which waits for the reductions).

    Args:
        ddp: the model's DDP wrapper, built with ``overlap_grad_reduce``.
        config: the model's config, whose ``finalize_model_grads_func`` is already set.
        forward_order, before_first: see :class:`OrderedGradReduce`.
    """
    ordered = OrderedGradReduce(ddp, forward_order, before_first)
    finalize = config.finalize_model_grads_func

    def finalize_model_grads(*args, **kwargs):
        ordered.finish()
        return finalize(*args, **kwargs)

    config.grad_sync_func = ordered.mark_final
    config.finalize_model_grads_func = finalize_model_grads
    return ordered
