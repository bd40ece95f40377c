# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrderedGradReduce starts every DP gradient bucket in megatron-core's bucket order, each once it
and every bucket before it are final, whatever order the step declares them in: so every rank
issues the same collectives in the same order (megatron.mllm.grad_overlap)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from megatron.mllm.grad_overlap import OrderedGradReduce, install


class FakeBucketGroup:
    """A megatron-core bucket group: its parameters, the no_sync flag, and a log of starts."""

    def __init__(self, index: int, params, log: list):
        self.index, self.params, self.log = index, list(params), log
        self.is_last_microbatch = True

    def start_grad_sync(self):
        self.log.append(self.index)


def fake_ddp(sizes, overlap: bool = True):
    log: list = []
    params, groups = [], []
    for i, n in enumerate(sizes):
        ps = [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]
        params.append(ps)
        groups.append(FakeBucketGroup(i, ps, log))
    ddp = SimpleNamespace(
        ddp_config=SimpleNamespace(overlap_grad_reduce=overlap),
        bucket_groups=groups,
        expert_parallel_bucket_groups=[],
    )
    return ddp, params, log


def test_buckets_start_in_order_each_once_it_and_those_before_are_final():
    ddp, params, log = fake_ddp([2, 1, 2])
    ordered = OrderedGradReduce(ddp)
    ordered.mark_final([params[2][0], params[2][1]])  # the last bucket is complete: it waits
    assert log == []
    ordered.mark_final([params[0][0]])
    assert log == []  # bucket 0 still waits for its second parameter
    ordered.mark_final([params[0][1]])
    assert log == [0]
    ordered.mark_final([params[1][0]])  # 1 and then the waiting 2
    assert log == [0, 1, 2]
    ordered.finish()
    assert log == [0, 1, 2] and ordered.started_early == 3


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_every_declaration_order_gives_the_same_collectives(order):
    # Two "ranks" that declare the same parameters final in different orders (one of them
    # leaving some to the end of the step) issue the same sequence of starts.
    ddp, params, log = fake_ddp([1, 1, 1, 1])
    ordered = OrderedGradReduce(ddp)
    for k in order[:3]:
        ordered.mark_final(params[k])
    ordered.finish()
    assert log == [0, 1, 2, 3]
    assert ordered.started_early == next(i for i in range(4) if i not in order[:3])


def test_a_hook_inside_no_sync_declares_nothing_and_finish_resets_for_the_next_step():
    ddp, params, log = fake_ddp([1, 1])
    ordered = OrderedGradReduce(ddp)
    group = ddp.bucket_groups[0]
    group.is_last_microbatch = False  # megatron-core's no_sync: not the last microbatch
    group.register_grad_ready(params[0][0])
    assert log == []
    group.is_last_microbatch = True
    group.register_grad_ready(params[0][0])  # the hook megatron-core's DDP calls
    assert log == [0]
    ordered.mark_final([torch.nn.Parameter(torch.zeros(1))])  # not in a bucket: ignored
    ordered.finish()
    assert log == [0, 1] and ordered.started_early == 1
    ordered.finish()  # the next step: everything starts again, from bucket 0
    assert log == [0, 1, 0, 1] and ordered.started_early == 0


def test_install_declares_everything_final_before_megatron_finalizes():
    ddp, params, log = fake_ddp([1, 1])
    seen = []
    config = SimpleNamespace(finalize_model_grads_func=lambda *a, **k: seen.append(list(log)))
    install(ddp, config)
    config.grad_sync_func(params[0])
    config.finalize_model_grads_func([ddp])
    assert seen == [[0, 1]]


def test_a_ddp_without_overlap_is_refused():
    ddp, _, _ = fake_ddp([1], overlap=False)
    with pytest.raises(ValueError, match="overlap_grad_reduce"):
        OrderedGradReduce(ddp)


def test_buckets_go_in_the_order_a_backward_completes_them():
    # megatron-core's order puts the input layer (forward position 0) in bucket 1, before the
    # layers' buckets 2 and 3; a backward completes bucket 1 last, so it goes last.
    ddp, params, log = fake_ddp([1, 1, 1, 1])
    head, embedding, top, bottom = (p[0] for p in params)
    ordered = OrderedGradReduce(ddp, forward_order=[embedding, bottom, top, head])
    ordered.mark_final([head, top])
    assert log == [0, 2]  # megatron-core's order would have stopped at bucket 1
    ordered.mark_final([bottom])
    assert log == [0, 2, 3]
    ordered.mark_final([embedding])
    assert log == [0, 2, 3, 1]


def test_a_forward_order_missing_a_bucketed_parameter_is_refused():
    ddp, params, _ = fake_ddp([1, 1])
    with pytest.raises(ValueError, match="1 bucketed parameters are not in forward_order"):
        OrderedGradReduce(ddp, forward_order=[params[0][0]])


def test_before_first_runs_once_per_step_before_its_first_reduction():
    ddp, params, log = fake_ddp([1, 1])
    calls = []
    ordered = OrderedGradReduce(ddp, before_first=lambda: calls.append(list(log)))
    ordered.mark_final(params[1])  # bucket 1 waits for bucket 0: nothing starts
    assert calls == []
    ordered.mark_final(params[0])
    assert calls == [[]] and log == [0, 1]  # called before bucket 0 started, once
    ordered.finish()
    ordered.finish()  # the next step, every bucket started in finish
    assert calls == [[], [0, 1]]
