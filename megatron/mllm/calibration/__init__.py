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
    ``deallocate_pipeline_outputs``). Per module:

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
``runtime`` (:mod:`~megatron.mllm.calibration.runtime`)
    OrchWeave's pipeline runtime on the host: its bookkeeping per forward / backward action
    (``runtime_forward_s``, ``runtime_backward_s``), cutting encoder sub-microbatches
    (``sub_split_s``) and LLM chunk 0 joining them (``sub_join_s``, ``sub_join_backward_s``).
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
    shared caches and memory bandwidth), from alternating solo and paired phases; the host
    time of the runtime's transfers as a running step pays it, both processes computing between
    them (``send_post_s``, ``send_wait_s``, ``recv_post_s``, ``recv_wait_s``:
    ``pipeweaver.runtime.p2p`` posting and waiting isend/irecv; ``transfer_compute_s``: the
    compute a process loses per transfer), and posting a receive whose tensor the other
    process has sent already while it computes (``recv_post_ready_s``), and one of several
    posted back to back when a step starts (``recv_post_start_s``).

Plus the device's matmul FLOP/s and copy bandwidth (``hardware``) and the compute efficiency of
the layers' matrix multiplies relative to that peak (``efficiency``). Every process of the main
job runs with ``OMP_NUM_THREADS=1`` (``scripts/pretrain_mllm_cpu.sh``), so ``threads``
defaults to 1. Timings on a busy machine are wrong: calibrate on a quiet one. The file records
the host (``machine``: CPU, cores, threads) and a second-long probe of its speed
(:mod:`orchestration.host_probe`), so that a load on another host rescales the times.

Every time is taken next to a reference pass and kept in its units until the end
(:mod:`~megatron.mllm.calibration.harness`); the fits are :mod:`~megatron.mllm.calibration.fit`,
the saved-bytes probe :mod:`~megatron.mllm.calibration.probes`.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Sequence

from megatron.mllm import cpu_shim

# Every module of the package builds megatron-core models: the shim goes first.
cpu_shim.apply()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from megatron.mllm.arguments import ConfigError  # noqa: E402
from megatron.mllm.calibration.hardware import device_name, measure_hardware  # noqa: E402
from megatron.mllm.calibration.harness import make_reference, measurement_run, scale  # noqa: E402
from megatron.mllm.calibration.host import measure_host  # noqa: E402
from megatron.mllm.calibration.layers import calibrate_module, grid_points  # noqa: E402
from megatron.mllm.calibration.optimizer import measure_optimizer  # noqa: E402
from megatron.mllm.calibration.runtime import measure_runtime  # noqa: E402
from megatron.mllm.calibration.trainer_glue import measure_trainer  # noqa: E402
from megatron.mllm.cli.launch import REPO  # noqa: E402
from megatron.mllm.cli.progress import progress  # noqa: E402
from megatron.mllm.config_files import CONFIG_DIR, find_config  # noqa: E402
from megatron.mllm.data import SyntheticTask  # noqa: E402
from orchestration.calibration import Calibration  # noqa: E402
from orchestration.host_probe import host_record, probe_enabled, run_probe  # noqa: E402
from orchestration.workload_spec import SampleStream  # noqa: E402

STAGES = ("layers", "optimizer", "host", "runtime", "trainer", "parallel")
"""The stages, in the order they run."""

QUICK_STAGES = ("layers", "optimizer", "host")
"""The stages of a quick calibration."""

DEFAULT_MODEL = str(CONFIG_DIR / "cpu-main.json")
"""The model config calibrated by default (the CPU main job's)."""

DEFAULT_WORKLOADS = ("llava15-665k", "qwen2vl-dynamic-resolution")
"""The trainer stage's workloads: none of the accuracy benchmark's."""

__all__ = ["DEFAULT_MODEL", "DEFAULT_WORKLOADS", "QUICK_STAGES", "STAGES", "calibrate"]


@dataclass(frozen=True)
class _Plan:
    """What one calibration measures."""

    model: str
    quick: bool
    reps: int
    lengths: list[int]
    packs: list[int]
    modules: list[str]
    stages: list[str]
    workloads: list[str]
    threads: int
    max_tokens: int


