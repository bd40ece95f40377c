# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The event simulation of one training step.

A step is: host work (building microbatches), the balancer's all-to-alls (PP = 1, given as
input), one pipeline per DP replica executing its schedule, then per pipeline rank the DP
gradient reduction (a ring all-reduce over the DP group, which starts when every replica's rank
has finished its last backward) and the optimizer step.

Pipeline semantics are the runtime's (:mod:`pipeweaver.checker`): each rank runs its list in
order; a compute starts when the rank is free and its inputs have arrived; a send leaves when
it is reached (right after its producer in a compute-only schedule) and occupies the directed
link to its peer for ``bytes / bandwidth`` in FIFO order, arriving ``latency`` later; a receive
waits for the arrival. Communication overlaps compute. Compute-only schedules (orders before
lowering) are simulated directly, as if lowered: the timings are the same, because the lowering only
moves a receive earlier when an earlier-sent tensor has arrived first anyway.

A calibration's host terms (``orchestration.calibration``) add what the runtime pays on a
rank's host around its actions, on that rank's timeline: posting a send before it leaves,
posting receives where the runtime posts them (before the action that precedes the next send),
returning from a receive's wait, waiting the sends at the step's end, the runtime's bookkeeping
per compute, LLM chunk 0 joining (and, backward, splitting) the encoder subs' rows, and cutting
the subs before the step. In a compute-only schedule the implicit sends and receives charge
their host time to the compute they belong to.

The results and their definitions (bubble ratio, MFU, peak memory) are in
:mod:`pipeweaver.semu.results`; the replay of the compiled per-rank programs in
:mod:`pipeweaver.semu.replay`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from orchestration.calibration import Calibration
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.ir import CommOp, Compute, Kind
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.semu.batches import MicrobatchMeta
from pipeweaver.semu.dp_groups import DataParallelGroups
from pipeweaver.semu.fsdp_comm import data_parallel_comm
from pipeweaver.semu.grad_reduce import (
    BucketReduction,
    default_bucket_params,
    last_backward_windows,
    overlapped_reduction,
    rank_buckets,
)
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.replay import COMPUTE, HOST, RECV, SEND, receive_post_ops, replay
from pipeweaver.semu.results import Event, PipelineResult, StepPrediction
from pipeweaver.semu.reuse import ReuseCache, collector_paused
from pipeweaver.semu.timing import ComputeCost, KeptBytes, TimeModel
from pipeweaver.transfers import TransferGraph


