# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Simulate one training step with SEMU: step time, bubble, MFU, peak memory, a timeline.

Usage (from the repository root; installed: ``orchweave-semu``)::

    python tools/semu.py --model CONFIG --cluster CONFIG [--workload SPEC] [--schedule NAME]
                         [--trace F.json] [--png F.png] [--json] [options]

``--model`` is a model config (``scripts/configs/<name>.json`` or its name: the trainer's
flags, parsed by the trainer's parser for the cluster's number of devices; ``--set FLAG=VALUE``
adds ``--FLAG VALUE`` after them, ``--set FLAG=true`` a switch), ``--cluster`` a cluster config
(device type, number of devices, devices per node).
The microbatches are the ones the trainer would run: samples drawn from the workload with
the config's seed, in Megatron's sampler order, packed per microbatch and padded to micro
batch x sequence length when PP > 1. Each DP replica gets its own microbatches and pipeline.

Schedules (``--schedule``): ``megatron`` (default: the upstream baseline, i.e. ``none`` for
PP = 1, ``1f1b``, or ``interleaved`` with virtual stages), ``1f1b``, ``interleaved``, ``none``,
``dataflow`` (any placement; with ``--placement interleaved`` the encoders are spread over all
ranks, DIP's layout) and ``dynamic`` (the trainer's ``--pipeline-schedule dynamic``: greedy
dual-queue interleaving over the interleaved placement; use ``--pad none`` as the runtime
does not pad). ``--placement balanced`` runs Megatron's schedules on DIP's baseline layout: every
module's layers, encoders first, cut into P x K consecutive stages of balanced parameters;
``balanced-cost`` cuts them by each layer's cost in the workload's first iterations (the
trainer's ``--pipeline-layout balanced-cost``: ``--calibration``'s costs, else the FLOPs).

The trainer's partitioner flags apply as in training: ``--set vision-chunks-per-stage=auto``
(audio, llm) and ``--set encoder-sub-microbatch-size=auto`` (with ``--set
pipeline-schedule=dynamic``) place the chunks by the partitioner's layer splits, cut the
encoders' subs by its B_i, and print why (``--calibration``'s costs, else the FLOPs);
``--set encoder-sub-microbatch-size=N`` cuts N units per sub.

``--json`` prints one JSON object::

    step_time_s: float            # the step
    bubble_ratio: float           # 1 - busy / (P x pipeline span), slowest DP replica
    mfu: float                    # model FLOPs / (step x devices x peak)
    peak_memory_bytes: [float]    # per pipeline rank: weights + grads + optimizer + activations
    peak_activation_bytes: [float]
    static_bytes: [{params, weights, gradients, optimizer}]
    busy_s, idle_s: [float]       # per pipeline rank, slowest replica
    breakdown: {host, a2a, pipeline, allreduce_and_optimizer}
    model_flops, num_devices, critical_replica, reuse: {level: {hits, misses, hit_rate, entries}}
    config: {model, cluster, schedule, placement, tp, pp, dp, num_microbatches, workload,
             iteration, replicas_simulated}

Errors print one ``error:`` line on stderr and exit with status 2. SEMU refuses what it
cannot simulate truthfully, as the trainer would refuse to run it: a ``--set`` key that is not
one of the trainer's flags (the closest ones are named), a sample longer than ``--seq-length``
(the trainer's own check, naming the sample, its stream index and DP rank; under
``--overlong-samples truncate|drop`` such a batch is refused as not simulated), and a layout
the trainer's parser rejects: ``--schedule 1f1b|interleaved|dynamic`` is passed to it as
``--pipeline-schedule``, and with ``dynamic`` ``--chunks-per-rank m=K`` as
``--m-chunks-per-stage K``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable, Sequence

from megatron.mllm.arguments import ConfigError
from megatron.mllm.cli import semu_balance
from megatron.mllm.cli.args import ToolParser, number, quiet_config_files, report_error
from megatron.mllm.overlong import check_fits
from megatron.mllm.run_config import RunConfig
from orchestration.host_probe import load_calibration
from orchestration.metadata import GatheredMetadata
from orchestration.workload import WorkloadError
from pipeweaver.ir import MODULES, ScheduleError
from pipeweaver.semu import trace
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.scenario import PLACEMENTS, SCHEDULES, build_step, placement_kind
from pipeweaver.semu.simulator import Semu


