# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The node grouping of a data-parallel group: ``--gpus-per-node`` counts global ranks, the
balancer and the node-wise exchange count the group's own members."""

from __future__ import annotations

import pytest

from orchestration.locality import group_ranks_per_node


@pytest.mark.parametrize(
    "group, gpus_per_node, expected",
    [
        (range(16), 8, 8),  # DP only: a node holds 8 DP ranks
        (range(0, 16, 2), 8, 4),  # TP=2: every other global rank, 4 per node
        (range(0, 32, 8), 8, 1),  # TP=8: one DP rank per node
        (range(1, 32, 8), 8, 1),  # the group of TP rank 1
        ([0, 8, 1, 9], 8, None),  # nodes interleaved in group order
        ([0, 1, 2, 8], 8, None),  # unequal runs
        (range(4), 8, 4),  # one partial node
    ],
)
def test_group_ranks_per_node_counts_the_groups_own_members(group, gpus_per_node, expected):
    assert group_ranks_per_node(list(group), gpus_per_node) == expected
