# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The training loop of ``scripts/pretrain_mllm.py``, on megatron-core.

Megatron-LM's ``pretrain()`` does not build parallel groups on a machine without GPUs, so
OrchWeave drives megatron-core directly: parallel state, DDP, the optimizer, the parameter
scheduler and the pipeline schedules are megatron-core's; the loop, the data and the logging
are ours, in Megatron's style. One iteration, as data flows::

    BatchLoader.load     this DP rank's samples (Megatron's order) + every rank's metadata
    step(...)            the mode chosen at start-up (megatron.mllm.steps): forward, backward
    optimizer.step()     megatron-core's optimizer and parameter scheduler

The loop does not know which step runs: every step has megatron-core's
``forward_backward_func`` contract and is called with this module's :func:`forward_step`.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from functools import partial
from typing import Any

from megatron.mllm import cpu_shim

cpu_shim.apply()

import torch  # noqa: E402

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import finalize_model_grads  # noqa: E402
from megatron.core.optimizer import get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: E402
from megatron.mllm import (  # noqa: E402
    checkpointing,
    data_state,
    distributed,
    grad_overlap,
    logs,
    param_gather,
)
from megatron.mllm.arguments import (  # noqa: E402
    ConfigError,
    check_tensor_parallel,
    parse_arguments,
)
from megatron.mllm.config import mllm_config  # noqa: E402
from megatron.mllm.data import (  # noqa: E402
    BatchLoader,
    GlobalBatch,
    SequenceTooLongError,
    SyntheticTask,
    check_stream_encoders,
)
from megatron.mllm.data_energon import stream_from_run  # noqa: E402
from megatron.mllm.iteration_log import IterationLog  # noqa: E402
from megatron.mllm.metrics import iteration_metrics  # noqa: E402
from megatron.mllm.partitioning import partition_plan  # noqa: E402
from megatron.mllm.prediction import StepInputs, StepPredictor  # noqa: E402
from megatron.mllm.profiling import MemoryHistory, StepProfiler  # noqa: E402
from megatron.mllm.reporting import MetricWriters  # noqa: E402
from megatron.mllm.run_config import RunConfig  # noqa: E402
from megatron.mllm.steps import build_stage_model, build_step  # noqa: E402
from megatron.mllm.timers import StepTimers  # noqa: E402
from megatron.mllm.unsupported_flags import check_trainer_flags  # noqa: E402
from orchestration import host_probe  # noqa: E402
from orchestration.balance import InfeasibleCapError  # noqa: E402
from orchestration.calibration import Calibration  # noqa: E402
from orchestration.dispatcher import CollectiveError, Dispatcher  # noqa: E402
from orchestration.metadata import PlanError  # noqa: E402
from orchestration.workload import WorkloadError  # noqa: E402
from orchestration.workload_spec import SampleStream  # noqa: E402
from pipeweaver.runtime.p2p import TransferError  # noqa: E402

logger = logging.getLogger(__name__)

STREAM_CHECK_SAMPLES = 10_000
"""The most samples of the workload checked against the model's encoders before the process
groups start (a spec is looked at only if it can draw a modality the model cannot read, and
the scan stops at the first such sample); the loader checks every batch it loads."""


@dataclasses.dataclass
class IterationResult:
    """What one training iteration produced on this rank."""

    loss_sum: float | None
    """Sum of the per-token loss over the global batch (last pipeline stage only)."""

    loss_tokens: float | None
    """Tokens in that sum (last pipeline stage only)."""

    grad_norm: float | None
    """Gradient norm before clipping."""

    update_successful: bool
    """False when the optimizer skipped the step (fp16 overflow)."""

    batch: GlobalBatch | None = None
    """The global batch it trained on (its metadata feeds the log line)."""

    @property
    def loss(self) -> float | None:
        """Mean per-token LM loss of the global batch."""
        if self.loss_sum is None:
            return None
        return self.loss_sum / max(self.loss_tokens, 1.0)


