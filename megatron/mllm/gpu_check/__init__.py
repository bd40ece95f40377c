# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One prepared check of OrchWeave on a single CUDA GPU (``tools/gpu/check.sh``).

GPU time is rare here, so the check is ready before a GPU is and takes one command; its dry
run (``--dry-run``) runs every stage on the CPU at toy sizes in CI, so it does not rot between
the tasks that get a GPU. The modules, one per concern:

``driver``             the stages in one process, each in its time box; ``__main__`` runs it
``report``             ``gpu-check.json`` and ``summary.txt`` (pure Python)
``modes``              a training step of every single-process mode beside the CPU's
``device_audit``       the hook that finds tensors a step leaves on the host
``attention_check``    packed-sequence attention kernels against the per-sequence reference
``calibration_stage``  the calibration file of this device, its rates against the datasheet
``throughput``         measured MFU beside SEMU's prediction

Nothing is imported here: ``python -m megatron.mllm.gpu_check.modes`` (the CPU reference's
child process) and ``.report`` (check.sh's fallback, without megatron-core) import only what
they need.
"""
