# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrderedParamGather dispatches every bucket's parameter all-gather where the step's forward
starts, in the forward's order, whatever modules a rank's forward runs; megatron-core's forward
pre-hook then only waits; the step waits for the rest (megatron.mllm.param_gather).

The bucket groups here run megatron-core 0.19.2's own ``finish_param_sync`` (what its forward
pre-hook calls) and its dispatch bookkeeping, over a log instead of a collective."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup
from megatron.mllm.param_gather import OrderedParamGather

# megatron-core warns when a pre-hook finds the next bucket's gather already dispatched (so a
# hook still chaining dispatches next to ours would show here).
pytestmark = pytest.mark.filterwarnings("error")


class FakeHandle:
    def __init__(self, group):
        self.group = group

    def wait(self):
        self.group.log.append(("wait", self.group.index))


class FakeBucketGroup:
    """A bucket group: megatron-core's dispatch flags and chain, a log of gathers."""

    finish_param_sync = _ParamAndGradBucketGroup.finish_param_sync

    def __init__(self, index: int, log: list):
        self.index, self.log = index, log
        self.ddp_config = SimpleNamespace(
            overlap_param_gather=True,
            use_distributed_optimizer=True,
            reuse_grad_buf_for_mxfp8_param_ag=False,
        )
        self.buckets = []  # no buffers: megatron-core's own dispatch (start_param_sync)
        self.param_gather_dispatched = False
        self.param_gather_handle = None
        self.next_param_gather_bucket_group = None

    def start_param_sync(self, force_sync: bool = False):
        # megatron-core's own check: one gather in flight per bucket.
        assert self.param_gather_handle is None, f"bucket {self.index} gathered twice"
        self.log.append(("start", self.index))
        self.param_gather_handle = FakeHandle(self)
        self.param_gather_dispatched = True

    def _post_param_sync(self):
        pass

    def finish_grad_sync(self):
        self.param_gather_dispatched = False  # what megatron-core's finish_grad_sync does


def fake_ddp(n: int, overlap: bool = True):
    log: list = []
    groups = [FakeBucketGroup(i, log) for i in range(n)]
    # megatron-core chains the gathers from the last bucket (the first layers) backwards.
    for i in range(1, n):
        groups[n - i].next_param_gather_bucket_group = groups[n - i - 1]
    ddp = SimpleNamespace(
        ddp_config=SimpleNamespace(overlap_param_gather=overlap),
        bucket_groups=groups,
        expert_parallel_bucket_groups=[],
        overlap_param_gather_with_optimizer_step=False,
    )
    return ddp, groups, log


def pre_hook(ddp, group):
    """megatron-core's forward pre-hook for a module whose parameters are in ``group``."""
    group.finish_param_sync(skip_next_bucket_dispatch=ddp.overlap_param_gather_with_optimizer_step)


def test_nothing_is_gathered_before_the_first_optimizer_step():
    ddp, groups, log = fake_ddp(3)
    gather = OrderedParamGather(ddp)
    gather.start()  # the first step: the parameters are whole
    for g in groups:  # megatron-core's lazy path would dispatch on this rank alone here
        pre_hook(ddp, g)
    gather.finish()
    assert log == [] and gather.waited_in_forward == 0


@pytest.mark.parametrize("used", [p for k in range(4) for p in itertools.permutations(range(3), k)])
def test_every_forward_gives_the_same_collectives(used):
    # A rank whose forward runs the modules of `used` (in that order; none of the others, as a
    # rank without images) issues the same gathers in the same order as any other rank.
    ddp, groups, log = fake_ddp(3)
    gather = OrderedParamGather(ddp)
    gather.finish()  # the first optimizer step: the parameters are stale now
    for g in groups:
        g.finish_grad_sync()  # the next step's gradients were reduced: megatron-core resets
    gather.start()  # the next step, before its first forward
    assert log == [("start", 2), ("start", 1), ("start", 0)]  # the first layers first
    for i in used:
        pre_hook(ddp, groups[i])
    for g in groups:
        g.finish_grad_sync()
    gather.finish()  # before the optimizer step
    starts = [e for e in log if e[0] == "start"]
    waits = [e[1] for e in log if e[0] == "wait"]
    assert starts == [("start", 2), ("start", 1), ("start", 0)]
    assert sorted(waits) == [0, 1, 2] and waits[: len(used)] == list(used)
    assert gather.waited_in_forward == len(used)
    # The next step dispatches each bucket once more; nothing was left in flight.
    gather.start()
    assert [e for e in log if e[0] == "start"][3:] == [("start", 2), ("start", 1), ("start", 0)]


def test_sync_gathers_at_once_and_the_next_step_has_nothing_to_gather():
    ddp, groups, log = fake_ddp(2)
    gather = OrderedParamGather(ddp)
    gather.finish()
    gather.sync()  # a checkpoint after the optimizer step
    assert log == [("start", 1), ("start", 0), ("wait", 1), ("wait", 0)]
    assert all(g.param_gather_handle is None for g in groups)
    gather.start()  # the next step: the parameters are whole already
    pre_hook(ddp, groups[0])
    gather.finish()
    assert len(log) == 4 and gather.waited_in_forward == 0


def test_a_ddp_without_overlap_param_gather_is_refused():
    ddp, _, _ = fake_ddp(1, overlap=False)
    with pytest.raises(ValueError, match="overlap_param_gather"):
        OrderedParamGather(ddp)


def test_the_bucket_the_forward_needs_first_is_gathered_first():
    # megatron-core's reverse order would gather bucket 2 first; the forward uses bucket 1's
    # parameter (an input layer registered after the layers) first.
    ddp, groups, log = fake_ddp(3)
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    for g, p in zip(groups, params):
        g.params = [p]
    gather = OrderedParamGather(ddp, forward_order=[params[1], params[2], params[0]])
    gather.finish()
    gather.start()
    assert log == [("start", 1), ("start", 2), ("start", 0)]


def test_a_forward_order_missing_a_bucketed_parameter_is_refused():
    ddp, groups, _ = fake_ddp(2)
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(2)]
    for g, p in zip(groups, params):
        g.params = [p]
    with pytest.raises(ValueError, match="1 bucketed parameters are not in forward_order"):
        OrderedParamGather(ddp, forward_order=[params[0]])


def test_drain_waits_for_the_gathers_in_flight_and_they_do_not_count_as_the_forwards():
    ddp, groups, log = fake_ddp(3)
    gather = OrderedParamGather(ddp)
    gather.finish()
    gather.start()
    pre_hook(ddp, groups[2])  # the forward's first module
    gather.drain()  # the first reduction is about to start
    assert all(g.param_gather_handle is None for g in groups)
    assert [e for e in log if e[0] == "wait"] == [("wait", 2), ("wait", 1), ("wait", 0)]
    gather.finish()
    assert gather.waited_in_forward == 1