def calibrate(
    model: str = DEFAULT_MODEL,
    *,
    quick: bool = False,
    reps: int | None = None,
    lengths: Sequence[int] | None = None,
    packs: Sequence[int] | None = None,
    modules: Sequence[str] | None = None,
    stages: Sequence[str] | None = None,
    workloads: Sequence[str] = DEFAULT_WORKLOADS,
    threads: int = 1,
    max_tokens: int = 2048,
    log: Callable[[str], None] | None = None,
) -> Calibration:
    """Measure everything and return the calibration (see the module docstring).

    Args:
        model: the model config (a file, or its name in ``scripts/configs``).
        quick: a tiny grid, one repetition, :data:`QUICK_STAGES` (tests).
        reps: timed repetitions per point. Default: 7 (quick: 1).
        lengths: sequence lengths of the grid. Default: 8 to 512 (quick: 8, 32).
        packs: sequences packed per call. Default: 1 to 32 (quick: 1, 2).
        modules: the modules to measure. Default: all the model has.
        stages: a subset of :data:`STAGES`. Default: all (quick: :data:`QUICK_STAGES`).
        workloads: the trainer stage's workloads.
        threads: torch threads of this process while it measures, and of each process of the
            parallel stage.
        max_tokens: the largest grid point (tokens in one call).
        log: receives a line per finished part (progress and fit quality); None: quiet.

    Raises:
        ConfigError: a missing or unusable model config, unknown stages or modules.
        WorkloadError: a trainer workload that does not load.
    """
    # Imported here, not above: ``python -m megatron.mllm.calibration.parallel`` imports this
    # package first, and the module must not be imported before it runs as __main__.
    from megatron.mllm.calibration.parallel import measure_parallel, single_rank_group

    stages = list(stages or (QUICK_STAGES if quick else STAGES))
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ConfigError(f"unknown stages {sorted(unknown)}; choose from {','.join(STAGES)}")
    if "trainer" in stages and not {"layers", "optimizer", "host"} <= set(stages):
        # Its figures are what a real step takes beyond theirs, measured against them.
        raise ConfigError(
            "the trainer stage needs the layers, optimizer and host stages in the same run "
            f"(--stages {','.join(stages)})"
        )
    path = str(find_config(model))
    loaded = measurement_run(path)
    have = [*loaded.model.encoders, "llm"]
    modules = list(modules or have)
    if set(modules) - set(have):
        raise ConfigError(
            f"unknown modules {sorted(set(modules) - set(have))}; the model has "
            f"{','.join(have)}"
        )
    for w in workloads if "trainer" in stages else ():  # fail now, not after the other stages
        SampleStream(w)
    plan = _Plan(
        path,
        quick,
        reps or (1 if quick else 7),
        list(lengths or ((8, 32) if quick else (8, 16, 32, 64, 128, 256, 512))),
        list(packs or ((1, 2) if quick else (1, 2, 4, 8, 16, 32))),
        modules,
        stages,
        list(workloads),
        threads,
        max_tokens,
    )
    if "layers" in stages:
        _check_grid(plan, loaded.run.seq_length)
    log = log or (lambda line: None)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with single_rank_group() as pg:
            cal = _in_process(plan, loaded, pg, device, log)
        # Two processes share this host's CPUs; a GPU would need a second one.
        if "parallel" in stages and device.type == "cpu":
            _add_parallel(cal, measure_parallel(path, threads, plan.reps), log)
    finally:
        torch.set_num_threads(previous)
    return cal


def _check_grid(plan: _Plan, seq_length: int) -> None:
    """Every module gets grid points to fit (``_layers`` measures them)."""
    if not grid_points(plan.lengths, plan.packs, plan.max_tokens):
        smallest = min(plan.lengths) * min(plan.packs)
        raise ConfigError(
            f"--max-tokens {plan.max_tokens} leaves no grid point: the smallest is --lengths "
            f"{min(plan.lengths)} x --packs {min(plan.packs)} = {smallest} tokens"
        )
    if "llm" in plan.modules and min(plan.lengths) > seq_length:
        raise ConfigError(
            f"--lengths {','.join(map(str, plan.lengths))}: the LLM measures only lengths up to "
            f"the model's --seq-length {seq_length}, and none is"
        )


