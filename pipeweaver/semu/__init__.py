# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU, the step emulator: predicts one training step of a schedule without running it.

Modules, one per concern:

* :mod:`~pipeweaver.semu.hardware`: device and cluster specs (H100, H200, A100, H800, H20, cpu);
* :mod:`~pipeweaver.semu.model`: the model and its parallel layout from the trainer's flags;
* :mod:`~pipeweaver.semu.work`: the hardware-independent cost description (FLOPs, bytes,
  activation memory, weights);
* :mod:`~pipeweaver.semu.timing`: time of each compute and collective on a cluster (roofline with
  efficiency factors, or a measured calibration table);
* :mod:`~pipeweaver.semu.batches`: microbatch metadata as the trainer packs it;
* :mod:`~pipeweaver.semu.scenario`: the step a model config runs on a cluster (microbatches,
  placement, schedules), as ``tools/semu.py`` simulates it;
* :mod:`~pipeweaver.semu.reuse`: the spatial-temporal subgraph reuse caches;
* :mod:`~pipeweaver.semu.simulator`: the simulation of one step (costs, compilation, the DP
  gradient reduction and the optimizer);
* :mod:`~pipeweaver.semu.replay`: the event-driven replay of one pipeline;
* :mod:`~pipeweaver.semu.results`: what SEMU predicts (timelines, step time, bubble, MFU,
  memory);
* :mod:`~pipeweaver.semu.trace`: Chrome/Perfetto trace, PNG timeline and text summary.
"""
