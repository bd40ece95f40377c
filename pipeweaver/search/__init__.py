# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dynamic pipeline's per-batch schedule search (PipeWeaver/DIP's hierarchical planner).

Pure Python/numpy, no ``torch.distributed``:

* :mod:`pipeweaver.search.partition`: the offline modality-aware partitioner (sub-microbatch
  sizes B_i, chunks per stage K_i, layer splits by measured cost);
* :mod:`pipeweaver.search.memory_plan`: phase 3, the per-layer memory strategy of every F/B
  pair, chosen by one ILP per rank under a memory limit;
* :mod:`pipeweaver.search.mcts`: phase 1, Monte-Carlo tree search over segment priorities,
  every rollout ordered by phase 2 (:func:`pipeweaver.interleave.greedy_dual_queue`) and
  scored by SEMU.
"""
