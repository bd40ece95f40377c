# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``tools/semu.py --post-balance``: OrchWeave's full mode, planned as the trainer plans it.

The model config's flags and ``--post-balance`` go through the trainer's parser, so the plan
takes the trainer's ``--post-balance``, ``--balance-phases``, ``--post-balance-token-caps``,
``--node-wise-a2a`` and ``--gpus-per-node`` (default: the cluster's devices per node, as
torchrun's ``LOCAL_WORLD_SIZE`` on it), and its cost model (``CostModel.build`` of the model and
``--calibration``). With PP = 1 the per-phase balanced step is simulated
(:func:`pipeweaver.semu.post_balance.simulate_phase_balanced`), with PP > 1 whole-sample
balancing ahead of the pipeline the schedule names (:func:`build_step`'s ``balance``).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

from megatron.mllm.arguments import ConfigError
from orchestration.balance import DEFAULT_BUDGET, InfeasibleCapError
from orchestration.cost_feedback import FITTED_BUDGET, CostFeedback
from orchestration.cost_model import CostModel
from pipeweaver.ir import Memory
from pipeweaver.semu.fitted_costs import replay_cost_fit
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.packed_baseline import packed_batches
from pipeweaver.semu.post_balance import (
    BalancedBatches,
    PostBalanceSetup,
    gathered_metadata,
    phase_balanced_batches,
    sample_balanced_batches,
    simulate_phase_balanced,
)
from pipeweaver.semu.results import StepPrediction
from pipeweaver.semu.scenario import sample_source
from pipeweaver.semu.simulator import Semu

PHASE_BALANCED_SCHEDULE = "per-phase post-balancing (encoders, then LLM microbatches)"
"""The schedule's name in the output of a PP = 1 balanced step."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of OrchWeave's full mode and of Megatron's overlapped gradient reduction."""
    parser.add_argument(
        "--post-balance",
        choices=["none", "lpt", "kk", "auto"],
        help="batch post-balancing as the trainer's flag: per phase with PP = 1, whole samples "
        "across DP groups with PP > 1 (default: the model config's)",
    )
    parser.add_argument(
        "--overlap-grad-reduce",
        action="store_true",
        help="Megatron's --overlap-grad-reduce: DP gradient buckets reduced during the backward "
        "(upstream Megatron-LM, and OrchWeave's steps: megatron.mllm.grad_overlap)",
    )
    parser.add_argument(
        "--ddp-bucket-size",
        type=int,
        help="with --overlap-grad-reduce: Megatron's --ddp-bucket-size in parameters (default "
        "max(40M, 1M x DP), megatron-core's)",
    )
    parser.add_argument(
        "--overlap-param-gather",
        action="store_true",
        help="Megatron's --overlap-param-gather with --use-distributed-optimizer: the updated "
        "weights all-gathered during the next forward: one layer ahead of it for Megatron's "
        "own step (upstream Megatron-LM), every gather as the forward starts with "
        "--post-balance or a runtime schedule (OrchWeave's steps: megatron.mllm.param_gather)",
    )
    parser.add_argument(
        "--data-parallel-sharding-strategy",
        choices=["optim", "optim_grads", "optim_grads_params"],
        help="Megatron-FSDP (--use-megatron-fsdp): shard the optimizer states, the gradients, "
        "the weights over DP, with its per-layer collectives (SEMU only: the trainer refuses "
        "FSDP; replaces a config's parallel_overrides)",
    )


def balance_flags(
    args: argparse.Namespace, sets: dict[str, Any], devices_per_node: int
) -> list[str]:
    """Trainer flags that ``--post-balance`` adds after the config's (checked by its parser).

    Raises:
        ConfigError: ``--overlap-grad-reduce`` or ``--ddp-bucket-size`` where they cannot
            apply.
    """
    if args.ddp_bucket_size is not None and not args.overlap_grad_reduce:
        raise ConfigError("--ddp-bucket-size sizes the buckets of --overlap-grad-reduce: add it")
    if args.ddp_bucket_size is not None and args.ddp_bucket_size < 1:
        raise ConfigError(f"--ddp-bucket-size must be >= 1, got {args.ddp_bucket_size}")
    flags = []
    if args.post_balance is not None:
        flags.append(f"--post-balance {args.post_balance}")
    if "gpus-per-node" not in sets and "gpus_per_node" not in sets:
        flags.append(f"--gpus-per-node {devices_per_node}")
    return flags


def check_flags(args: argparse.Namespace, post_balance: str) -> None:
    """Raises ConfigError: ``--replicas`` with post-balancing (its replicas differ: all are
    simulated), or ``--pad packed`` with it (the baseline's own packing)."""
    if args.replicas is not None and post_balance != "none":
        raise ConfigError(
            f"--replicas: --post-balance {post_balance} gives every DP replica other samples, "
            "so all of them are simulated"
        )
    if args.pad == "packed" and post_balance != "none":
        raise ConfigError(
            f"--pad packed is the Megatron baseline's offline packing; --post-balance "
            f"{post_balance} forms its own microbatches (use --pad megatron or none)"
        )


def setup_of(loaded) -> PostBalanceSetup:
    """The trainer's balancing flags of a parsed config."""
    from megatron.mllm.steps.base import BALANCE_ALGORITHMS
    from megatron.mllm.steps.phase_balanced import payload_bytes
    from orchestration.locality import first_data_parallel_ranks, group_ranks_per_node

    b, par = loaded.run.balance, loaded.run.parallel
    # As the trainer's Dispatcher counts them, each rank its own node when irregular.
    dp_ranks = first_data_parallel_ranks(par.tensor, par.data)
    return PostBalanceSetup(
        algorithm=BALANCE_ALGORITHMS[b.post_balance],
        packing_limit=loaded.run.packing_limit,
        payload=payload_bytes(loaded.model, loaded.run.data is not None),
        phases=tuple(b.balance_phases),
        caps=b.token_caps,
        gpus_per_node=group_ranks_per_node(dp_ranks, b.gpus_per_node) or 1,
        node_wise=b.node_wise_a2a,
        overlap=b.overlap_exchanges,
        pack_sequences=loaded.run.workload.pack_sequences,
    )


def _cap_error(e: InfeasibleCapError, setup: PostBalanceSetup) -> ConfigError:
    flag = "--post-balance-token-caps"
    if e.phase in setup.caps:
        flag += f" {e.phase}={setup.caps[e.phase]}"
    elif e.phase is None:
        flag = f"the packing limit ({setup.packing_limit} tokens per microbatch)"
    return ConfigError(f"{flag}: {e}")


def sample_balancer(
    semu: Semu, loaded, calibration, iteration: int, held: dict
) -> Callable[..., list]:
    """``build_step``'s ``balance`` for PP > 1: the trainer's whole-sample plan; the batches
    it made are left in ``held["batches"]``."""
    setup = setup_of(loaded)
    spec = loaded.semu
    cost_model = CostModel.build(spec.shape, calibration)

    def balance(sample_of, pack) -> list:
        dp = semu.dp
        m = spec.training.num_microbatches(dp)
        md, drawn = gathered_metadata(sample_of, iteration, dp, spec.training.micro_batch_size, m)
        try:
            batches = sample_balanced_batches(semu, md, cost_model, setup, m, pack, samples=drawn)
        except InfeasibleCapError as e:
            raise _cap_error(e, setup) from None
        held["batches"] = batches
        return batches.microbatches

    return balance


def phase_balanced_step(
    semu: Semu,
    loaded,
    calibration,
    *,
    workload: str | None,
    seed: int | None,
    token_scale: float | None,
    iteration: int,
    memory: str | None,
    record_events: bool,
) -> tuple[StepPrediction, BalancedBatches, dict[str, Any]]:
    """PP = 1: the trainer's per-phase plan of one iteration, simulated. With ``--cost-fit``
    (the trainer's default) the plans of the iterations before are replayed on SEMU's times
    first (:mod:`pipeweaver.semu.fitted_costs`): after the fit's warm-up the plan is made with
    the fitted costs and weighs each phase's gain against the fitted exchange time, as the
    trainer's is.

    Returns:
        The step, the batches it ran, and the ``info`` of :func:`build_step`'s form.
    """
    setup = setup_of(loaded)
    spec = loaded.semu
    dp = semu.dp
    m = spec.training.num_microbatches(dp)
    sample_of = sample_source(spec, workload, seed, token_scale)
    shape = spec.shape
    strategy = Memory(memory or spec.training.memory)

    def plan_of(it: int, costs: CostModel, check, fitted: bool) -> BalancedBatches:
        md, drawn = gathered_metadata(sample_of, it, dp, spec.training.micro_batch_size, m)
        flops_of = None
        if it == iteration:  # a replayed plan is timed for the fits only: it needs no FLOPs
            flops_of = lambda s: sum(shape.sample_phase_flops(s).values())  # noqa: E731
        budget = FITTED_BUDGET if fitted else DEFAULT_BUDGET
        try:
            return phase_balanced_batches(semu, md, costs, dataclasses.replace(setup, exchange=check),
                                          m, flops_of, budget, samples=drawn)  # fmt: skip
        except InfeasibleCapError as e:
            raise _cap_error(e, setup) from None

    cost_model = CostModel.build(shape, calibration)
    b = loaded.run.balance
    fit = None
    # Without a fit (--no-cost-fit) the trainer plans with its starting costs and never
    # weighs exchanges.
    if b.cost_fit:
        fit = CostFeedback.starting(cost_model, setup.payload, b.cost_fit_window, b.cost_fit_warmup)
        replay_cost_fit(semu, fit, plan_of, iteration, strategy)
        fitted, exchange = fit.models(iteration)
        batches = plan_of(iteration, fitted, exchange, fitted is not cost_model)
    else:
        batches = plan_of(iteration, cost_model, None, False)
    result = simulate_phase_balanced(semu, batches, strategy, record_events)
    info = {
        "model": spec.name,
        "cluster": semu.cluster.name,
        "schedule": PHASE_BALANCED_SCHEDULE,
        "placement": "baseline",
        "tp": spec.parallel.tensor,
        "pp": 1,
        "dp": dp,
        "num_microbatches": max(len(mbs) for mbs in batches.microbatches),
        "workload": workload or spec.training.workload,
        "iteration": iteration,
        "replicas_simulated": dp,
    }
    if fit is not None and fit.costs.ready:
        info["cost_fit"] = fit.describe()
    return result, batches, info


def packed_baseline(semu: Semu, spec, iteration: int) -> Callable[..., list]:
    """``build_step``'s ``balance`` for ``--pad packed``: every rank's samples in packed
    sequences (:mod:`pipeweaver.semu.packed_baseline`)."""
    t = spec.training

    def balance(sample_of, pack) -> list:
        m = t.num_microbatches(semu.dp)
        limit = t.micro_batch_size * t.seq_length
        return packed_batches(sample_of, pack, iteration, semu.dp, t.micro_batch_size, m, limit)

    return balance


def balance_info(batches: BalancedBatches) -> dict[str, Any]:
    """What the plan did, for ``--json``'s ``config.post_balance``."""
    plan = batches.plan
    out: dict[str, Any] = {"exchange_s": list(batches.exchange_s)}
    if hasattr(plan, "phases"):
        out["imbalance_before"] = {p.phase: p.imbalance_before for p in plan.phases}
        out["imbalance_after"] = {p.phase: p.imbalance_after for p in plan.phases}
    else:
        out["imbalance_before"] = {"groups": plan.imbalance_before}
        out["imbalance_after"] = {"groups": plan.imbalance_after}
    out["microbatches_per_rank"] = [len(mbs) for mbs in batches.microbatches]
    return out


def with_sharding(spec: ModelSpec, args: argparse.Namespace) -> ModelSpec:
    """SEMU's spec with ``--data-parallel-sharding-strategy`` applied.

    Raises:
        ConfigError: ``--overlap-param-gather`` without a sharded optimizer (Megatron asserts
            ``--use-distributed-optimizer`` for it); Megatron-FSDP with PP > 1, which
            megatron-core 0.19.2 cannot build.
    """
    if args.data_parallel_sharding_strategy:
        if spec.parallel.pipeline > 1:
            # Simulating it would predict a run no one can start.
            raise ConfigError(
                f"--data-parallel-sharding-strategy {args.data_parallel_sharding_strategy}: "
                "megatron-core 0.19.2's Megatron-FSDP builds its device mesh as DP x TP of the "
                f"whole world, so it cannot run with --pipeline-model-parallel-size "
                f"{spec.parallel.pipeline} (--set pipeline-model-parallel-size=1)"
            )
        parallel = dataclasses.replace(
            spec.parallel, data_parallel_sharding=args.data_parallel_sharding_strategy
        )
        spec = dataclasses.replace(spec, parallel=parallel)
    if args.overlap_param_gather and not spec.parallel.sharded("optim"):
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer (Megatron's)")
    return spec