def _in_process(
    plan: _Plan, loaded, pg, device: torch.device, log: Callable[[str], None]
) -> Calibration:
    """Every stage but ``parallel``, in this process; the calibration in seconds."""
    run, mllm = loaded.run, loaded.model
    task = SyntheticTask(
        vocab_size=run.vocab_size,
        num_classes=run.workload.synthetic_num_classes,
        input_dims={name: enc.input_dim for name, enc in mllm.encoders.items()},
        seed=run.workload.workload_seed,
    )
    torch.manual_seed(0)
    hardware = measure_hardware(device, mllm.language.params_dtype, plan.quick)
    ref = make_reference(mllm, run, pg, device)
    tables, infos = _measure_modules(plan, run, mllm, pg, task, device, ref, log)
    host: dict[str, float] = {}
    if "optimizer" in plan.stages:
        host.update(measure_optimizer(mllm, run, pg, device, plan.modules, plan.reps, ref))
    if "host" in plan.stages:
        host.update(measure_host(task, mllm, run, device, plan.quick, ref))
    if "runtime" in plan.stages:
        host.update(measure_runtime(task, mllm, run, plan.quick, ref))
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cal = Calibration(
        device=device_name(device),
        modules=tables,
        model={
            m: {"hidden_size": infos[m]["hidden_size"], "num_layers": mllm.num_layers(m)}
            for m in tables
        },
        source=(
            f"tools/calibrate.py {stamp} model {os.path.relpath(plan.model, REPO)} lengths "
            f"{plan.lengths} packs {plan.packs} max tokens {plan.max_tokens} reps {plan.reps} "
            f"threads {plan.threads} stages {','.join(s for s in STAGES if s in plan.stages)}"
            + (f" trainer workloads {','.join(plan.workloads)}" if "trainer" in plan.stages else "")
            + (" (quick)" if plan.quick else "")
        ),
        hardware=hardware,
        host=host,
        comm={},
        # The host, and a probe of it that SEMU and the balancer rerun where they load this.
        # (Not with the probe disabled, as in the test suite: then it has none to compare.)
        machine={
            **host_record(plan.threads),
            **({"probe": run_probe()} if probe_enabled() else {}),
        },
    )
    complete = set(plan.modules) >= {*mllm.encoders, "llm"}
    if "trainer" in plan.stages and complete and plan.workloads:
        found = measure_trainer(plan.model, cal, plan.workloads, 8, 2, ref, log)
        opt_ctx, host_ctx = found.pop("optimizer_context"), found.pop("host_context")
        for k in ("optimizer_step_s", "optimizer_s_per_tensor", "optimizer_s_per_param"):
            if k in host:
                host[k] *= opt_ctx
        for k in ("sample_s", "feature_s_per_element"):
            if k in host:
                host[k] *= host_ctx
        host.update(found)
    # Everything above is in reference units: convert at the machine's typical speed.
    cal = scale(cal, ref.seconds)
    flops_per_ref = statistics.median(i["layer_flops_per_ref"] for i in infos.values())
    cal.efficiency = {"compute": min(1.0, flops_per_ref / ref.seconds / hardware["peak_flops"])}
    log(
        f"  reference pass: median {ref.seconds * 1e3:.2f} ms over {len(ref.samples)} passes "
        f"(10-90%: {np.percentile(ref.samples, 10) * 1e3:.2f}-"
        f"{np.percentile(ref.samples, 90) * 1e3:.2f} ms)"
    )
    return cal


def _measure_modules(plan: _Plan, run, mllm, pg, task, device, ref, log) -> tuple[dict, dict]:
    """The ``layers`` stage over every module of the plan: tables and efficiency inputs."""
    tables, infos = {}, {}
    for module in progress(plan.modules, "calibration: layers"):
        t0 = time.perf_counter()
        # LLM sequences never exceed --seq-length (the position embedding's size); encoder
        # units may (images of many patches).
        lens = [n for n in plan.lengths if module != "llm" or n <= run.seq_length]
        # The whole chunks need fewer points than the layers: every other length and pack.
        edge_lengths = sorted(set(lens[::2]) | {lens[-1]})
        edge_packs = sorted(set(plan.packs[::2]))
        tables[module], infos[module] = calibrate_module(
            module, mllm, run, pg, task, device,
            grid_points(lens, plan.packs, plan.max_tokens),
            grid_points(edge_lengths, edge_packs, plan.max_tokens), plan.reps, ref, log,
        )  # fmt: skip
        log(f"  {module}: layers and edges in {time.perf_counter() - t0:.0f} s")
    return tables, infos


def _add_parallel(cal: Calibration, par: dict, log: Callable[[str], None]) -> None:
    """The parallel stage's figures into ``cal``."""
    cal.comm.update(par["comm"])
    cal.host["shared_node_slowdown"] = float(par["shared_node_slowdown"])
    cal.host.update(par.get("transfers", {}))
    raw = par["raw"]
    log(
        f"  two processes: p2p {cal.comm['p2p_latency_s'] * 1e6:.0f} us + "
        f"{cal.comm['p2p_bandwidth'] / 1e9:.2f} GB/s; all-reduce "
        f"{cal.comm['allreduce_latency_s'] * 1e6:.0f} us x 2(n-1) + "
        f"{cal.comm['allreduce_bandwidth'] / 1e9:.2f} GB/s; paired compute x"
        f"{cal.host['shared_node_slowdown']:.3f} (solo {raw['solo_s']}, paired "
        f"{raw['paired_s']})"
    )
    if "send_post_s" in cal.host:
        log(
            "  runtime transfers (us): "
            + ", ".join(f"{k} {cal.host[k] * 1e6:.0f}" for k in par.get("transfers", {}))
        )
