# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The trainer's distributed setup, and the few collectives it calls itself.

torch.distributed starts here (NCCL on GPUs, gloo on CPU) with megatron-core's parallel state.
Everything else that communicates does so through a component that owns its collectives: the
balancer's :class:`~orchestration.dispatcher.Dispatcher`, the pipeline runtime's
:class:`~pipeweaver.runtime.p2p.PipelineP2P`, and megatron-core (DDP, optimizer, schedules).
The helpers below are the trainer's own: summing the loss over DP, summing a count over a
group, the barrier around checkpoint files, and the one-line report of a backend failure that
reaches the trainer's top level from code that does not report its own (megatron-core's).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from megatron.mllm import cpu_shim, logs

logger = logging.getLogger(__name__)

_GLOO_FAILURE_MARKS = ("/gloo/transport/", "caused pair closure")
"""How gloo's failures read: gloo raises bare RuntimeErrors, their message led by the transport's
source file (a timeout, a connection closed by the peer) or, for every later transfer over a
pair that timed out, "Application timeout caused pair closure"."""

_REPO = Path(__file__).resolve().parents[2]


def initialize_distributed(run) -> torch.device:
    """Start torch.distributed and megatron-core's parallel state for a
    :class:`~megatron.mllm.run_config.RunConfig`; returns this rank's device."""
    from megatron.core import parallel_state

    backend = run.distributed.distributed_backend
    if torch.cuda.is_available():
        local_rank = int(os.getenv("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        if backend != "gloo":
            logger.debug("no CUDA device: using the gloo backend instead of %s", backend)
        backend = "gloo"
        device = torch.device("cpu")
    if backend == "gloo":
        share_gloo_device()  # before the first group: every group then shares its device
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=run.distributed_timeout,
            world_size=run.parallel.world_size,
            rank=int(os.getenv("RANK", "0")),
        )
    if dist.get_world_size() != run.parallel.world_size:
        raise RuntimeError(
            f"torch.distributed has {dist.get_world_size()} ranks, expected "
            f"{run.parallel.world_size}"
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=run.parallel.tensor,
        pipeline_model_parallel_size=run.parallel.pipeline,
        distributed_timeout_minutes=run.distributed.distributed_timeout_minutes,
        # The distributed optimizer's shards within DP / N ranks, copied N times.
        num_distributed_optimizer_instances=run.ddp.num_distributed_optimizer_instances,
    )
    cpu_shim.model_parallel_manual_seed(run.seed)
    torch.manual_seed(run.seed)
    # megatron-core's DDP and optimizer consult the rerun state machine, which Megatron-LM's
    # pretrain() creates; its re-run modes need Megatron's own loop, so it is disabled here.
    from megatron.core import rerun_state_machine as rerun

    # A process may run several trainers one after another (tests): each starts afresh, like
    # the parallel state. It announces itself as a WARNING on every rank: a note, kept for the
    # debug log.
    rerun.destroy_rerun_state_machine()
    with logs.demoted("megatron.core.rerun_state_machine"):
        rerun.initialize_rerun_state_machine(mode=rerun.RerunMode.DISABLED)
    return device


def share_gloo_device() -> bool:
    """Make every gloo process group this process creates from now on use one transport device
    (one thread, ``gloo_tcp_loop``, one epoll set) instead of one device per group; returns
    whether it does (torch's backend registry as in 2.14, and not turned off with
    ``ORCHWEAVE_GLOO_DEVICE_PER_GROUP=1``).

    torch gives each gloo group a device of its own, whose thread wakes every 10 ms to poll its
    sockets: megatron-core's parallel state and the runtime's send and receive groups make
    24-26 groups per process on the CPU main job, so each rank's compute was interrupted some
    2,500 times a second by threads with nothing to do, and the runtime's posts stalled now and
    then for 80-1,200 ms (README, Running on CPU). A gloo device is made to carry the pairs of
    many contexts; each group keeps its own context, pairs (connections), store prefix, ranks
    and timeout."""
    if os.environ.get("ORCHWEAVE_GLOO_DEVICE_PER_GROUP") == "1":
        return False
    registry = dist.Backend
    if not (hasattr(registry, "_ensure_backend_registered") and hasattr(registry, "_plugins")):
        return False
    registry._ensure_backend_registered("gloo")
    plugin = registry._plugins.get("GLOO")
    if plugin is None or getattr(plugin.creator_fn, "shares_device", False):
        return plugin is not None
    from torch.distributed import ProcessGroupGloo

    device = ProcessGroupGloo.create_default_device()  # called just before the first group

    def create(opts, backend_options):
        options = ProcessGroupGloo._Options()
        options._devices = [device]
        options._timeout = opts.timeout
        options.enable_reconfigure = opts.enable_reconfigure
        group = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, options)
        group.options.global_ranks_in_group = opts.global_ranks_in_group
        group.options.group_name = opts.group_id
        return group

    create.shares_device = True
    try:
        registry._plugins["GLOO"] = registry._BackendPlugin(create, True)
    except TypeError:  # another torch's registry: keep its own gloo groups
        logger.debug("torch's backend registry differs: a gloo device per process group")
        return False
    return True