def loss_func(loss_mask: torch.Tensor, output: torch.Tensor):
    """Per-token LM loss of one microbatch: (summed loss, loss tokens, report), Megatron's
    ``--calculate-per-token-loss`` triple."""
    loss = torch.sum(output.float().view(-1) * loss_mask)
    num_tokens = loss_mask.sum().to(torch.int)
    report = torch.cat([loss.detach().view(1), num_tokens.detach().float().view(1)])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator, model):
    """megatron-core's ``forward_step_func``: one microbatch through ``model``."""
    batch = next(data_iterator)
    return model(batch), partial(loss_func, batch.language.loss_mask)


def _scheduler(run: RunConfig, optimizer) -> OptimizerParamScheduler:
    # Steps count samples, as in Megatron-LM's iteration-based training.
    s, gbs = run.scheduler, run.global_batch_size
    train_iters = run.training.train_iters
    decay_iters = s.lr_decay_iters or train_iters
    warmup = (
        s.lr_warmup_fraction * decay_iters * gbs
        if s.lr_warmup_fraction is not None
        else s.lr_warmup_iters * gbs
    )
    return OptimizerParamScheduler(
        optimizer,
        init_lr=s.lr_warmup_init,
        max_lr=run.optimizer.lr,
        min_lr=run.optimizer.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=decay_iters * gbs,
        lr_decay_style=s.lr_decay_style,
        start_wd=s.start_weight_decay,
        end_wd=s.end_weight_decay,
        wd_incr_steps=train_iters * gbs,
        wd_incr_style=s.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=s.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=s.override_opt_param_scheduler,
    )


def _host_calibration(run: RunConfig) -> Calibration | None:
    """``--cost-calibration`` as it holds on this host (:func:`orchestration.host_probe.
    fit_to_host`): rank 0 probes the host and every rank adopts its probe, so that every rank
    scales the balancer's costs alike (the cost model, ``CostModel.build``, rescales with it
    too). Only rank 0 warns; with ``--strict-calibration`` every rank refuses alike.

    Raises:
        ConfigError: ``--strict-calibration`` and a calibration from a host of another speed.
    """
    path = run.balance.cost_calibration
    if not path:
        return None
    rank = distributed.global_rank()
    if host_probe.probe_enabled():
        probe = host_probe.host_probe() if rank == 0 else None
        host_probe.adopt_probe(distributed.all_gather_objects(probe)[0])
    try:
        return host_probe.fit_to_host(
            Calibration.load(path),
            strict=run.balance.strict_calibration,
            warn=host_probe.warn_line if rank == 0 else host_probe.mark_warned,
        )
    except host_probe.CalibrationHostError as e:
        raise ConfigError(f"--cost-calibration {e}") from None