def _kv(text: str, what: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"{what}: expected name=value pairs, got {part!r}")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``--set flag=value`` pairs; values are JSON when they parse as JSON, else strings.

    Raises:
        ValueError: a pair without ``=``.
    """
    out: dict[str, Any] = {}
    for s in sets:
        if "=" not in s:
            raise ValueError(f"--set expects FLAG=VALUE, got {s!r}")
        k, v = s.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


TRAINER_SCHEDULES: tuple[str, ...] = ("megatron", "1f1b", "interleaved", "dynamic")
"""``--schedule`` names that are also the trainer's ``--pipeline-schedule``: SEMU passes them
to the trainer's parser, so that a layout the trainer would reject is rejected here too."""


def _flag(key: str) -> str:
    """A ``--set`` key as the trainer's flag name without dashes (``num_layers`` ->
    ``num-layers``)."""
    return key.lstrip("-").replace("_", "-")


def trainer_layout_flags(args: argparse.Namespace, sets: dict[str, Any]) -> dict[str, Any]:
    """The trainer's flags for the layout the arguments simulate, added to ``--set``'s.

    ``--schedule 1f1b|interleaved|dynamic`` is the trainer's ``--pipeline-schedule`` of that
    name, and with ``dynamic``, ``--chunks-per-rank m=K`` is its ``--m-chunks-per-stage K``:
    the trainer's parser then checks the layout as it would for training (chunks against
    layers, divisibility). ``--schedule megatron`` keeps the model config's own flags.

    Raises:
        ValueError: ``--schedule`` and ``--set pipeline-schedule`` disagree, naming both.
    """
    given = {_flag(k): v for k, v in sets.items()}
    out: dict[str, Any] = {}
    if args.schedule in TRAINER_SCHEDULES and args.schedule != "megatron":
        set_schedule = given.get("pipeline-schedule")
        if set_schedule is not None and set_schedule != args.schedule:
            raise ValueError(
                f"--schedule {args.schedule} and --set pipeline-schedule={set_schedule} "
                f"disagree: the trainer would run {set_schedule}"
            )
        out["pipeline-schedule"] = args.schedule
    if args.schedule == "dynamic":
        for module, k in (_chunks_per_rank(args) or {}).items():
            out.setdefault(f"{module}-chunks-per-stage", k)
    return {k: v for k, v in out.items() if k not in given}


def _chunks_per_rank(args: argparse.Namespace) -> dict[str, int] | None:
    """``--chunks-per-rank vision=2,audio=1`` as a mapping; None when not given, or when the
    step's placement is the baseline or the balanced one, which ignore it."""
    text = args.chunks_per_rank
    if text is None or placement_kind(args.schedule, args.placement) in ("baseline", "balanced"):
        return None
    out = {}
    for mod, v in _kv(text, "--chunks-per-rank").items():
        if mod not in MODULES:
            raise ValueError(f"--chunks-per-rank: unknown module {mod!r}; modules are {MODULES}")
        if not v.isdigit() or int(v) < 1:
            raise ValueError(f"--chunks-per-rank: {mod}={v} is not a positive integer")
        out[mod] = int(v)
    return out


def _sample_checks(run: RunConfig) -> Callable[[Sequence[Sequence[tuple[int, Any]]]], None]:
    """The trainer's checks of an iteration's samples, for :func:`build_step`.

    Raises (when called):
        SequenceTooLongError: under ``--overlong-samples error``, the first sample longer than
            ``--seq-length``, named as the trainer names it.
        ConfigError: ``--overlong-samples truncate|drop``, which SEMU does not simulate.
    """
    policy = run.workload.overlong_samples

    def check(rank_samples: Sequence[Sequence[tuple[int, Any]]]) -> None:
        metadata = GatheredMetadata.from_rank_samples(rank_samples)
        if policy == "error":
            check_fits(metadata, run.seq_length)
        elif (metadata.sample_llm > run.seq_length).any():
            raise ConfigError(
                f"--overlong-samples {policy}: this iteration has samples longer than "
                f"--seq-length {run.seq_length}, and SEMU simulates them only under "
                f"--overlong-samples error (which names them)"
            )

    return check