class Semu:
    """The step emulator for one model on one cluster.

    Args:
        spec: the model and its parallel layout (TP, PP; DP follows from the cluster size).
        cluster: the devices.
        calibration: measured layer times and fitted factors; None: analytical costs.
        cache: a reuse cache to share (several instances, rollouts, iterations); default a
            fresh one.
        reuse: False disables every cache (for comparisons; results are identical).
        compute_cost_fn: ``(placement, compute, microbatch) -> ComputeCost`` replacing the time
            model for computes (measured tables, analytic test cases).
        overlap_grad_reduce: Megatron's ``--overlap-grad-reduce``: DP gradient buckets reduced
            during the backward (:mod:`pipeweaver.semu.grad_reduce`); False: one reduction per
            rank after its last backward.
        bucket_params: Megatron's ``bucket_size`` (parameters); default its
            :func:`~pipeweaver.semu.grad_reduce.default_bucket_params`.
        overlap_param_gather: ``--overlap-param-gather`` (and FSDP: :mod:`.fsdp_comm`).
        gathers_at_once: with ``overlap_param_gather``, the gathers dispatched as OrchWeave's
            trainer does (all as the forward starts), not by megatron-core's chain.
    """

    def __init__(
        self,
        spec: ModelSpec,
        cluster: ClusterSpec,
        calibration: Calibration | None = None,
        cache: ReuseCache | None = None,
        reuse: bool = True,
        compute_cost_fn: Callable[[Placement, Compute, MicrobatchMeta], ComputeCost] | None = None,
        overlap_grad_reduce: bool = False,
        bucket_params: int | None = None,
        overlap_param_gather: bool = False,
        gathers_at_once: bool = False,
    ):
        self.spec = spec
        self.cluster = cluster
        self.cost = TimeModel(spec, cluster, calibration)
        self.reuse = reuse
        self.cache = (cache if cache is not None else ReuseCache()) if reuse else None
        self.tp = spec.parallel.tensor
        self.pp = spec.parallel.pipeline
        self.dp = spec.parallel.data(cluster.num_devices)
        self.dp_groups = DataParallelGroups.for_layout(
            self.cost.comm, self.dp, spec.parallel.distributed_optimizer_instances, self.tp,
            cluster.devices_per_node, spec.parallel.sharded("optim"),
        )  # fmt: skip
        self.compute_cost_fn = compute_cost_fn
        self.overlap_grad_reduce = overlap_grad_reduce
        self.bucket_params = bucket_params or default_bucket_params(self.dp)
        self.dp_comm = data_parallel_comm(self, overlap_param_gather, gathers_at_once)
        # The overlapped reduction and the DP communication read the computes' events.
        self.needs_compute_events = overlap_grad_reduce or self.dp_comm is not None
        # Megatron's --clip-grad (default 1.0): clipping all-reduces the gradient norm.
        self._clip_grad = spec.training.clip_grad
        # The function itself (not its id) keys the caches: it stays alive while cached.
        self._fp = (self.cost.fingerprint(), compute_cost_fn)
        self._facts: tuple = (None, {})

    # ---------------------------------------------------------------- compute costs

    def compute_cost(self, placement: Placement, a: Compute, mb: MicrobatchMeta) -> ComputeCost:
        """Cost of one compute of one microbatch (through the subgraph cache)."""
        if self.compute_cost_fn is not None:
            return self.compute_cost_fn(placement, a, mb)
        return self._cost(self._chunk_facts(placement)[(a.module, a.chunk)], a, mb, {})

    def _chunk_facts(self, placement: Placement) -> dict[tuple[str, int], tuple]:
        """Per ``(module, chunk)``: its layers ``(start, stop)``, whether it holds the module's
        last layer, whether the model's module ends there (the subgraph key's facts); kept for
        the last placement asked (the same object is asked for every compute of a step)."""
        if self._facts[0] is placement:
            return self._facts[1]
        facts = {}
        for module, cps in placement.chunks.items():
            n_layers = self.spec.shape.module(module).num_layers
            last = placement.num_layers(module)
            for c, cp in enumerate(cps):
                facts[(module, c)] = (cp.start, cp.stop, cp.stop == last, cp.stop == n_layers)
        self._facts = (placement, facts)
        return facts

    def _cost(self, facts: tuple, a: Compute, mb: MicrobatchMeta, seqs: dict) -> ComputeCost:
        """:meth:`compute_cost` with the chunk's ``facts`` (:meth:`_chunk_facts`) and ``seqs``,
        a memo of ``(microbatch, module, sub) -> (sequences, sorted, rows, parts)`` for the
        microbatch ``mb`` is (a microbatch's chunks share their sequences)."""
        start, stop, projects, ends = facts
        module = a.module
        k = (a.microbatch, module, a.sub)
        got = seqs.get(k)
        if got is None:
            lens, rows = mb.compute_sequences(module, a.sub)
            # LLM chunk 0 joins every encoder sub's rows (and splits their gradient).
            parts = sum(len(s) for s in mb.encoders.values()) if module == "llm" else 0
            got = seqs[k] = (lens, tuple(sorted(lens)), rows, parts)
        lens, ordered, rows, parts = got
        if not projects:
            rows = 0  # only an encoder's last chunk projects rows
        if start:
            parts = 0
        kind, memory = a.kind._value_, a.strategy  # without the enum's value property
        key = (self._fp, module, stop - start, start == 0, ends, kind, memory, ordered, rows, parts)

        def cost() -> ComputeCost:
            c = self.cost.compute_cost(module, start, stop, kind, memory, lens, rows)
            join = self.cost.join_time(kind, parts)
            if a.kind is Kind.B and memory == "recompute":
                join += self.cost.join_time("F", parts)  # the rerun forward joins again
            return ComputeCost(c.time_s + join, c.kept_bytes, c.transient_bytes) if join else c

        if self.cache is None:
            return cost()
        return self.cache.get("subgraph", key, cost)

    def edge_bytes(self, placement: Placement, tensor: Compute, part, mb: MicrobatchMeta) -> float:
        """Bytes of one transfer: a chunk's output activation or input gradient."""
        costs = self.cost.costs
        if part is not None:
            return costs.encoder_output_bytes(mb.encoders[part[0]][part[1]].rows)
        if tensor.module == "llm":
            return costs.boundary_bytes("llm", sum(mb.llm_seq_lens))
        sub = mb.encoders[tensor.module][tensor.sub]
        last = placement.num_chunks(tensor.module) - 1
        if tensor.kind is Kind.F and tensor.chunk == last:
            return costs.encoder_output_bytes(sub.rows)
        return costs.boundary_bytes(tensor.module, sum(sub.units))

    # ---------------------------------------------------------------- one pipeline

    def simulate_pipeline(
        self,
        schedule: Schedule,
        microbatches: Sequence[MicrobatchMeta],
        start: Sequence[float] | None = None,
        replica: int = 0,
        record_events: bool = True,
    ) -> PipelineResult:
        """Simulate one pipeline executing ``schedule`` on ``microbatches``.

        Args:
            schedule: compute-only or lowered; it should have passed the checker.
            microbatches: one :class:`MicrobatchMeta` per microbatch of the schedule.
            start: per rank, when it can start (default 0).
            replica: DP index of this pipeline (decides which links are in a node).
            record_events: keep the compute intervals (off when only the figures matter).

        Raises:
            ScheduleError: the order deadlocks (no rank can progress).
        """
        if len(microbatches) != schedule.structure.num_microbatches:
            raise ValueError(
                f"the schedule has {schedule.structure.num_microbatches} microbatches, "
                f"{len(microbatches)} were given"
            )
        start = tuple(float(s) for s in (start or [0.0] * schedule.num_ranks))
        layout = (
            self.cluster.pipeline_same_node(self.tp, self.dp, self.pp, replica)
            if schedule.num_ranks == self.pp
            else tuple(
                tuple(True for _ in range(schedule.num_ranks)) for _ in range(schedule.num_ranks)
            )
        )
        if self.cache is None:
            return self._simulate(schedule, microbatches, start, layout, record_events)
        key = (
            self._fp,
            schedule.placement.key(),
            schedule.actions,
            tuple(microbatches),
            start,
            layout,
            record_events,
        )
        return self.cache.get(
            "timeline",
            key,
            lambda: self._simulate(schedule, microbatches, start, layout, record_events),
        )

    def _microbatch_table(self, placement: Placement, mb_index: int, mb: MicrobatchMeta) -> dict:
        """The microbatch level: one dict per (placement, microbatch), filled lazily with its
        compiled compute ops (per mode, layout, rank and graph) and its transfers' link times,
        ``("link", module, sub, carries an encoder's output, intra) -> (occupancy, latency)``."""
        if self.cache is None:
            return {}
        key = (self._fp, placement.key(), mb_index, mb)
        return self.cache.get("microbatch", key, dict)

    def _graph(self, placement: Placement, structure: MicrobatchStructure) -> TransferGraph:
        """The data flow of one (placement, structure), with integer ids (cached)."""
        if self.cache is None:
            return TransferGraph(placement, structure)
        return self.cache.get(
            "graph", (placement.key(), structure.key()), lambda: TransferGraph(placement, structure)
        )

    def _simulate(
        self,
        schedule: Schedule,
        microbatches: Sequence[MicrobatchMeta],
        start: tuple[float, ...],
        layout: tuple[tuple[bool, ...], ...],
        record: bool,
    ) -> PipelineResult:
        placement, structure = schedule.placement, schedule.structure
        n = schedule.num_ranks
        implicit = not schedule.has_comms
        comm = self.cost.comm
        tables = [self._microbatch_table(placement, i, mb) for i, mb in enumerate(microbatches)]

        graph = self._graph(placement, structure)
        layout_key = hash(layout)

        # A transfer's bytes (edge_bytes) depend on its microbatch and on which payload it
        # carries: an encoder sub's output rows (its last chunk's output, and the part of LLM
        # chunk 0's input gradient that goes back to it), or a module's boundary activation
        # (or gradient) of the sub (the LLM's: of the microbatch). Its link times are kept per
        # payload, so a microbatch's equal transfers share one entry.
        last_chunk = {module: len(cps) - 1 for module, cps in placement.chunks.items()}
        forward_kind = Kind.F

        def link_of(tensor: Compute, part, src: int, dst: int) -> tuple[float, float]:
            intra = layout[src][dst]
            if part is not None:
                k = ("link", part[0], part[1], True, intra)
            else:
                module = tensor.module
                output = (
                    module != "llm"
                    and tensor.kind is forward_kind
                    and tensor.chunk == last_chunk[module]
                )
                k = ("link", module, tensor.sub, output, intra)
            table = tables[tensor.microbatch]
            v = table.get(k)
            if v is None:
                nbytes = self.edge_bytes(placement, tensor, part, microbatches[tensor.microbatch])
                v = table[k] = comm.p2p_parts(nbytes, intra)
            return v

        # The runtime's host time per posted and waited send and receive.
        at_start = self.spec.parallel.receives_at_step_start(self.cluster.device.name)
        send_post, send_wait, recv_post, recv_wait, ready_extra = self.cost.transfer_host_s(
            at_start
        )

        facts = self._chunk_facts(placement)
        seqs: dict = {}
        pieces, edge_base = graph.pieces, graph.edge_base
        send_op = CommOp.SEND

        def edge_of(a) -> int:  # graph.edge_of, inlined
            m = a.tensor.microbatch
            return edge_base[m] + pieces[m].edge_id[(a.tensor, a.part)]

        def compile_compute(a: Compute, r: int) -> tuple:
            if self.compute_cost_fn is not None:
                c = self.compute_cost_fn(placement, a, microbatches[a.microbatch])
            else:
                c = self._cost(facts[(a.module, a.chunk)], a, microbatches[a.microbatch], seqs)
            waits: tuple = ()
            sends: tuple = ()
            key = a.key
            dur = c.time_s
            m = a.microbatch
            piece = graph.pieces[m]
            if implicit:
                waits, remote = piece.remote[key]
                base = graph.edge_base[m]
                if base and waits:
                    waits = tuple(base + e for e in waits)
                edges = piece.edges
                sends = tuple(
                    (base + e, (r, dst), *link_of(edges[e][0], edges[e][1], r, dst))
                    for e, dst in remote
                )
                # The lowering's sends and receives, charged to the compute they belong to.
                dur += len(sends) * (send_post + send_wait) + len(waits) * (recv_post + recv_wait)
            forward = a.kind is Kind.F
            # Each F/B pair's F comes right before its B in the data flow (and so in the ids).
            local = piece.index[key]
            pair = graph.compute_base[m] + local - (0 if forward else 1)
            # The timeline's name of the compute: the piece's, made once, without a strategy.
            name = piece.names[local] if key is a else str(a)
            return (
                COMPUTE, a, dur, c.kept_bytes, c.transient_bytes, forward, pair, waits, sends, name
            )  # fmt: skip

        # Per rank: op tuples (pipeweaver.semu.replay). Compiled compute ops are cached per
        # microbatch, rank and mode.
        programs: list[list[tuple]] = []
        for r in range(n):
            ops = []
            append = ops.append
            # Compiled ops hold graph ids: the graph object (kept alive by the key) is part of it.
            rank_tables = [t.setdefault((implicit, layout_key, r, graph), {}) for t in tables]
            actions = schedule.actions[r]
            hosts, posts = layout[r] if ready_extra else None, None
            if recv_post and not implicit:
                posts = receive_post_ops(actions, recv_post, edge_of, hosts, at_start)
            links = [(r, peer) for peer in range(n)]
            for i, a in enumerate(actions):
                if posts is not None and posts[i]:
                    append(posts[i])
                if type(a) is Compute:
                    table = rank_tables[a.microbatch]
                    op = table.get(a)
                    if op is None:
                        op = table[a] = compile_compute(a, r)
                    append(op)
                    continue
                edge = edge_of(a)
                if a.op is send_op:
                    occ, lat = link_of(a.tensor, a.part, r, a.peer)
                    append((SEND, edge, links[a.peer], occ, lat, send_post))
                else:
                    append((RECV, edge, recv_wait))
            if send_wait and not implicit:
                sends = sum(1 for a in actions if type(a) is not Compute and a.op is send_op)
            else:
                sends = 0
            if sends:
                append((HOST, sends * send_wait, None, ()))  # the runtime waits sends at the end
            programs.append(ops)

        return replay(programs, schedule.actions, graph, start, record, ready_extra)

    # ---------------------------------------------------------------- one step

    def static_bytes(self, placement: Placement) -> list[dict[str, float]]:
        """Per pipeline rank: weights, gradients and optimizer bytes of its chunks."""
        costs = self.cost.costs
        out = []
        for r in range(placement.num_ranks):
            params = sum(
                costs.chunk_params(m, *placement.layer_range(m, c))
                for m, c in placement.chunks_on(r)
            )
            largest = max(
                (costs.module(m).layer_params() / costs.tp for m, _ in placement.chunks_on(r)),
                default=0.0,
            )  # Megatron-FSDP gathers one layer's weights at a time
            shards = costs.static_bytes(params, self.dp_groups.shard, largest)
            out.append({"params": params, **shards})
        return out

    def activation_bytes(
        self, placement: Placement, microbatches: Sequence[MicrobatchMeta], memory=None
    ) -> KeptBytes:
        """Bytes an F/B pair keeps from its F to its B, for :func:`pipeweaver.checker.check`'s
        memory cap (with :meth:`static_bytes` as its ``static_bytes``); with ``memory``, as if
        every compute had that strategy."""
        return KeptBytes(self, placement, microbatches, memory)

    def host_time(self, microbatches: Sequence[MicrobatchMeta], rank: int) -> float:
        """Host seconds before the pipeline starts on a rank (:meth:`TimeModel.host_time`)."""
        return self.cost.host_time(microbatches, rank)

    @collector_paused()
    def simulate_step(
        self,
        schedules: Schedule | Sequence[Schedule],
        microbatches: Sequence[Sequence[MicrobatchMeta]],
        balancer_bytes: Mapping[str, Any] | None = None,
        record_events: bool = True,
        start_delay: Sequence[float] | None = None,
    ) -> StepPrediction:
        """Simulate one step: every DP replica's pipeline, the gradient reduction, the optimizer.

        Args:
            schedules: one schedule per DP replica, or one for all (then every replica's
                microbatches must share its structure).
            microbatches: ``[replica][microbatch]``; fewer replicas than the DP size are
                allowed (the rest are assumed identical to the given ones, cycled).
            balancer_bytes: PP = 1 balancer traffic per phase: a DP x DP byte matrix (device i
                sends ``[i][j]`` to j) or bytes per device; each phase's all-to-all runs once
                forward and once (transposed) in the backward.
            record_events: keep the timeline.
            start_delay: per pipeline rank, seconds of exchange before its pipeline starts
                (whole-sample post-balancing's all-to-all, :mod:`pipeweaver.semu.post_balance`).
        """
        if isinstance(schedules, Schedule):
            schedules = [schedules] * len(microbatches)
        if len(schedules) != len(microbatches):
            raise ValueError("give one schedule per replica, or one for all")
        placement = schedules[0].placement
        if placement.num_ranks != self.pp:
            raise ValueError(
                f"the schedule has {placement.num_ranks} pipeline ranks, the model config "
                f"--pipeline-model-parallel-size {self.pp}"
            )
        step_s = self.cost.host.get("step_s", 0.0) * self.cost.slowdown
        host_start = [
            [step_s + self.host_time(mbs, r) for r in range(self.pp)] for mbs in microbatches
        ]
        a2a = self.cost.balancer_time(balancer_bytes)
        delay = list(start_delay) if start_delay else [0.0] * self.pp
        results = []
        for d, (sched, mbs) in enumerate(zip(schedules, microbatches)):
            offsets = [s + a2a / 2 + delay[r] for r, s in enumerate(host_start[d])]
            record = record_events or self.needs_compute_events
            results.append(
                self.simulate_pipeline(sched, mbs, offsets, replica=d, record_events=record)
            )
        return self.finish_step(
            placement, results, microbatches, host_start, a2a + max(delay), record_events, a2a / 2
        )

    def finish_step(
        self,
        placement: Placement,
        results: Sequence[PipelineResult],
        microbatches: Sequence[Sequence[MicrobatchMeta]],
        host_start: Sequence[Sequence[float]],
        a2a: float = 0.0,
        record_events: bool = True,
        exchange_after: float | None = None,
    ) -> StepPrediction:
        """The step after every replica's pipeline: DP gradient reduction, optimizer, figures.

        Args:
            placement: the chunk layout of every replica.
            results: per simulated replica, its pipeline (with its compute events when
                ``overlap_grad_reduce`` is on).
            microbatches: ``[replica][microbatch]`` (FLOPs for MFU).
            host_start: per replica and pipeline rank, the host time before its pipeline.
            a2a: seconds of exchanges on the critical path (the breakdown's ``a2a``).
            record_events: keep the timeline.
            exchange_after: seconds of exchange between the last backward and the gradient
                reduction; default ``a2a / 2`` (the balancer's transposed all-to-all).
        """
        after = a2a / 2 if exchange_after is None else exchange_after
        static = self.static_bytes(placement)
        comm = self.cost.comm
        # The step's small collectives besides the gradient reduction (a few bytes each, so
        # latency; the CPU job's gloo pays milliseconds): Megatron's optimizer all-reduces the
        # gradient norm for clipping over the model-parallel group (TP x PP ranks) when
        # clipping is on, and the trainer reduces the loss over the DP group after the step.
        tail = 0.0
        mp = self.tp * self.pp
        if mp > 1 and self._clip_grad > 0:
            group = [self.tp * self.dp * r + t for r in range(self.pp) for t in range(self.tp)]
            tail += comm.all_reduce(4.0, mp, self.cluster.same_node(group))
        tail += self.dp_groups.all_reduce_s(8.0)
        finish = []
        events: list[Event] = []
        # FSDP's collectives delay the computes that wait for gathers (fsdp_comm).
        dp_step = self.dp_comm.apply(placement, results) if self.dp_comm is not None else None
        results = dp_step.results if dp_step is not None else results
        crit = max(range(len(results)), key=lambda d: results[d].makespan)
        distributed = self.spec.parallel.sharded("optim")
        windows = None
        if self.overlap_grad_reduce and self.dp > 1:
            windows = [
                [last_backward_windows(res.events, r) for res in results] for r in range(self.pp)
            ]
        for r in range(self.pp):
            ready = max(res.rank_end[r] for res in results) + after
            # Whole (unsharded) volumes: what the sharded memory keeps is 1/d of what moves.
            grad_bytes = static[r]["params"] * self.spec.training.grad_dtype_bytes
            weight_bytes = static[r]["params"] * self.spec.shape.params_dtype_bytes
            gather = self.dp_groups.gather_s(weight_bytes)
            gather *= dp_step is None or not dp_step.overlap_param_gather  # else in the forward
            reductions: list[BucketReduction] = []
            if dp_step is not None and dp_step.grads_reduced:
                ar = dp_step.gather_after_optimizer[r]  # reduce-scattered in the backward
            elif windows is not None:
                # Each bucket's reduce-scatter (all-reduce) as soon as its gradients exist.
                per_param = self.spec.training.grad_dtype_bytes
                groups = self.dp_groups
                reduce = groups.reduce_s if distributed else groups.all_reduce_s
                buckets = rank_buckets(
                    placement,
                    r,
                    self.cost.costs.chunk_params,
                    windows[r],
                    [res.rank_end[r] for res in results],
                    self.bucket_params,
                )
                reductions = overlapped_reduction(buckets, lambda n: reduce(n * per_param))
                done = max([ready] + [x.end_s for x in reductions])
                ar = done - ready + (gather if distributed else 0.0)
            elif distributed:
                ar = self.dp_groups.reduce_s(grad_bytes) + gather
            else:
                ar = self.dp_groups.all_reduce_s(grad_bytes)
            opt = self.cost.optimizer_time(
                static[r]["params"],
                self.dp_groups.shard,
                self.cost.rank_param_tensors(placement, r),
            )
            finish.append(ready + ar + opt + tail)
            if record_events:
                for i, x in enumerate(reductions):
                    events.append(Event(r, x.start_s, x.end_s, f"dp bucket {i}", "allreduce"))
                if ar > 0 and not reductions:
                    name = "dp all-gather" if dp_step and dp_step.grads_reduced else "dp all-reduce"
                    events.append(Event(r, ready, ready + ar, name, "allreduce"))
                elif reductions and distributed and gather > 0:
                    start = ready + ar - gather
                    events.append(Event(r, start, ready + ar, "dp all-gather", "allreduce"))
                events.append(Event(r, ready + ar, ready + ar + opt, "optimizer", "optimizer"))
                if tail > 0:
                    end = ready + ar + opt
                    events.append(Event(r, end, end + tail, "norm + loss all-reduce", "allreduce"))
        step = max(finish)
        crit_res = results[crit]
        if record_events:
            for r in range(self.pp):
                if crit_res.start[r] > 0:
                    events.append(Event(r, 0.0, crit_res.start[r], "host + a2a", "host"))
            events = list(crit_res.events) + events + (dp_step.events(crit) if dp_step else [])
        flops = sum(mb.model_flops for mbs in microbatches for mb in mbs)
        # Replicas not given are assumed to repeat the given ones.
        flops *= self.dp / len(microbatches)
        devices = self.tp * self.pp * self.dp
        peak_act = [max(res.peak_activation[r] for res in results) for r in range(self.pp)]
        statics = [s["weights"] + s["gradients"] + s["optimizer"] + s.get("gathered", 0.0)
                   for s in static]  # fmt: skip
        r_last = max(range(self.pp), key=lambda r: finish[r])
        ready_last = max(res.rank_end[r_last] for res in results)
        return StepPrediction(
            step_time_s=step,
            bubble_ratio=crit_res.bubble_ratio,
            mfu=flops / (step * devices * self.cost.peak_flops) if step > 0 else 0.0,
            peak_memory_bytes=[statics[r] + peak_act[r] for r in range(self.pp)],
            peak_activation_bytes=peak_act,
            static_bytes=[{k: v for k, v in s.items()} for s in static],
            busy_s=list(crit_res.busy),
            idle_s=[step - b for b in crit_res.busy],
            breakdown={
                "host": max(max(h) for h in host_start),
                "a2a": a2a,
                "pipeline": crit_res.makespan - min(crit_res.start),
                "allreduce_and_optimizer": step - ready_last - after,
            },
            model_flops=flops,
            num_devices=devices,
            critical_replica=crit,
            events=events,
            reuse=self.cache.stats() if self.cache is not None else {},
            device_memory_bytes=self.cluster.device.hbm_bytes,
        )
