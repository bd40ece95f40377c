# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""PipeWeaver/DIP in OrchWeave: dynamic pipeline schedules, from their IR to their execution.

* :mod:`~pipeweaver.ir`: the actions a pipeline rank runs and their string form;
  :mod:`~pipeweaver.placement`: which rank holds each chunk; :mod:`~pipeweaver.dataflow`: what
  each compute consumes; :mod:`~pipeweaver.schedule`: the per-rank action lists of a step;
* :mod:`~pipeweaver.generators`: Megatron's 1F1B, interleaved 1F1B, no pipelining and a dataflow
  list schedule; :mod:`~pipeweaver.interleave`: the dynamic pipeline's greedy dual-queue order;
* :mod:`~pipeweaver.lowering`: adds the sends and receives; :mod:`~pipeweaver.checker`:
  validates a schedule before it runs; :mod:`~pipeweaver.fuzz`: random valid and invalid ones;
* :mod:`~pipeweaver.runtime`: executes a schedule in place of megatron-core's;
* :mod:`~pipeweaver.semu`: SEMU, which predicts a step of a schedule without running it.

It never imports ``megatron.mllm``.
"""