def load_balancer_bytes(path: str, dp: int) -> dict[str, Any]:
    """``--balancer-bytes``: per phase, bytes per device or a DP x DP matrix of bytes.

    Raises:
        ValueError: naming the file and the phase at fault.
        OSError: the file cannot be read.
    """
    with open(path, encoding="utf-8") as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object of phase -> bytes")

    def is_bytes(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")

    for phase, volume in obj.items():
        matrix = isinstance(volume, list) and len(volume) == dp
        matrix = matrix and all(isinstance(r, list) and len(r) == dp for r in volume)
        if not (is_bytes(volume) or (matrix and all(is_bytes(x) for r in volume for x in r))):
            raise ValueError(
                f"{path}: {phase!r} must be bytes per device (a number >= 0) or a {dp} x {dp} "
                f"matrix of them (the data-parallel size)"
            )
    return obj


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of this tool."""
    parser = ToolParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="model config (path or name)")
    parser.add_argument("--cluster", required=True, help="cluster config (path or name)")
    parser.add_argument("--workload", help="workload spec or JSONL (default: the model config's)")
    parser.add_argument(
        "--seed", type=number(int, zero=True), help="workload seed (default: the config's)"
    )
    parser.add_argument("--token-scale", type=number(float), help="workload token scale")
    parser.add_argument(
        "--iteration", type=number(int, zero=True), default=0, help="which step of the stream"
    )
    parser.add_argument(
        "--schedule",
        default="megatron",
        choices=list(SCHEDULES),
        help="schedule generator (default: the upstream-Megatron baseline)",
    )
    parser.add_argument(
        "--placement",
        choices=list(PLACEMENTS),
        help="chunk layout (balanced: Megatron's stages with balanced parameters, DIP's baseline; "
        "balanced-cost: the same with balanced costs; default the trainer's --pipeline-layout)",
    )
    parser.add_argument("--chunks-per-rank", help="interleaved placement: e.g. vision=2,audio=1")
    parser.add_argument(
        "--encoder-sub-microbatch-tokens",
        type=number(int, zero=True),
        help="encoder tokens per sub-microbatch, as the trainer's flag (default: the model "
        "config's, else one sub per encoder and microbatch)",
    )
    parser.add_argument("--memory", choices=["none", "recompute", "offload"], help="every stage")
    parser.add_argument(
        "--pad",
        choices=["megatron", "none", "packed"],
        default="megatron",
        help="pad microbatches when PP > 1 as the baseline trainer does; packed: Megatron-LM's "
        "packed sequences (each rank's samples packed first-fit decreasing into sequences of "
        "micro batch x sequence length tokens, one per microbatch, padded)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FLAG=VALUE",
        help="override a model flag, e.g. --set pipeline-model-parallel-size=2",
    )
    parser.add_argument("--calibration", help="calibration JSON (tools/calibrate.py)")
    parser.add_argument(
        "--strict-calibration",
        action="store_true",
        help="refuse a calibration whose host probe differs from this host's by more than 10%%, "
        "instead of warning and scaling its times",
    )
    parser.add_argument("--replicas", type=number(int), help="simulate only this many DP replicas")
    parser.add_argument(
        "--balancer-bytes", help="JSON: phase -> bytes per device or DP x DP matrix"
    )
    semu_balance.add_arguments(parser)
    parser.add_argument("--no-check", action="store_true", help="skip the static checker")
    parser.add_argument("--no-reuse", action="store_true", help="disable the reuse caches")
    parser.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    parser.add_argument("--png", help="write a PNG timeline here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Simulate the step the arguments describe; print its summary, or JSON with ``--json``.

    Args:
        argv: command-line arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0, or 2 after an ``error:`` line.
    """
    args = build_parser().parse_args(argv)
    configs = quiet_config_files()
    from megatron.mllm.layout_choice import choose_layout
    from megatron.mllm.partitioning import layer_costs, partition_plan, sub_microbatch_units

    try:
        cluster = ClusterSpec.load(configs.find_config(args.cluster))
        # The cluster's devices are the run's processes: they fix DP and the checks on it.
        sets = parse_sets(args.set)
        extra = configs.set_flags({**sets, **trainer_layout_flags(args, sets)})
        extra += semu_balance.balance_flags(args, sets, cluster.devices_per_node)
        loaded = configs.load_run_config(args.model, extra, world_size=cluster.num_devices)
        spec = semu_balance.with_sharding(loaded.semu, args)
        post_balance = loaded.run.balance.post_balance
        semu_balance.check_flags(args, post_balance)
        check_samples = _sample_checks(loaded.run)
        calibration = None
        if args.calibration:
            calibration = load_calibration(args.calibration, strict=args.strict_calibration)
        semu = Semu(
            spec,
            cluster,
            calibration,
            reuse=not args.no_reuse,
            overlap_grad_reduce=args.overlap_grad_reduce,
            bucket_params=args.ddp_bucket_size,
            overlap_param_gather=args.overlap_param_gather,
            # OrchWeave's steps gather as megatron.mllm.param_gather does; Megatron's own step
            # (no balancing, megatron-core's engine) stands for upstream Megatron-LM's chain.
            gathers_at_once=post_balance != "none" or loaded.run.uses_runtime,
        )
        balanced, held, plan = None, {}, None
        if post_balance != "none" and spec.parallel.pipeline == 1:
            t0 = time.perf_counter()
            result, balanced, info = semu_balance.phase_balanced_step(
                semu,
                loaded,
                calibration,
                workload=args.workload,
                seed=args.seed,
                token_scale=args.token_scale,
                iteration=args.iteration,
                memory=args.memory,
                record_events=True,
            )
            info["simulation_s"] = time.perf_counter() - t0
        else:
            plan = partition_plan(loaded.run, loaded.model, args.calibration)
            costs, placement = None, args.placement
            if placement is None and spec.parallel.pipeline_layout == "auto":
                choice = choose_layout(loaded.run, loaded.model, cluster, calibration)
                placement, costs = choice.layout, choice.layer_costs
            elif (placement or spec.parallel.pipeline_layout) == "balanced-cost":
                costs, _ = layer_costs(loaded.run, loaded.model, args.calibration)
            if post_balance != "none":
                held["balance"] = semu_balance.sample_balancer(
                    semu, loaded, calibration, args.iteration, held
                )
            elif args.pad == "packed" or loaded.run.workload.pack_sequences:
                # The trainer's --pack-sequences is Megatron's packed baseline.
                held["balance"] = semu_balance.packed_baseline(semu, spec, args.iteration)
            schedules, mbs, info = build_step(
                spec,
                cluster,
                schedule=args.schedule,
                placement=placement,
                chunks_per_rank=_chunks_per_rank(args),
                memory=args.memory,
                pad=args.pad != "none",
                workload=args.workload,
                seed=args.seed,
                token_scale=args.token_scale,
                iteration=args.iteration,
                replicas=args.replicas,
                encoder_sub_microbatch_tokens=args.encoder_sub_microbatch_tokens,
                encoder_sub_microbatch_units=sub_microbatch_units(loaded.run, plan),
                partition=plan,
                run_checker=not args.no_check,
                balance=held.get("balance"),
                check_samples=check_samples,
                layer_costs=costs,
            )
            if plan is not None:
                info["partition"] = {
                    "chunks_per_stage": dict(plan.chunks_per_stage),
                    "sub_microbatch_units": dict(plan.sub_microbatch_units),
                    "splits": {m: [list(r) for r in rs] for m, rs in plan.splits.items()},
                }
            balancer = None
            if args.balancer_bytes:
                balancer = load_balancer_bytes(args.balancer_bytes, info["dp"])
            balanced = held.get("batches")
            t0 = time.perf_counter()
            result = semu.simulate_step(
                schedules,
                mbs,
                balancer_bytes=balancer,
                start_delay=balanced.exchange_s if balanced is not None else None,
            )
            info["simulation_s"] = time.perf_counter() - t0
        info["post_balance"] = post_balance
        info["overlap_grad_reduce"] = args.overlap_grad_reduce
        info["overlap_param_gather"] = args.overlap_param_gather
        info["data_parallel_sharding"] = spec.parallel.data_parallel_sharding
        if balanced is not None:
            info["balance"] = semu_balance.balance_info(balanced)
    except (WorkloadError, ScheduleError, ValueError) as e:  # ConfigError is a ValueError
        return report_error(str(e))
    except OSError as e:
        return report_error(f"{e.filename}: {e.strerror}")
    try:
        if args.trace:
            trace.write_chrome_trace(result, args.trace, name=f"{spec.name} {info['schedule']}")
        if args.png:
            trace.write_png(
                result,
                args.png,
                title=f"{spec.name} on {cluster.name}, {info['schedule']}: step "
                f"{result.step_time_s * 1e3:.1f} ms, bubble {result.bubble_ratio:.1%}, "
                f"MFU {result.mfu:.1%}",
            )
    except ImportError as e:  # matplotlib is optional
        return report_error(str(e))
    except OSError as e:
        return report_error(f"cannot write {e.filename}: {e.strerror}")
    if args.json:
        print(json.dumps({**result.to_json(), "config": info}))
    else:
        header = [
            f"SEMU: {spec.name} on {cluster.name} ({cluster.device.name} x {cluster.num_devices}), "
            f"TP={info['tp']} PP={info['pp']} DP={info['dp']}, schedule {info['schedule']} "
            f"({info['placement']} placement), {info['num_microbatches']} microbatches per "
            f"replica, workload {info['workload']} iteration {info['iteration']}"
            + (f", post-balance {info['post_balance']}" if info["post_balance"] != "none" else "")
            + (", overlapped DP gradient reduction" if info["overlap_grad_reduce"] else "")
            + (
                f", {info['replicas_simulated']} replicas simulated"
                if info["replicas_simulated"] < info["dp"]
                else ""
            )
        ]
        if plan is not None:
            header += plan.explain()
        print(trace.summary(result, header))
        print(f"simulated in {info['simulation_s'] * 1e3:.1f} ms")
    return 0