def wrap_ddp(module, config, ddp_config, pg_collection):
    """megatron-core's ``DistributedDataParallel`` around ``module``.

    With ``--use-distributed-optimizer`` megatron-core 0.19.2 warns on the first rank that the
    caller did not pre-compute the buffers' parameter layout, then computes it itself, as
    ``DistributedOptimizer.compute_full_param_layout`` would: the same layout, so the warning
    is kept for the debug log.
    """
    from megatron.core.distributed import DistributedDataParallel

    with logs.demoted("megatron.core.distributed.distributed_data_parallel"):
        return DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=module, pg_collection=pg_collection
        )


def sum_over_group(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor`` summed over ``group``, in place (e.g. the loss over DP ranks)."""
    dist.all_reduce(tensor, group=group)
    return tensor


def max_over_group(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor``'s elementwise maximum over ``group``, in place (e.g. measured times of the
    ranks of one TP group)."""
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on every rank), in rank order."""
    out = [torch.zeros_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return out


def broadcast_from_first(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor`` of ``group``'s first rank on every rank of ``group``, in place (the searched
    pipeline's schedule, sent by each pipeline's first stage)."""
    dist.broadcast(tensor, dist.get_global_rank(group, 0), group=group)
    return tensor


def broadcast_object_from_first(obj, group):
    """``obj`` (picklable) of ``group``'s first rank, on every rank of ``group`` (a planner's
    error message, so that every stage stops with it)."""
    box = [obj]
    dist.broadcast_object_list(box, dist.get_global_rank(group, 0), group=group)
    return box[0]


def all_gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in global rank order (the timers' per-iteration
    gather)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def clock_offsets(rounds: int = 8, clock=time.perf_counter) -> list[float]:
    """Every rank's clock minus rank 0's, in seconds, the same list on every rank.

    Rank 0 exchanges ``rounds`` timestamps with each other rank in turn (a ping and a pong of
    one float); the round with the shortest round trip bounds the error by half of it, as
    NTP does. On one host the processes share a monotonic clock and the offsets are ~0.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    device = _collective_device()
    offsets = torch.zeros(world, dtype=torch.float64, device=device)
    stamp = torch.zeros(1, dtype=torch.float64, device=device)
    for peer in range(1, world):
        if rank not in (0, peer):
            continue
        best = None
        for _ in range(rounds):
            if rank == 0:
                t0 = clock()
                dist.send(stamp, dst=peer)
                dist.recv(stamp, src=peer)
                t1 = clock()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, float(stamp.item()) - (t0 + t1) / 2)
            else:
                dist.recv(stamp, src=0)
                stamp.fill_(clock())
                dist.send(stamp, dst=0)
        if rank == 0:
            offsets[peer] = best[1]
    dist.broadcast(offsets, src=0)
    return [float(x) for x in offsets.cpu()]


def _collective_device() -> torch.device:
    # NCCL moves CUDA tensors only; gloo takes CPU ones.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def group_ranks(group) -> list[int]:
    """The global ranks of a process group, in group order (no communication)."""
    return dist.get_process_group_ranks(group)


def barrier() -> None:
    """Wait for every rank (checkpoint files are complete only after it)."""
    dist.barrier()


def global_rank() -> int:
    """This process's rank in the world."""
    return dist.get_rank()


def group_size(group) -> int:
    """The number of ranks of a process group (no communication)."""
    return dist.get_world_size(group)


def world_size() -> int:
    """Processes in the world."""
    return dist.get_world_size()


def communication_failure(error: BaseException) -> str | None:
    """One line for a torch.distributed failure or timeout that reached the trainer's top level
    from code that does not name its own (megatron-core's schedules, DDP and optimizer, the
    trainer's collectives); None for any other error.

    NCCL's failures are ``torch.distributed.DistError``; gloo's are RuntimeErrors that read as
    :data:`_GLOO_FAILURE_MARKS` say. The line names this rank and the innermost caller of
    torch.distributed (``megatron/core/pipeline_parallel/p2p_communication.py:413
    _communicate``).
    """
    message = str(error).strip()
    gloo = isinstance(error, RuntimeError) and any(m in message for m in _GLOO_FAILURE_MARKS)
    if not (isinstance(error, dist.DistError) or gloo):
        return None
    rank = dist.get_rank() if dist.is_initialized() else int(os.getenv("RANK", "0"))
    reason = (message or type(error).__name__).splitlines()[0]
    return f"rank {rank}: torch.distributed gave up in {_caller(error)}: {reason}"


def _caller(error: BaseException) -> str:
    """The innermost frame of ``error``'s traceback outside torch, as ``path:line function``
    (the path within site-packages or this repository)."""
    torch_dir = Path(torch.__file__).resolve().parent
    frames = traceback.extract_tb(error.__traceback__)
    outside = [f for f in frames if not Path(f.filename).resolve().is_relative_to(torch_dir)]
    if not outside:
        return "torch.distributed"
    frame = outside[-1]
    path = Path(frame.filename).resolve()
    if "site-packages" in path.parts:
        path = Path(*path.parts[path.parts.index("site-packages") + 1 :])
    elif path.is_relative_to(_REPO):
        path = path.relative_to(_REPO)
    return f"{path}:{frame.lineno} {frame.name}"


def shutdown() -> None:
    """Destroy the default process group, if one was started."""
    if dist.is_initialized():
        dist.destroy_process_group()
