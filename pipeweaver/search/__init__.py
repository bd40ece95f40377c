# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dynamic pipeline's per-batch schedule search (PipeWeaver/DIP's hierarchical planner).

Pure Python/numpy, no ``torch.distributed``:

* :mod:`pipeweaver.search.partition`: the offline modality-aware partitioner (sub-microbatch
  sizes B_i, chunks per stage K_i, layer splits by measured cost);
* :mod:`pipeweaver.search.memory_limit`: the activation memory each rank may use (the device's,
  or ``--pipeline-memory-limit-gb``, minus parameters, gradients and optimizer states);
* :mod:`pipeweaver.search.memory_plan`: phase 3, the memory strategy of every F/B pair, chosen
  by one ILP per rank under that limit in phase 2's order (phase 2 is
  :func:`pipeweaver.interleave.greedy_dual_queue` with ``memory_limit``);
* :mod:`pipeweaver.search.mcts`: phase 1, Monte-Carlo tree search over segment priorities,
  every rollout ordered by phase 2 (:func:`pipeweaver.interleave.greedy_dual_queue`) and
  scored by SEMU; with ``workers`` > 1 each wave of the search is scored by
  :mod:`pipeweaver.search.search_pool`'s worker processes (at most half the host's cores).
"""