class Trainer:
    """One rank's share of an OrchWeave training run."""

    def __init__(self, run: RunConfig):
        if run.training.train_iters is None:
            raise ConfigError("--train-iters is required to train")
        if run.args.lr is None:  # Megatron has no default; its optimizer fails without one
            raise ConfigError("--lr is required to train (the peak learning rate)")
        check_tensor_parallel(run.args)
        check_trainer_flags(run.args)
        self.run = run
        w = run.workload
        # Opened before any collective: a bad workload fails every rank the same way, at once.
        if run.data is not None:
            # Real data: each rank reads only its own samples, so the loader checks each batch
            # (and shares any rank's reading error) rather than every rank reading ahead here.
            stream = stream_from_run(run)
        else:
            stream = SampleStream(w.workload, w.workload_seed, w.workload_token_scale)
            trained = run.training.train_iters * run.global_batch_size
            check_stream_encoders(stream, tuple(run.encoders), min(trained, STREAM_CHECK_SAMPLES))
        self.device = distributed.initialize_distributed(run)
        self.pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.mllm = mllm_config(run)
        self.shape = self.mllm.shape()
        self.calibration = _host_calibration(run)
        log = run.logger
        self.timers = StepTimers(
            log.timing_log_level,
            log.timing_log_option,
            sync=torch.cuda.synchronize if torch.cuda.is_available() else None,
            # megatron-core's gradient reduction and the trainer's loss sum run over DP.
            groups=dict.fromkeys(
                ("all-grads-sync", "loss-reduce"), distributed.group_ranks(self.pg_collection.dp)
            ),
        )
        rank, world = distributed.global_rank(), run.parallel.world_size
        self.profiler = StepProfiler(run, self.timers, rank, world)
        self.memory_history = MemoryHistory(run, rank, world)
        self.writers = _metric_writers(run, rank, world)
        if self.timers.level or self.profiler.collects:
            # megatron-core's schedules, finalize_model_grads and optimizer time themselves
            # through config.timers, as in Megatron-LM.
            self.mllm.language.timers = self.timers
            run.optimizer.timers = self.timers
        self.clock_offsets = distributed.clock_offsets() if self.timers.level else None
        # Every rank plans the same partition (flags, calibration, workload): no messages.
        self.partition = partition_plan(run, self.mllm)
        self.predictor = None
        if (run.logging.step_prediction or self.profiler.writes) and rank == world - 1:
            self.predictor = StepPredictor(
                run, self.mllm, world, self.calibration,
                distributed.group_ranks(self.pg_collection.dp),
                distributed.group_ranks(self.pg_collection.pp), self.partition,
            )  # fmt: skip
        self.profiler.predictor = self.predictor
        self.model = build_stage_model(
            run, self.mllm, self.pp_rank, self.pg_collection, self.partition
        )
        self.model = self.model.to(self.device)
        self.ddp_model = distributed.wrap_ddp(
            self.model, self.mllm.language, run.ddp, self.pg_collection
        )
        self.optimizer = get_megatron_optimizer(
            run.optimizer, [self.ddp_model], use_gloo_process_groups=False,
            pg_collection=self.pg_collection,
        )  # fmt: skip
        self.scheduler = _scheduler(run, self.optimizer)
        config = self.mllm.language
        config.no_sync_func = self.ddp_model.no_sync
        config.finalize_model_grads_func = finalize_model_grads
        self.grad_reduce, self.param_gather = None, None
        forward_order = self.model.forward_parameters()
        if run.ddp.overlap_param_gather:
            self.param_gather = param_gather.OrderedParamGather(self.ddp_model, forward_order)
        if run.ddp.overlap_grad_reduce:
            drain = self.param_gather.drain if self.param_gather else None
            self.grad_reduce = grad_overlap.install(self.ddp_model, config, forward_order, drain)
        config.grad_scale_func = self.optimizer.scale_loss
        b = run.balance
        balancing = b.post_balance != "none"
        dispatcher = Dispatcher(
            self.pg_collection.dp,
            node_wise=b.node_wise_a2a and balancing,
            gpus_per_node=b.gpus_per_node,
            timers=self.timers,
        )
        self.step = build_step(
            run, self.mllm, self.model, self.pg_collection, dispatcher, self.device, self.timers,
            self.calibration, stream.chat_turns if run.data is not None else None,
        )  # fmt: skip
        if self.param_gather is not None:
            self.step.before_forward = self.param_gather.start
        share_errors = None
        if run.data is not None:
            task = stream

            def share_errors(problem):
                return next((p for p in distributed.all_gather_objects(problem) if p), None)

        else:
            task = SyntheticTask(
                vocab_size=run.vocab_size,
                num_classes=w.synthetic_num_classes,
                input_dims={name: enc.input_dim for name, enc in self.mllm.encoders.items()},
                seed=w.workload_seed,
            )
        self.loader = BatchLoader(
            stream, task, dispatcher, run.micro_batch_size, run.num_microbatches,
            run.seq_length, with_features=self.model.holds_encoder_inputs,
            encoders=tuple(self.mllm.encoders), timers=self.timers,
            lookahead=self.step.plans_ahead, train_iters=run.training.train_iters,
            share_errors=share_errors, overlong_samples=w.overlong_samples,
        )  # fmt: skip
        self.iteration = 0
        # What checkpoints record of the data, so that a resume reads the same stream.
        self.data_source = data_state.stream_source(run, stream)
        self.ranks = checkpointing.Ranks(self.dp_rank, self.tp_rank, self.pp_rank)
        if run.checkpoint.load:
            c = run.checkpoint
            self.iteration = checkpointing.load_checkpoint(
                c.load, self.ddp_model, self.optimizer, self.scheduler, self.layout, self.ranks,
                ckpt_step=c.ckpt_step, load_optim=c.load_optim, load_rng=c.load_rng,
                step=self.step, data=self.data_source,
            )  # fmt: skip

    @property
    def layout(self) -> dict[str, Any]:
        """The parallel layout, chunk placement and optimizer sharding, as stored in checkpoints."""
        p = self.run.parallel
        return {
            "tp": p.tensor,
            "pp": p.pipeline,
            "dp": self.dp_size,
            "chunks": self.model.layout(),
            "distributed_optimizer": bool(self.run.ddp.use_distributed_optimizer),
            "optimizer_instances": int(self.run.ddp.num_distributed_optimizer_instances),
            # The distributed optimizer's shards follow the gradient buckets.
            "grad_buckets": self.run.ddp.bucket_size if self.run.ddp.overlap_grad_reduce else None,
        }

    # ----------------------------------------------------------------------------- step

    def forward_backward(self, iteration: int) -> tuple[list, GlobalBatch]:
        """Load ``iteration``'s global batch and run the step's forward and backward on it.

        Returns:
            The loss dicts of the microbatches whose loss this rank computed, and the batch.
        """
        timers = self.timers
        with timers("batch-generator", log_level=1):
            batch = self.loader.load(iteration, self.step.control_words(iteration))
        with timers("forward-backward", log_level=1):
            self.ddp_model.zero_grad_buffer()
            self.optimizer.zero_grad()
            losses = self.step(
                forward_step_func=forward_step,
                data_iterator=batch.data_iterator(),
                model=[self.ddp_model],
                num_microbatches=len(batch.microbatches),
                seq_length=self.run.seq_length,
                micro_batch_size=self.run.micro_batch_size,
            )
        return losses, batch

    def train_step(self, iteration: int) -> IterationResult:
        """One iteration: data, forward/backward, optimizer and scheduler step."""
        losses, batch = self.forward_backward(iteration)
        with self.timers("optimizer", log_level=1):
            if self.param_gather is not None:
                self.param_gather.finish()
            update_successful, grad_norm, _ = self.optimizer.step()
            if update_successful:
                self.scheduler.step(increment=self.run.global_batch_size)
        loss_sum = loss_tokens = None
        if losses:
            with self.timers("loss-reduce", log_level=1):
                total = torch.stack([d["lm loss"] for d in losses]).sum(0)
                distributed.sum_over_group(total, self.pg_collection.dp)
                loss_sum, loss_tokens = float(total[0]), float(total[1])
        grad_norm = None if grad_norm is None else float(grad_norm)
        return IterationResult(loss_sum, loss_tokens, grad_norm, update_successful, batch)

    def gather_params(self) -> None:
        """With ``--overlap-param-gather``, gather what the last optimizer step updated now."""
        if self.param_gather is not None:
            self.param_gather.sync()

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

    def step_inputs(self) -> StepInputs | None:
        """What the prediction of the iteration just run needs (``megatron.mllm.prediction``);
        None on ranks that do not predict."""
        if self.predictor is None:
            return None
        step, stats = self.step, self.step.balance_stats
        if stats is not None and stats.predicted_loads:  # the per-phase step's plan
            return StepInputs(
                self.iteration, [], None, None, loads=stats.predicted_loads,
                loads_before=stats.predicted_loads_before, unit=stats.unit,
            )  # fmt: skip
        return StepInputs(self.iteration, step.last_samples, step.last_schedule, step.padded_length,
                          metadata=step.last_metadata, pack_limit=step.pack_limit)  # fmt: skip

    def schedule_actions(self) -> list[str] | None:
        """This rank's actions of the runtime's latest schedule, in order (None without the
        runtime)."""
        schedule = self.step.last_schedule
        return None if schedule is None else [str(a) for a in schedule.actions[self.pp_rank]]

    def metrics(self, result: IterationResult) -> dict[str, Any]:
        """Metadata-derived figures of an iteration: samples, tokens, FLOPs, imbalance."""
        m = iteration_metrics(
            result.batch.metadata,
            self.shape,
            self.run.micro_batch_size,
            self.step.padded_length,
            self.run.seq_length,
        )
        balanced = self.step.balance_stats
        if balanced is not None:
            # Before and after both come from the plan's cost model, so they compare; an
            # iteration the guard left unbalanced keeps the metadata's figures.
            if balanced.balanced:
                m["imbalance"] = dict(balanced.imbalance_before)
            m["imbalance_balanced"] = balanced.imbalance_after or m["imbalance"]
            m["bytes_moved"] = balanced.bytes_moved
            m["moved_fraction"] = balanced.moved_fraction
            m["num_microbatches"] = balanced.num_microbatches
            m["plan_source"] = balanced.plan_source
            m["plan_background_s"] = balanced.plan_background_s
            m["plan_digest"] = balanced.plan_digest
            m["unit"] = balanced.unit
            m["decisions"] = balanced.decisions
            m["balanced"] = balanced.balanced
            m["as_loaded"] = balanced.as_loaded
            if balanced.guard_gain is not None:
                m["balance_guard_gain"] = balanced.guard_gain
        searched = self.step.schedule_record()
        if searched is not None:
            m["schedule_search"] = searched
        return m

    def train(self) -> list[IterationResult]:
        """Train until ``--train-iters``, logging and checkpointing like Megatron-LM."""
        try:
            results = self._train()
            # The parameters are whole when training returns (for whoever reads them next).
            self.gather_params()
            return results
        finally:
            self.step.close()
            self.writers.close()

    def _train(self) -> list[IterationResult]:
        run = self.run
        train_iters = run.training.train_iters
        save, save_interval = run.checkpoint.save, run.checkpoint.save_interval
        exit_interval = run.training.exit_interval
        log = IterationLog(self)
        results = []
        if distributed.global_rank() == 0:
            self._print_setup()
        while self.iteration < train_iters:
            self.profiler.begin(self.iteration)
            start = time.perf_counter()
            result = self.train_step(self.iteration)
            seconds = time.perf_counter() - start
            self.iteration += 1
            results.append(result)
            log.add(result, start, seconds)
            saved = False
            if save and save_interval and self.iteration % save_interval == 0:
                self.save()
                saved = True
            if exit_interval and self.iteration % exit_interval == 0:
                if save and not saved:
                    self.save()
                log.flush()
                if distributed.global_rank() == 0:
                    print(f" exiting program at iteration {self.iteration}", flush=True)
                return results
        log.flush()
        if save and (not save_interval or self.iteration % save_interval != 0):
            self.save()
        return results

    def save(self) -> None:
        """Save a checkpoint of the current iteration under ``--save``."""
        root = self.run.checkpoint.save
        self.gather_params()
        directory = checkpointing.save_checkpoint(
            root, self.iteration, self.ddp_model, self.optimizer, self.scheduler, self.layout,
            self.ranks, step_state=self.step.state_dict(), data=self.data_source,
        )  # fmt: skip
        if distributed.global_rank() == 0:
            print(f" saved checkpoint at iteration {self.iteration:7d} to {root}", flush=True)
        logger.debug("rank %d wrote its files of %s", distributed.global_rank(), directory)

    def _print_setup(self) -> None:
        run = self.run
        p = run.parallel
        params = sum(x.numel() for x in self.model.parameters())
        w = run.workload
        data = f"workload {w.workload} (token scale {w.workload_token_scale})"
        if run.data is not None:
            paths = " ".join(run.data.data_blend) or run.data.data_path
            data = (
                f"data {paths} ({len(self.loader.stream)} samples, Energon, "
                f"{run.data.num_workers} decode workers)"
            )
        loaded = f"{run.num_microbatches} microbatches of {run.micro_batch_size} samples per rank"
        if run.workload.pack_sequences:
            loaded = (f"{run.num_microbatches * run.micro_batch_size} samples per rank packed into "
                      f"sequences of up to {run.packing_limit} tokens")  # fmt: skip
        print(
            f"> OrchWeave: TP={p.tensor} PP={p.pipeline} DP={self.dp_size} | "
            f"{self.step.describe()} | {self.model.describe()} | {loaded} | {data} | parameters "
            f"on rank 0: {params}",
            flush=True,
        )
        if self.grad_reduce is not None:
            n = self.grad_reduce.num_buckets
            print(
                f"> overlapped gradient reduction: {n} bucket{'s' if n > 1 else ''} of about "
                f"{run.ddp.bucket_size} parameters (--ddp-bucket-size), each started in order "
                "once its gradients are final"
                + ("; their parameters all-gathered as the next forward starts, each waited for "
                   "by its first module (--overlap-param-gather)" if self.param_gather else ""),
                flush=True,
            )  # fmt: skip
        if self.partition is not None:
            auto = ", ".join(f"{flag} auto" for flag in run.pipeline.auto_flags)
            print(f"> OrchWeave partitioner ({auto}):", flush=True)
            for line in self.partition.explain():
                print(f">   {line}", flush=True)
        if self.iteration:
            print(
                f"> resuming after iteration {self.iteration} from {run.checkpoint.load}",
                flush=True,
            )


