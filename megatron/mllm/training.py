# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The training loop of ``scripts/pretrain_mllm.py``, on megatron-core.

Megatron-LM's ``pretrain()`` does not build parallel groups on a machine without GPUs, so
OrchWeave drives megatron-core directly: parallel state, DDP, the optimizer, the parameter
scheduler and ``get_forward_backward_func()`` are megatron-core's; the loop, the data and the
logging are ours, in Megatron's style.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from datetime import timedelta
from functools import partial
from typing import Any

from megatron.mllm import cpu_shim

cpu_shim.apply()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import (  # noqa: E402
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.mllm import checkpointing  # noqa: E402
from megatron.mllm.balanced import PostBalancer  # noqa: E402
from megatron.mllm.batch import PackedMicrobatch, build_microbatch  # noqa: E402
from megatron.mllm.config import mllm_config_from_args  # noqa: E402
from megatron.mllm.data import SampleSource, SyntheticTask, check_fits  # noqa: E402
from megatron.mllm.metrics import (  # noqa: E402
    IntervalStats,
    batch_tokens,
    format_log_line,
    imbalance,
    phase_costs,
    write_metrics,
)
from megatron.mllm.model import PipelineStageModel, baseline_stage_chunks  # noqa: E402
from megatron.mllm.pipeline import (  # noqa: E402
    RuntimeModel,
    build_pipeline_microbatch,
    runtime_placement,
    schedule_function,
)
from orchestration.calibration import Calibration  # noqa: E402
from orchestration.packing import microbatch_indices  # noqa: E402
from pipeweaver.ir import Memory  # noqa: E402
from pipeweaver.runtime.executor import PipelineRuntime  # noqa: E402
from pipeweaver.runtime.p2p import PipelineP2P  # noqa: E402

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StepResult:
    """What one training iteration produced on this rank."""

    loss_sum: float | None
    """Sum of the per-token loss over the global batch (last pipeline stage only)."""

    loss_tokens: float | None
    """Tokens in that sum (last pipeline stage only)."""

    grad_norm: float | None
    """Gradient norm before clipping."""

    update_successful: bool
    """False when the optimizer skipped the step (fp16 overflow)."""

    @property
    def loss(self) -> float | None:
        """Mean per-token LM loss of the global batch."""
        if self.loss_sum is None:
            return None
        return self.loss_sum / max(self.loss_tokens, 1.0)


def initialize_distributed(args) -> torch.device:
    """Start torch.distributed (NCCL on GPUs, gloo on CPU) and megatron-core parallel state."""
    if torch.cuda.is_available():
        backend = args.distributed_backend
        local_rank = int(os.getenv("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        if args.distributed_backend != "gloo":
            logger.info(
                "no CUDA device: using the gloo backend instead of %s", args.distributed_backend
            )
        backend = "gloo"
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(minutes=args.distributed_timeout_minutes),
            world_size=args.world_size,
            rank=int(os.getenv("RANK", "0")),
        )
    if dist.get_world_size() != args.world_size:
        raise RuntimeError(
            f"torch.distributed has {dist.get_world_size()} ranks, expected {args.world_size}"
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        distributed_timeout_minutes=args.distributed_timeout_minutes,
    )
    cpu_shim.model_parallel_manual_seed(args.seed)
    torch.manual_seed(args.seed)
    return device


def _optimizer_config(args) -> OptimizerConfig:
    # Megatron's flags carry OptimizerConfig's field names.
    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    kwargs = {k: getattr(args, k) for k in fields if hasattr(args, k)}
    return OptimizerConfig(**kwargs)


def _ddp_config(args) -> DistributedDataParallelConfig:
    fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    kwargs = {k: getattr(args, k) for k in fields if hasattr(args, k)}
    kwargs["grad_reduce_in_fp32"] = args.accumulate_allreduce_grads_in_fp32
    kwargs["check_for_nan_in_grad"] = args.check_for_nan_in_loss_and_grad
    kwargs["overlap_grad_reduce"] = False
    kwargs["use_distributed_optimizer"] = False
    return DistributedDataParallelConfig(**kwargs)


def _scheduler(args, optimizer) -> OptimizerParamScheduler:
    # Steps count samples, as in Megatron-LM's iteration-based training.
    gbs = args.global_batch_size
    decay_iters = args.lr_decay_iters or args.train_iters
    warmup = (
        args.lr_warmup_fraction * decay_iters * gbs
        if args.lr_warmup_fraction is not None
        else args.lr_warmup_iters * gbs
    )
    return OptimizerParamScheduler(
        optimizer,
        init_lr=args.lr_warmup_init,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay_iters * gbs,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.start_weight_decay,
        end_wd=args.end_weight_decay,
        wd_incr_steps=args.train_iters * gbs,
        wd_incr_style=args.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler,
    )


class Trainer:
    """One rank's share of an OrchWeave training run."""

    def __init__(self, args):
        self.args = args
        # Opened before any collective: a bad workload fails every rank the same way, at once.
        self.source = SampleSource(args.workload, args.workload_seed, args.workload_token_scale)
        self.device = initialize_distributed(args)
        self.pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.num_microbatches = args.global_batch_size // (args.micro_batch_size * self.dp_size)
        # Megatron's pipeline schedules need one fixed activation shape.
        self.pad_to = args.seq_length * args.micro_batch_size if self.pp_size > 1 else None

        self.mllm = mllm_config_from_args(args)
        self.shape = self.mllm.shape()
        self.task = SyntheticTask(
            vocab_size=args.vocab_size,
            num_classes=args.synthetic_num_classes,
            input_dims={name: enc.input_dim for name, enc in self.mllm.encoders.items()},
            seed=args.workload_seed,
        )

        self.runtime = None
        # Without pipeline parallelism there is no pipeline to schedule.
        self.use_runtime = args.pipeline_schedule != "megatron" and self.pp_size > 1
        if not self.use_runtime:
            chunks = baseline_stage_chunks(self.mllm, self.pp_rank, self.pp_size)
            self.model = PipelineStageModel(self.mllm, chunks, self.pg_collection)
        else:
            # OrchWeave's runtime shapes every tensor from metadata: no padding.
            self.pad_to = None
            self.placement = runtime_placement(
                args.pipeline_schedule,
                self.pp_size,
                self.mllm,
                {m: getattr(args, f"{m}_chunks_per_stage") for m in ("vision", "audio", "llm")},
            )
            self.model = RuntimeModel(self.mllm, self.placement, self.pp_rank, self.pg_collection)
        self.model = self.model.to(self.device)
        self.ddp_model = DistributedDataParallel(
            config=self.mllm.language,
            ddp_config=_ddp_config(args),
            module=self.model,
            pg_collection=self.pg_collection,
        )
        self.optimizer = get_megatron_optimizer(
            _optimizer_config(args),
            [self.ddp_model],
            use_gloo_process_groups=False,
            pg_collection=self.pg_collection,
        )
        self.scheduler = _scheduler(args, self.optimizer)
        config = self.mllm.language
        config.no_sync_func = self.ddp_model.no_sync
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        if not self.use_runtime:
            self.forward_backward_func = get_forward_backward_func(
                pp_size=self.pp_size, vp_size=None
            )
        else:
            memory = Memory.RECOMPUTE if args.pipeline_recompute == "all" else Memory.NONE
            self.runtime = PipelineRuntime(
                self.placement,
                self.model.stage,
                PipelineP2P(self.pg_collection.pp),
                schedule_function(args.pipeline_schedule, self.shape, memory),
                self.device,
                config.pipeline_dtype or config.params_dtype,
            )
            self.forward_backward_func = self.runtime.forward_backward
        self.balancer = None
        self.balance_stats = None
        if args.post_balance != "none":
            calibration = Calibration.load(args.cost_calibration) if args.cost_calibration else None
            self.balancer = PostBalancer(
                self,
                args.post_balance,
                phases=args.balance_phases,
                node_wise=args.node_wise_a2a,
                gpus_per_node=args.gpus_per_node,
                check_digest=args.check_plan_digest,
                caps=args.post_balance_caps,
                calibration=calibration,
            )
        self.iteration = 0
        if args.load:
            self.iteration = checkpointing.load_checkpoint(
                args.load,
                self.ddp_model,
                self.optimizer,
                self.scheduler,
                self.layout,
                self.tp_rank,
                self.pp_rank,
                load_optim=not args.no_load_optim,
                load_rng=not args.no_load_rng,
            )

    @property
    def layout(self) -> dict[str, Any]:
        """The parallel layout and chunk placement, as stored in checkpoints."""
        chunks = [
            f"{m}{c}:{a}-{b}" for m, c in self.model_chunks() for a, b in [self._layer_range(m, c)]
        ]
        return {
            "tp": self.args.tensor_model_parallel_size,
            "pp": self.pp_size,
            "dp": self.dp_size,
            "chunks": chunks,
        }

    def model_chunks(self) -> list[tuple[str, int]]:
        """``(module, chunk index)`` of the chunks on this rank."""
        if self.runtime is not None:
            return self.placement.chunks_on(self.pp_rank)
        return [(c.module, 0 if c.module != "llm" else self.pp_rank) for c in self.model.chunk_ids]

    def _layer_range(self, module: str, chunk: int) -> tuple[int, int]:
        if self.runtime is not None:
            return self.placement.layer_range(module, chunk)
        cid = next(c for c in self.model.chunk_ids if c.module == module)
        return cid.start, cid.stop

    # ----------------------------------------------------------------------------- data

    def global_batch_indices(self, iteration: int) -> list[list[list[int]]]:
        """Stream indices of every DP rank's microbatches: ``[dp_rank][microbatch][sample]``."""
        return [
            microbatch_indices(
                iteration, d, self.dp_size, self.args.micro_batch_size, self.num_microbatches
            )
            for d in range(self.dp_size)
        ]

    @property
    def needs_features(self) -> bool:
        """Whether this rank runs an encoder's input layer (and so needs pixels/features)."""
        if self.runtime is not None:
            return self.model.holds_encoder_inputs
        return self.pp_rank == 0

    def pack(self, samples: list[tuple[Any, Any]]):
        """One microbatch of ``(metadata, payload)`` pairs, as this run's schedule consumes it:
        padded for megatron-core's pipeline, unpadded with sub-microbatches for the runtime."""
        if self.runtime is not None:
            return build_pipeline_microbatch(
                samples,
                self.mllm,
                self.device,
                self.needs_features,
                self.args.encoder_sub_microbatch_tokens or None,
            )
        return build_microbatch(
            samples,
            list(self.mllm.encoders),
            pad_to=self.pad_to,
            device=self.device,
            with_features=self.needs_features,
            max_pad_run=self.args.seq_length,
        )

    def microbatches(self, indices: list[list[int]]) -> list:
        """Build this rank's microbatches from stream indices."""
        out = []
        for mb in indices:
            samples = []
            for k in mb:
                meta = self.source.meta(k)
                samples.append((meta, self.task.payload(meta, k, self.needs_features)))
            out.append(self.pack(samples))
        return out

    # ----------------------------------------------------------------------------- step

    @staticmethod
    def _loss_func(loss_mask: torch.Tensor, output: torch.Tensor):
        loss = torch.sum(output.float().view(-1) * loss_mask)
        num_tokens = loss_mask.sum().to(torch.int)
        report = torch.cat([loss.detach().view(1), num_tokens.detach().float().view(1)])
        return loss, num_tokens, {"lm loss": report}

    def _forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        return model(batch), partial(self._loss_func, batch.language.loss_mask)

    def local_samples(self, iteration: int) -> list[tuple[int, Any]]:
        """This DP rank's ``(stream index, metadata)`` for ``iteration``, in loading order."""
        indices = self.global_batch_indices(iteration)[self.dp_rank]
        return [(k, self.source.meta(k)) for mb in indices for k in mb]

    def run_iteration(self, iteration: int):
        """Forward and backward of one global batch, balanced or not; returns the loss dicts."""
        self.balance_stats = None
        if self.balancer is None:
            indices = self.global_batch_indices(iteration)[self.dp_rank]
            return self.forward_backward(self.microbatches(indices))
        local = self.local_samples(iteration)
        if self.pp_size == 1:
            self.ddp_model.zero_grad_buffer()
            self.optimizer.zero_grad()
            losses, self.balance_stats = self.balancer.forward_backward(local)
            return losses
        microbatches, self.balance_stats = self.balancer.whole_sample_microbatches(local)
        # Each pipeline stage moved what it needs within its own DP group: add them up.
        moved = torch.tensor(
            [self.balance_stats.bytes_moved], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(moved, group=self.pg_collection.pp)
        self.balance_stats.bytes_moved = int(moved.item())
        return self.forward_backward(microbatches)

    def forward_backward(self, microbatches: list[PackedMicrobatch], forward_only: bool = False):
        """Run megatron-core's schedule over this rank's microbatches; returns its loss dicts."""
        self.ddp_model.zero_grad_buffer()
        self.optimizer.zero_grad()
        seq_length = self.pad_to if self.pad_to is not None else self.args.seq_length
        return self.forward_backward_func(
            forward_step_func=self._forward_step,
            data_iterator=iter(microbatches),
            model=[self.ddp_model],
            num_microbatches=len(microbatches),
            seq_length=seq_length,
            micro_batch_size=1,
            forward_only=forward_only,
        )

    def train_step(self, iteration: int) -> StepResult:
        """One iteration: data, forward/backward, optimizer and scheduler step."""
        everyone = self.global_batch_indices(iteration)
        for d, rank_indices in enumerate(everyone):
            check_fits(
                [(k, self.source.meta(k)) for mb in rank_indices for k in mb],
                self.args.seq_length,
                d,
            )
        losses = self.run_iteration(iteration)
        update_successful, grad_norm, _ = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=self.args.global_batch_size)
        loss_sum = loss_tokens = None
        if losses:
            total = torch.stack([d["lm loss"] for d in losses]).sum(0)
            dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
            loss_sum, loss_tokens = float(total[0]), float(total[1])
        return StepResult(
            loss_sum,
            loss_tokens,
            None if grad_norm is None else float(grad_norm),
            update_successful,
        )

    def main_grads(self) -> dict[str, torch.Tensor]:
        """This rank's gradients after finalize_model_grads, by layout-independent name."""
        names = self.model.global_param_names()
        return {
            names[n]: p.main_grad.detach().clone().cpu()
            for n, p in self.model.named_parameters()
            if getattr(p, "main_grad", None) is not None
        }

    def parameters_by_name(self) -> dict[str, torch.Tensor]:
        """This rank's parameters, by layout-independent name."""
        names = self.model.global_param_names()
        return {names[n]: p.detach().clone().cpu() for n, p in self.model.named_parameters()}

    # ----------------------------------------------------------------------------- loop

    def iteration_metrics(self, iteration: int) -> dict[str, Any]:
        """Metadata-derived figures of one global batch: samples, tokens, FLOPs, imbalance."""
        everyone = self.global_batch_indices(iteration)
        per_rank_meta = [[[self.source.meta(k) for k in mb] for mb in r] for r in everyone]
        samples = [s for r in per_rank_meta for mb in r for s in mb]
        costs = [
            phase_costs(self.shape, r, self.pad_to, self.args.seq_length) for r in per_rank_meta
        ]
        return {
            "samples": len(samples),
            "tokens": batch_tokens(samples),
            "flops": self.shape.batch_flops(samples),
            "imbalance": imbalance(costs) if self.dp_size > 1 else {k: 1.0 for k in costs[0]},
        }

    def train(self) -> list[StepResult]:
        """Train until ``--train-iters``, logging and checkpointing like Megatron-LM."""
        args = self.args
        is_logger = dist.get_rank() == dist.get_world_size() - 1
        stats = IntervalStats()
        results = []
        if dist.get_rank() == 0:
            self._print_setup()
        while self.iteration < args.train_iters:
            start = time.perf_counter()
            result = self.train_step(self.iteration)
            seconds = time.perf_counter() - start
            self.iteration += 1
            results.append(result)
            m = self.iteration_metrics(self.iteration - 1)
            balanced = self.balance_stats
            if balanced is not None:
                # Before and after both come from the plan's cost model, so they compare.
                m["imbalance"] = dict(balanced.imbalance_before)
                m["imbalance_balanced"] = balanced.imbalance_after
                m["bytes_moved"] = balanced.bytes_moved
                m["moved_fraction"] = balanced.moved_fraction
                m["num_microbatches"] = balanced.num_microbatches
            stats.add(
                seconds,
                m["samples"],
                m["tokens"],
                m["flops"],
                m["imbalance"],
                None if balanced is None else balanced.imbalance_after,
                0 if balanced is None else balanced.bytes_moved,
            )
            if is_logger and args.metrics_jsonl:
                write_metrics(
                    args.metrics_jsonl,
                    {
                        "iteration": self.iteration,
                        "lm_loss": result.loss,
                        "iteration_time_s": seconds,
                        "grad_norm": result.grad_norm,
                        "learning_rate": self.optimizer.param_groups[0]["lr"],
                        **m,
                    },
                )
            if is_logger and self.iteration % args.log_interval == 0:
                print(
                    format_log_line(
                        self.iteration,
                        args.train_iters,
                        self.iteration * args.global_batch_size,
                        stats,
                        dist.get_world_size(),
                        self.optimizer.param_groups[0]["lr"],
                        args.global_batch_size,
                        result.loss,
                        result.grad_norm,
                    ),
                    flush=True,
                )
                stats = IntervalStats()
            saved = False
            if args.save and args.save_interval and self.iteration % args.save_interval == 0:
                self.save()
                saved = True
            if args.exit_interval and self.iteration % args.exit_interval == 0:
                if args.save and not saved:
                    self.save()
                if dist.get_rank() == 0:
                    print(f" exiting program at iteration {self.iteration}", flush=True)
                return results
        if args.save and (not args.save_interval or self.iteration % args.save_interval != 0):
            self.save()
        return results

    def save(self) -> None:
        """Save a checkpoint of the current iteration under ``--save``."""
        path = checkpointing.save_checkpoint(
            self.args.save,
            self.iteration,
            self.ddp_model,
            self.optimizer,
            self.scheduler,
            self.layout,
            self.dp_rank,
            self.tp_rank,
            self.pp_rank,
        )
        if dist.get_rank() == 0:
            print(
                f" saved checkpoint at iteration {self.iteration:7d} to {self.args.save}",
                flush=True,
            )
        logger.debug("rank %d wrote %s", dist.get_rank(), path)

    def _placement_text(self) -> str:
        return ", ".join(
            f"{m} {self.placement.num_chunks(m)} chunks" for m in self.placement.modules
        )

    def _print_setup(self) -> None:
        args = self.args
        params = sum(p.numel() for p in self.model.parameters())
        encs = ", ".join(
            f"{n}: {e.num_layers} layers x {e.hidden_size}" for n, e in self.mllm.encoders.items()
        )
        if self.balancer is None:
            balance = "post-balance: none"
        elif self.pp_size == 1:
            balance = f"post-balance: {args.post_balance}, per phase {args.balance_phases}"
        else:
            balance = f"post-balance: {args.post_balance}, whole samples across DP groups"
        if args.node_wise_a2a and self.balancer is not None:
            balance += f", node-wise all-to-all ({args.gpus_per_node} ranks per node)"
        schedule = self.forward_backward_func.__name__
        if self.runtime is not None:
            schedule = f"{args.pipeline_schedule} (OrchWeave runtime, {self._placement_text()})"
        if self.balancer is not None and self.pp_size == 1:
            schedule = "orchestrated two-hop (encoders, then LLM microbatches)"
        if self.runtime is None:
            layout = (
                f"encoders on stage 0 ({encs}) | LLM {args.num_layers} layers x "
                f"{args.hidden_size}, {args.num_layers // self.pp_size} per stage"
            )
        else:
            layout = f"encoders: {encs} | LLM {args.num_layers} layers x {args.hidden_size}"
        print(
            f"> OrchWeave: TP={args.tensor_model_parallel_size} PP={self.pp_size} "
            f"DP={self.dp_size} | {balance} | schedule: {schedule} | {layout} | "
            f"{self.num_microbatches} microbatches "
            f"of {args.micro_batch_size} samples per rank | workload {args.workload} "
            f"(token scale {args.workload_token_scale}) | parameters on rank 0: {params}",
            flush=True,
        )
        if self.iteration:
            print(f"> resuming after iteration {self.iteration} from {args.load}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/pretrain_mllm.py``."""
    from megatron.mllm.arguments import ConfigError, parse_arguments
    from megatron.mllm.data import SequenceTooLongError
    from orchestration.balance import InfeasibleCapError
    from orchestration.dispatcher import PlanDigestMismatch
    from orchestration.workload import WorkloadError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        args = parse_arguments(argv)
        trainer = Trainer(args)
        trainer.train()
    except (
        ConfigError,
        WorkloadError,
        SequenceTooLongError,
        checkpointing.CheckpointError,
        PlanDigestMismatch,
        InfeasibleCapError,
    ) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
