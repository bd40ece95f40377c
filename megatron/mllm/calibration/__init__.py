# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measure OrchWeave's modules on this device: the calibration JSON that SEMU reads.

:func:`calibrate` is the one entry point; :mod:`megatron.mllm.cli.calibrate` (run by
``tools/calibrate.py``) is its command line. Everything is measured the way the
trainer (``megatron/mllm/training.py``) runs it, so that SEMU's sums of measured parts add up
to a real iteration. What is measured, by stage (``stages``, default all; ``quick`` runs a tiny
grid of the first three, for tests):

``layers`` (:mod:`~megatron.mllm.calibration.layers`)
    The trainer's own chunks (``megatron.mllm.chunks.build_chunk``), wrapped in megatron-core's
    DDP with the trainer's DDP config, so the per-parameter gradient-accumulation hooks run in
    every backward; the backward is started the way megatron-core's ``backward_step`` starts it
    (the C++ engine directly, ``custom_backward``: the trainer sets
    ``deallocate_pipeline_outputs``), which keeps the CPU shim's ``TorchFunctionMode`` active in
    the Python autograd functions of the backward, as in the trainer (``Tensor.backward()``
    would switch it off and run ~25% faster than the trainer does). Per module:

    * one transformer layer over a grid of ``k`` packed sequences of ``n`` tokens; forward and
      backward are each fitted as ``const + per_sequence * (k-1) + linear * N +
      quadratic * sum(n_i**2)`` (non-negative least squares on relative errors);
    * the input layer and the head: whole first and last chunks on batches from the trainer's
      own ``build_microbatch``, minus the fitted layer, fitted as ``const + per_token * N`` (the
      encoders' heads also ``+ per_row * R``, R the LLM rows they produce: items pool 1:1 and
      4:1 in the grid), forward and backward;
    * the activation bytes each keeps for backward (``torch.autograd.graph.saved_tensors_hooks``:
      unique storages saved, parameters excluded), per token, per squared length, per row;
    * the parameter tensors of a layer, the input layer and the head (per-tensor costs).

    Points are measured round-robin (every repetition visits every point), so that the
    machine's speed drifting over seconds (a shared host) spreads over all points alike.
``optimizer`` (:mod:`~megatron.mllm.calibration.optimizer`)
    megatron-core's optimizer (``get_megatron_optimizer`` with the trainer's config: Adam,
    gradient norm and clipping, the local multi-tensor fallbacks on CPU) stepping over several
    sets of DDP-wrapped chunks (none of them a validation run's stage), fitted as
    ``optimizer_step_s + optimizer_s_per_tensor * tensors + optimizer_s_per_param * params``.
``host`` (:mod:`~megatron.mllm.calibration.host`)
    Building microbatches as the trainer does before its step runs them (the loader's payloads,
    ``BatchLoader.load``, and the step's packing, ``PackedStep.pack``): per sample and per
    encoder feature element.
``trainer`` (:mod:`~megatron.mllm.calibration.trainer_glue`)
    Short in-process trainer runs (world size 1, PP = 1, the megatron schedule) on workloads
    that are not in the accuracy benchmark (``workloads``, default llava15-665k and
    qwen2vl-dynamic-resolution): every ``forward_step``/``backward_step`` of megatron-core's
    schedule is timed and compared with the chunk times the stages above predict for its
    microbatch; the median differences are the schedule's per-microbatch glue
    (``forward_step_s``, ``backward_step_s``: the loss function, set_input_tensor, loss
    scaling, the backward's entry); what the iteration spends outside its host work,
    microbatches and optimizer step (zeroing the grad buffers, finalize_model_grads, the
    scheduler, the loss reduction) is ``step_s``.
``parallel`` (:mod:`~megatron.mllm.calibration.parallel`)
    Two processes (torchrun, gloo, 2 ranks on this host, as the main job runs): the time of one
    megatron-core P2P transfer (``P2PCommunicator``, as the baseline schedule sends) per size,
    fitted as ``p2p_latency_s + bytes / p2p_bandwidth``; gloo all-reduce per size, fitted as
    ``2 (n-1) allreduce_latency_s + 2 (n-1)/n bytes / allreduce_bandwidth``; and how much
    slower a process computes while the other one computes too (``shared_node_slowdown``,
    shared caches and memory bandwidth), from alternating solo and paired phases.

Plus the device's matmul FLOP/s and copy bandwidth (``hardware``) and the compute efficiency of
the layers' matrix multiplies relative to that peak (``efficiency``). Every process of the main
job runs with ``OMP_NUM_THREADS=1`` (``scripts/pretrain_mllm_cpu.sh``), so ``threads``
defaults to 1. Timings on a busy machine are wrong: calibrate on a quiet one.

Every time is taken next to a reference pass and kept in its units until the end
(:mod:`~megatron.mllm.calibration.harness`); the fits are :mod:`~megatron.mllm.calibration.fit`,
the saved-bytes probe :mod:`~megatron.mllm.calibration.probes`.
"""

from __future__ import annotations

from megatron.mllm import cpu_shim

# Every module of the package builds megatron-core models: the shim goes first.
cpu_shim.apply()