def _metric_writers(run: RunConfig, rank: int, world: int) -> MetricWriters:
    """TensorBoard and wandb (``megatron.mllm.reporting``). Only the last rank opens them, so a
    failure there (wandb cannot start, a directory cannot be made) is shared with every rank:
    all stop with its error line instead of waiting for that rank at the first collective."""
    if not (run.logger.tensorboard_dir or run.logger.wandb_project):
        return MetricWriters()
    writers, problem = MetricWriters(), None
    try:
        writers = MetricWriters.from_run(run, rank, world)
    except ConfigError as e:
        problem = str(e)
    first = next((p for p in distributed.all_gather_objects(problem) if p), None)
    if first is not None:
        writers.close()
        raise ConfigError(first)
    return writers


def _error_line(message: str) -> None:
    """One ``error:`` line on stderr in a single write: the ranks share one pipe under torchrun
    and ``python -u``, where print's separate write of the newline lets lines run together."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/pretrain_mllm.py``."""
    logs.configure(logs.level_from_argv(sys.argv[1:] if argv is None else argv))
    try:
        trainer = Trainer(RunConfig.from_args(parse_arguments(argv)))
        try:
            trainer.train()
        finally:
            # Real data's decode worker processes stop with the run (they would at exit too).
            getattr(trainer.loader.stream, "close", lambda: None)()
    except (
        ConfigError,
        WorkloadError,
        SequenceTooLongError,
        checkpointing.CheckpointError,
        PlanError,
        InfeasibleCapError,
        TransferError,
        CollectiveError,
    ) as e:
        _error_line(str(e))
        return 2
    except RuntimeError as e:
        # A peer that stopped answering, seen by megatron-core's or the trainer's own
        # collectives: one line naming this rank and where it waited, like the errors above.
        failure = distributed.communication_failure(e)
        if failure is None:
            raise
        _error_line(failure)
        return 2
    finally:
        distributed.shutdown()
    return 0
