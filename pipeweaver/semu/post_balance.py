# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's full mode in SEMU: batch post-balancing, planned by the trainer's own functions.

The trainer's balanced steps (``megatron.mllm.steps``) plan every iteration from the gathered
metadata of all DP ranks; SEMU gathers the same metadata (every rank's samples in Megatron's
sampler order, :func:`gathered_metadata`) and calls the same planners, so the simulated step runs
exactly the trainer's samples in the trainer's order:

* **per phase, PP = 1** (``PhaseBalancedStep``, OrchMLLM's setting):
  :func:`orchestration.phase_plan.plan_iteration` plans each encoder phase and the LLM phase;
  every worker runs each encoder once on all its units, packed; the LLM worker cuts its samples
  into microbatches with :func:`orchestration.microbatches.form_microbatches` and runs them in
  the step's order (:func:`orchestration.microbatches.overlap_order`). Of the step's three
  all-to-alls, the first (inputs and token ids) holds every rank until the slowest arrives; the
  encoder outputs' and their gradients' run beside the microbatches that need no other rank's
  outputs (:func:`simulate_phase_balanced`);
* **whole samples, PP > 1** (``SampleBalancedStep``):
  :func:`orchestration.sample_plan.plan_whole_samples` moves whole samples across DP groups,
  then each group forms its microbatches the same way and runs its pipeline
  (:func:`sample_balanced_batches`); every pipeline stage moves its samples' token ids (and,
  where it runs an encoder's input layer, their features) in one all-to-all before its
  pipeline starts.

Exchanges are costed on the cluster's links with the dispatcher's own routing
(:mod:`orchestration.hops`): one all-to-all, or the node-wise three hops when
``--node-wise-a2a`` is on. With the trainer's online cost fit (``--cost-fit``) a later
iteration's per-phase plan is made with the costs the fit holds by then, replayed on
SEMU's own times (:mod:`pipeweaver.semu.fitted_costs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from orchestration.balance import DEFAULT_BUDGET, WorkBudget
from orchestration.cost_model import CostModel
from orchestration.exchange_cost import ExchangeCost, PayloadBytes, busiest_rank_bytes
from orchestration.hops import hop_matrices
from orchestration.metadata import GatheredMetadata, sample_encoder_tokens
from orchestration.microbatches import fewest_llm_microbatches, form_microbatches, overlap_order
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import IterationPlan, plan_iteration
from orchestration.sample_plan import SamplePlan, plan_whole_samples
from orchestration.workload import SampleMeta
from pipeweaver.ir import Compute, Kind, Memory
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch, pack_microbatch
from pipeweaver.semu.results import Event, PipelineResult, StepPrediction
from pipeweaver.semu.reuse import collector_paused
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

TOKEN_ID_BYTES = 8.0
"""Bytes of one token id on the wire (int64, as the loader makes them)."""


@dataclass(frozen=True)
class PostBalanceSetup:
    """The trainer's post-balancing flags, as SEMU needs them."""

    algorithm: str
    """The ``orchestration.balance`` algorithm ``--post-balance`` runs (``auto``,
    ``lpt+refine``, ``kk+refine``)."""

    packing_limit: int
    """Most LLM tokens of one microbatch (``--micro-batch-size x --seq-length``)."""

    payload: PayloadBytes
    """Bytes per row of every route (encoder inputs, token ids, encoder outputs)."""

    phases: tuple[str, ...] | None = None
    """``--balance-phases`` (PP = 1); None: all."""

    caps: Mapping[str, int] = field(default_factory=dict)
    """``--post-balance-token-caps``: per phase, the most summed tokens a rank may get."""

    gpus_per_node: int = 8
    """``--gpus-per-node``: DP ranks per node, for the planner's locality and node-wise hops."""

    node_wise: bool = False
    """``--node-wise-a2a``: the three-hop exchange (one message per node pair)."""

    overlap: bool = True
    """PP = 1: the encoder outputs' exchanges run beside the LLM microbatches
    (``--no-overlap-exchanges``: False)."""

    pack_sequences: bool = False
    """``--pack-sequences``: each rank (PP = 1: its LLM phase) or DP group (PP > 1) cuts its
    samples into the fewest microbatches within the packing limit, else into at least the
    baseline's count."""

    exchange: ExchangeCost | None = None
    """The gain-versus-exchange check of the per-phase plan: a phase keeps the ordinary
    assignment when moving its data costs more than balancing gains. Applied with costs in
    seconds only, as the trainer applies its fitted one (:mod:`pipeweaver.semu.fitted_costs`);
    None: every phase runs the balancer's assignment."""


@dataclass(frozen=True)
class BalancedBatches:
    """One iteration's post-balanced work, per DP rank (PP > 1: per DP group)."""

    samples: list[list[list[SampleMeta]]]
    """``[rank][microbatch]``: the samples of each LLM microbatch, in order."""

    microbatches: list[list[MicrobatchMeta]]
    """``[rank][microbatch]``: their shapes, as SEMU reads them."""

    exchange_s: list[float]
    """PP > 1: per pipeline rank, seconds of its sample all-to-all; PP = 1: the three
    exchanges (inputs and tokens, encoder outputs, their gradients)."""

    plan: SamplePlan | IterationPlan
    """The trainer's plan."""

    encoder_work: list[MicrobatchMeta] = field(default_factory=list)
    """PP = 1: per rank, the encoder units it computes (one sub per encoder: all of them)."""

    overlap: list[tuple[int, int, int]] = field(default_factory=list)
    """PP = 1: per rank, how many of its microbatches (in order) run while the encoder outputs
    travel, need other ranks' outputs, and run while their gradients travel back
    (``orchestration.microbatches.overlap_order``)."""

    background: bool = True
    """PP = 1: the exchanges run in the background from their post (the direct all-to-all),
    not where the step waits for them (the node-wise one)."""

    exchange_bytes: list[float] = field(default_factory=list)
    """PP = 1: per exchange (as :attr:`exchange_s`), its busiest rank's bytes (what the
    trainer's exchange fit observes; 0: nothing moves, the step skips it)."""


def gathered_metadata(
    sample_of: Callable[[int], SampleMeta],
    iteration: int,
    data_parallel: int,
    micro_batch_size: int,
    num_microbatches: int,
) -> tuple[GatheredMetadata, list[SampleMeta]]:
    """Every DP rank's samples of ``iteration`` (Megatron's sampler order), as the trainer's
    loader all-gathers them; and the samples drawn, by global index (the metadata's order),
    which the batch functions take instead of rebuilding each from the table (a seventh of the
    84B per-phase replay's time at DP 320; the rebuilt ones equal them but for the spec
    component, which the table does not carry)."""
    ranks = []
    for d in range(data_parallel):
        idx = microbatch_indices(iteration, d, data_parallel, micro_batch_size, num_microbatches)
        ranks.append([(k, sample_of(k)) for mb in idx for k in mb])
    drawn = [meta for samples in ranks for _, meta in samples]
    return GatheredMetadata.from_rank_samples(ranks), drawn


def exchange_seconds(
    semu: Semu, rows_bytes: np.ndarray, ranks: Sequence[int], setup: PostBalanceSetup
) -> float:
    """Seconds of one exchange of ``rows_bytes[src, dst]`` bytes over the DP ranks ``ranks``
    (global device indices), routed as the dispatcher routes it."""
    if not np.any(rows_bytes - np.diag(np.diag(rows_bytes))):
        return 0.0  # every plan kept its rows at home: the dispatcher skips it
    hops = hop_matrices(rows_bytes, setup.gpus_per_node if setup.node_wise else None)
    return sum(semu.cost.comm.all_to_all(matrix, ranks) for matrix in hops)


def _form(md, costs, tokens, members, m, setup) -> list[list[int]]:
    """A rank's samples (global indices, in its destination order) cut into microbatches."""
    labels = [f"sample {md.sample_ids[s]!r}" for s in members]
    plan = form_microbatches(costs, tokens, m, setup.packing_limit, labels=labels)
    return [[members[i] for i in mb] for mb in plan.microbatches]


def sample_balanced_batches(
    semu: Semu,
    metadata: GatheredMetadata,
    cost_model: CostModel,
    setup: PostBalanceSetup,
    num_microbatches: int,
    pack: Callable[[list[SampleMeta]], MicrobatchMeta],
    feature_stages: Sequence[int] = (0,),
    samples: Sequence[SampleMeta] | None = None,
) -> BalancedBatches:
    """PP > 1: whole samples across DP groups, then each group's microbatches (the trainer's
    ``SampleBalancedStep``).

    Args:
        semu: the emulator (its cluster and layout cost the exchange).
        metadata: every DP group's samples (:func:`gathered_metadata`).
        cost_model: the planner's costs (``CostModel.build`` of the model and calibration).
        setup: the balancing flags.
        num_microbatches: the baseline's microbatches per group.
        pack: samples -> the microbatch's shapes (``pack_microbatch`` with the run's flags).
        feature_stages: pipeline ranks that run an encoder's input layer (they also move
            the samples' features).
        samples: every sample by global index (:func:`gathered_metadata`'s); None: rebuilt
            from ``metadata``, as a receiving rank does.

    Raises:
        InfeasibleCapError: a cap, or the packing limit, cannot be met (names the sample).
    """
    meta_of = metadata.sample_meta if samples is None else samples.__getitem__
    plan = plan_whole_samples(metadata, cost_model, algorithm=setup.algorithm, caps=setup.caps)
    route = plan.dispatch
    grouped, mbs = [], []
    fewest = fewest_llm_microbatches(num_microbatches, setup.pack_sequences)
    for g in range(plan.num_groups):
        mine = route.dst_items(g)
        members = [int(plan.items.sample[i]) for i in mine.tolist()]
        groups = _form(metadata, plan.costs[mine], plan.items.tokens[mine], members, fewest, setup)
        metas = [[meta_of(s) for s in mb] for mb in groups]
        grouped.append(metas)
        mbs.append([pack(mb) for mb in metas])
    tokens = route.rows_matrix() * TOKEN_ID_BYTES
    features = np.zeros_like(tokens, dtype=np.float64)
    for enc in cost_model.phase_order:
        if enc == "llm":
            continue
        rows = route.with_rows(sample_encoder_tokens(metadata, enc)).rows_matrix()
        features = features + rows * setup.payload.inputs.get(enc, 0.0)
    tp, dp = semu.tp, semu.dp
    exchange = []
    for r in range(semu.pp):
        ranks = [tp * (d + dp * r) for d in range(dp)]
        moved = tokens + features if r in feature_stages else tokens
        exchange.append(exchange_seconds(semu, moved, ranks, setup))
    return BalancedBatches(grouped, mbs, exchange, plan)


@collector_paused()
def phase_balanced_batches(
    semu: Semu,
    metadata: GatheredMetadata,
    cost_model: CostModel,
    setup: PostBalanceSetup,
    num_microbatches: int,
    flops_of: Callable[[SampleMeta], float] | None,
    budget: WorkBudget = DEFAULT_BUDGET,
    samples: Sequence[SampleMeta] | None = None,
) -> BalancedBatches:
    """PP = 1: every phase balanced across DP ranks, then the LLM workers' microbatches (the
    trainer's ``PhaseBalancedStep``: the LLM phase leaves every rank at least
    ``num_microbatches`` samples, as the running step asks; ``budget``, the planner's work
    limits, is ``orchestration.cost_feedback.FITTED_BUDGET`` once its costs are fitted;
    ``samples``, as :func:`sample_balanced_batches`'; ``flops_of``: a sample's model FLOPs, which
    the LLM microbatches carry for MFU, or None: no FLOPs, for a plan only timed).

    Raises:
        InfeasibleCapError: a cap, or the packing limit, cannot be met (names the sample).
    """
    fewest = fewest_llm_microbatches(num_microbatches, setup.pack_sequences)
    plan = plan_iteration(
        metadata,
        cost_model,
        algorithm=setup.algorithm,
        phases=setup.phases,
        caps=dict(setup.caps) or None,
        gpus_per_node=setup.gpus_per_node,
        exchange=setup.exchange if cost_model.unit == "seconds" else None,
        budget=budget,
        min_llm_samples=fewest,
    )
    meta_of = metadata.sample_meta if samples is None else samples.__getitem__
    llm = plan.phase("llm")
    R = plan.num_ranks
    grouped, mbs, enc_work, overlap = [], [], [], []
    for d in range(R):
        mine = llm.dispatch.dst_items(d)
        members = [int(llm.items.sample[i]) for i in mine.tolist()]
        groups = _form(metadata, llm.costs[mine], llm.items.tokens[mine], members, fewest, setup)
        # The trainer's order: microbatches needing no other rank's encoder outputs around
        # those that do, so that the exchanges run beside them.
        home = plan.home_samples(d)
        order = overlap_order([all(s in home for s in mb) for mb in groups], setup.overlap)
        groups = [groups[i] for part in order for i in part]
        overlap.append(tuple(len(part) for part in order))
        metas = [[meta_of(s) for s in mb] for mb in groups]
        grouped.append(metas)
        # The LLM microbatches carry the samples' FLOPs (all phases) for MFU.
        mbs.append([pack_microbatch(mb, (), flops_of=flops_of) for mb in metas])
        encoders = {}
        for p in plan.phases:
            if p.phase == "llm":
                continue
            items = p.dispatch.dst_items(d)
            if items.size:
                units = tuple(int(x) for x in p.items.tokens[items])
                rows = int(p.items.out_tokens[items].sum())
                encoders[p.phase] = (SubBatch(units, rows),)
        enc_work.append(MicrobatchMeta((), 0, encoders))
    inputs = llm.dispatch.rows_matrix() * TOKEN_ID_BYTES
    outputs = np.zeros((R, R))
    for p in plan.phases:
        if p.phase == "llm":
            continue
        inputs = inputs + p.dispatch.rows_matrix() * setup.payload.inputs.get(p.phase, 0.0)
        outputs = outputs + plan.to_llm[p.phase].rows_matrix() * setup.payload.outputs.get(
            p.phase, 0.0
        )
    ranks = [semu.tp * d for d in range(R)]
    hops = (inputs, outputs, outputs.T)
    exchange = [exchange_seconds(semu, matrix, ranks, setup) for matrix in hops]
    return BalancedBatches(grouped, mbs, exchange, plan, enc_work, overlap, not setup.node_wise,
                           [busiest_rank_bytes(matrix) for matrix in hops])  # fmt: skip


def phase_seconds(semu: Semu, batches: BalancedBatches, memory: Memory = Memory.NONE) -> list:
    """Per DP rank, its compute seconds per phase in a per-phase balanced step, as the
    trainer's ``PhaseBalancedStep`` measures them for its cost fit: each encoder's forward and
    backward on all its units, the LLM microbatches' forwards and backwards."""
    cost = _phase_cost(semu, Placement.baseline(1, semu.spec.layers(), 1), memory)
    out = []
    for d, mbs in enumerate(batches.microbatches):
        work = batches.encoder_work[d]
        seconds = {}
        for e in semu.spec.layers():
            if e != "llm":
                seconds[e] = sum(cost(e, k, 0, work).time_s
                                 for k in (Kind.F, Kind.B)) if work.num_subs(e) else 0.0  # fmt: skip
        seconds["llm"] = sum(
            cost("llm", k, i, mb).time_s for i, mb in enumerate(mbs) for k in (Kind.F, Kind.B)
        )
        out.append(seconds)
    return out


def _phase_cost(semu: Semu, placement: Placement, memory: Memory) -> Callable[..., ComputeCost]:
    """``(module, kind, microbatch index, microbatch) ->`` SEMU's cost of that compute of the
    per-phase step (``placement``: one chunk per module at PP = 1). Each distinct compute is
    made once: every rank of a step asks for the same few (a replayed 84B step makes 10^5)."""
    computes: dict[tuple, Compute] = {}

    def cost(module: str, kind: Kind, index: int, mb: MicrobatchMeta) -> ComputeCost:
        a = computes.get((module, kind, index))
        if a is None:
            a = computes[(module, kind, index)] = Compute(module, 0, kind, index, 0, memory)
        return semu.compute_cost(placement, a, mb)

    return cost


@collector_paused()
def simulate_phase_balanced(
    semu: Semu, batches: BalancedBatches, memory: Memory = Memory.NONE, record_events: bool = True
) -> StepPrediction:
    """One per-phase balanced step at PP = 1, as the trainer's ``PhaseBalancedStep`` runs it:
    every rank's encoder phases (each encoder once, on all its units), the LLM microbatches
    (forward, backward) in the trainer's three groups, the encoders' backward; then the DP
    reduction and optimizer (:meth:`Semu.finish_step`).

    The inputs' exchange holds every rank until the slowest is there. The encoder outputs'
    exchange starts when the last rank has posted it (after its encoders) and runs beside each
    rank's first group of microbatches; a rank waits for it before the microbatches that need
    other ranks' outputs. The gradients' exchange starts when the last rank has run those and
    runs beside the last group; the encoders' backward waits for it. Node-wise exchanges run
    where the step waits for them, so nothing overlaps them.

    Raises:
        ValueError: the model is not at PP = 1.
    """
    if semu.pp != 1:
        raise ValueError("per-phase post-balancing runs with --pipeline-model-parallel-size 1")
    layers = semu.spec.layers()
    placement = Placement.baseline(1, layers, 1)
    encoders = [m for m in layers if m != "llm"]
    x_in, x_out, x_back = batches.exchange_s
    R = len(batches.microbatches)
    host = [semu.host_time(batches.microbatches[d], 0) for d in range(R)]
    step_s = semu.cost.host.get("step_s", 0.0) * semu.cost.slowdown
    host = [h + step_s for h in host]

    cost = _phase_cost(semu, placement, memory)
    # Per rank, five runs of computes (module, kind, microbatch index, cost) in execution
    # order: encoders forward, the three groups of LLM microbatches, encoders backward.
    runs: list[list[list[tuple]]] = []
    for d in range(R):
        work = batches.encoder_work[d]
        enc_f = [(e, Kind.F, 0, cost(e, Kind.F, 0, work)) for e in encoders if work.num_subs(e)]
        llm = []
        for i, mb in enumerate(batches.microbatches[d]):
            llm.append([("llm", Kind.F, i, cost("llm", Kind.F, i, mb)),
                        ("llm", Kind.B, i, cost("llm", Kind.B, i, mb))])  # fmt: skip
        enc_b = [(e, Kind.B, 0, cost(e, Kind.B, 0, work)) for e, _, _, _ in reversed(enc_f)]
        cut = np.cumsum([0, *batches.overlap[d]])
        groups = [[c for mb in llm[cut[g] : cut[g + 1]] for c in mb] for g in range(3)]
        runs.append([enc_f, *groups, enc_b])
    starts, blocked = _overlapped_starts(runs, max(host) + x_in, x_out, x_back,
                                         overlapped=batches.background)  # fmt: skip
    results = []
    for d in range(R):
        events, busy, alive, peak, end = [], 0.0, 0.0, 0.0, host[d]
        for p, start in enumerate(starts[d]):
            t = start
            for module, kind, i, c in runs[d][p]:
                if kind is Kind.F:
                    peak = max(peak, alive + c.kept_bytes + c.transient_bytes)
                    alive += c.kept_bytes
                else:
                    peak = max(peak, alive + c.transient_bytes)
                    alive -= cost(module, Kind.F, i, _work(batches, d, module, i)).kept_bytes
                if record_events or semu.needs_compute_events:
                    name = f"{module[0]}0{kind.value}{i}"
                    events.append(Event(0, t, t + c.time_s, name, kind.value, module, i, 0))
                t += c.time_s
                busy += c.time_s
                end = t
        results.append(PipelineResult(end, [host[d]], [end], [busy], [peak], events))
    last = max(range(R), key=lambda d: results[d].makespan)
    return semu.finish_step(
        placement,
        results,
        batches.microbatches,
        [[h] for h in host],
        x_in + blocked[last],
        record_events,
        exchange_after=0.0,
    )


def _overlapped_starts(runs: Sequence[Sequence[Sequence[tuple]]], start: float, x_out: float,
                       x_back: float, overlapped: bool) -> tuple[list[list[float]], list[float]]:  # fmt: skip
    """When each rank starts each of its five runs (``simulate_phase_balanced``), and the
    seconds it waits for the two exchanges beside the LLM microbatches.

    Args:
        runs: per rank, its five runs of computes (the last element of each is its cost).
        start: when every rank leaves the inputs' exchange.
        x_out: seconds of the encoder outputs' exchange (0: nothing moves, nobody waits).
        x_back: seconds of their gradients' exchange.
        overlapped: the exchanges run in the background from their post (direct all-to-all);
            else from the step's wait for them (node-wise).
    """

    def length(run) -> float:
        return sum(c.time_s for *_, c in run)

    R = len(runs)
    ends = [start + length(r[0]) for r in runs]  # encoders forward
    starts = [[start, ends[d]] for d in range(R)]
    ends = [ends[d] + length(runs[d][1]) for d in range(R)]  # the first group
    posted = [s[1] for s in starts] if overlapped else ends
    arrive = max(posted) + x_out if x_out else 0.0
    blocked = [max(0.0, arrive - e) for e in ends]
    for d in range(R):
        starts[d].append(ends[d] + blocked[d])
    ends = [starts[d][2] + length(runs[d][2]) for d in range(R)]  # needing others' outputs
    for d in range(R):
        starts[d].append(ends[d])
    posted = ends
    ends = [ends[d] + length(runs[d][3]) for d in range(R)]  # the last group
    back = max(posted if overlapped else ends) + x_back if x_back else 0.0
    for d in range(R):
        wait = max(0.0, back - ends[d])
        blocked[d] += wait
        starts[d].append(ends[d] + wait)
    return starts, blocked


def _work(batches: BalancedBatches, rank: int, module: str, index: int) -> MicrobatchMeta:
    """The microbatch a compute of ``module`` ran on (encoders: the rank's encoder work)."""
    if module == "llm":
        return batches.microbatches[rank][index]
    return batches.encoder_work[rank]
