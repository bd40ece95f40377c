# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Whole-sample balance plans (PP > 1): samples move between DP groups, payload and all.

Pure numpy; no collectives. With pipeline parallelism the DP groups run independent pipelines,
so the balancer sits ahead of them: :func:`plan_whole_samples` re-assigns whole samples across
DP groups (:class:`SamplePlan`), balancing the predicted cost of each group's batch; inside a
group the microbatches are then formed by cost (:mod:`orchestration.microbatches`).

Usage (one entry per DP group; ``me`` = this group's DP rank)::

    plan = plan_whole_samples(md, cost_model, algorithm="auto")
    mine = plan.dispatch.dst_items(me)       # global sample indices this group trains
    mb = form_microbatches(plan.costs[mine], plan.items.tokens[mine], num_microbatches,
                           max_tokens=seq_length * micro_batch_size)

Costs and the objective
-----------------------
Per-phase costs come from :class:`orchestration.cost_model.CostModel`. A DP group's step with
pipeline parallelism takes roughly ``max over stages of the stage's work + bubbles``. With
PipeWeaver every module is cut into chunks spread over all stages, so every stage gets about
``1/S`` of every phase and the bottleneck stage is ``total/S``: balancing each group's *sum of
all phases* (the default) balances the groups' steady-state time. With a static layout (e.g.
upstream Megatron: encoders on the first stage, LLM layers split evenly) pass
``stage_shares`` and the objective becomes the group's bottleneck stage,
``max_s sum_p share[p][s] * cost_p``. Bubbles scale with the microbatch cost, which
:func:`~orchestration.microbatches.form_microbatches` balances within the group afterwards.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from orchestration.balance import (
    DEFAULT_BUDGET,
    TIE_SLACK,
    InfeasibleCapError,
    WorkBudget,
    balance,
    vector_lpt,
)
from orchestration.cost_model import CostModel
from orchestration.locality import map_bins_to_ranks
from orchestration.metadata import (
    GatheredMetadata,
    PhaseItems,
    PlanError,
    as_metadata,
    check_encoders,
    phase_items,
    sample_encoder_tokens,
)
from orchestration.phase_plan import PLAN_VERSION, PlannedLoads, hash_route, item_labeler
from orchestration.routing import Route, dst_positions
from orchestration.workload import PHASES, SampleMeta


@dataclass(frozen=True, slots=True)
class SamplePlan(PlannedLoads):
    """Whole samples re-assigned across DP groups (PP > 1)."""

    num_groups: int
    """DP groups (each a whole pipeline)."""

    items: PhaseItems
    """The samples, as the LLM phase's items."""

    costs: np.ndarray
    """(S,) predicted cost of each sample: the sum of its phases' costs."""

    phase_costs: Mapping[str, np.ndarray]
    """Per phase, (S,) the sample's cost in that phase."""

    dispatch: Route
    """Owner group -> new group, for every sample (its whole payload moves together)."""

    loads_before: np.ndarray
    """(G,) predicted cost of each group's batch without balancing (the objective's value)."""

    loads_after: np.ndarray
    """(G,) the same with this plan."""

    algorithm: str
    """The algorithm whose assignment was kept."""

    metadata_digest: str
    """:meth:`GatheredMetadata.digest` of the input."""

    digest: str
    """sha256 of the metadata digest and the destinations: equal on every rank."""

    def phase_loads(self, phase: str, after: bool = True) -> np.ndarray:
        """(G,) the summed cost of one phase per group, with the plan or without."""
        ranks = self.dispatch.dst if after else self.dispatch.src
        return np.bincount(ranks, weights=self.phase_costs[phase], minlength=self.num_groups)


def sample_phase_costs(metadata: GatheredMetadata, cost_model: CostModel) -> dict[str, np.ndarray]:
    """Per phase of ``cost_model``, (S,) each sample's cost in that phase (packed)."""
    md = as_metadata(metadata)
    out = {}
    for phase in cost_model.phase_order:
        items = phase_items(md, phase)
        costs = cost_model[phase].item_costs(items.tokens, items.out_tokens)
        out[phase] = np.bincount(items.sample, weights=costs, minlength=md.num_samples)
    return out


def plan_whole_samples(
    metadata: GatheredMetadata | Sequence[Sequence[tuple[int, SampleMeta]]],
    cost_model: CostModel,
    *,
    algorithm: str = "auto",
    stage_shares: Mapping[str, Sequence[float]] | None = None,
    caps: Mapping[str, int] | None = None,
    groups_per_node: int = 1,
    bytes_per_token: float = 1.0,
    budget: WorkBudget = DEFAULT_BUDGET,
    slack: float = TIE_SLACK,
) -> SamplePlan:
    """Re-assign whole samples across DP groups, balancing each group's predicted step.

    Args:
        metadata: the gathered metadata of every DP group (one entry per DP rank).
        cost_model: per-phase costs, in one unit (they are added).
        algorithm: "none" or a name of ``orchestration.balance.ALGORITHMS``; with
            ``stage_shares`` only "none" and vector LPT ("lpt"/"auto") apply.
        stage_shares: per phase, the fraction of its cost on each pipeline stage (static
            layouts); None when every stage gets an equal share of every phase (PipeWeaver's
            chunked layout), which makes the objective the group's summed cost.
        caps: per phase, the largest summed tokens of a group's batch in that phase (its
            samples' encoder tokens of an encoder, their LLM tokens for ``llm``), as
            ``--post-balance-token-caps`` gives them; every phase's cap holds at once.
        groups_per_node: DP groups per node (usually 1 or fewer with PP x TP >= 8: pass 1).
        bytes_per_token: payload bytes per LLM token, to weigh locality.
        budget: deterministic work limits.
        slack: relative max-load slack traded for fewer moved samples.

    Raises:
        InfeasibleCapError: the caps cannot be met; its ``phase`` is the phase at fault.
        PlanError: mixed cost units, or a bad ``stage_shares``.
        WorkloadError: the data has items of a phase the model lacks.
    """
    md = as_metadata(metadata)
    G = md.num_ranks
    if cost_model.unit == "mixed":
        raise PlanError("whole-sample mode adds the phases' costs: calibrate all phases or none")
    check_encoders(md, cost_model.phase_order)
    items = phase_items(md, "llm")
    per_phase = sample_phase_costs(md, cost_model)
    total = np.sum([per_phase[p] for p in per_phase], axis=0) if per_phase else np.zeros(items.size)
    capped = sorted(caps or {}, key=PHASES.index)
    # A group's tokens in a phase: its samples' encoder tokens, or LLM tokens for the LLM.
    sizes = None
    if capped:
        sizes = np.stack(
            [md.sample_llm if p == "llm" else sample_encoder_tokens(md, p) for p in capped], axis=1
        )
    cap = [int(caps[p]) for p in capped] if capped else None
    size_names = [f"{p} tokens" for p in capped] or None
    labels = item_labeler(md, items)
    try:
        if stage_shares is None:
            res = balance(
                total,
                G,
                algorithm="ordinary" if algorithm == "none" else algorithm,
                sizes=sizes,
                cap=cap,
                size_names=size_names,
                owners=items.owner,
                item_bytes=items.tokens * float(bytes_per_token),
                gpus_per_node=max(1, groups_per_node),
                labels=labels,
                budget=budget,
                slack=slack,
            )
            dst, before, after, alg = res.bins, res.ordinary_loads, res.loads, res.algorithm
        else:
            vec = _stage_vectors(per_phase, stage_shares)
            before = _bottleneck(items.owner, vec, G)
            if algorithm == "none":
                dst, after, alg = items.owner, before, "ordinary"
            else:
                dst = vector_lpt(vec, G, sizes=sizes, cap=cap, labels=labels, size_names=size_names)
                mapping = map_bins_to_ranks(
                    dst,
                    items.owner,
                    items.tokens * float(bytes_per_token),
                    G,
                    max(1, groups_per_node),
                )
                dst = mapping.bin_to_rank[dst]
                after = _bottleneck(dst, vec, G)
                alg = "vector-lpt"
                if after.max() >= before.max() and (
                    cap is None or np.all(_group_sizes(items.owner, sizes, G) <= cap)
                ):
                    dst, after, alg = items.owner, before, "ordinary"
    except InfeasibleCapError as e:
        if e.size_name in (size_names or ()):
            e.phase = capped[size_names.index(e.size_name)]
        raise
    dispatch = Route(G, items.owner, items.src_pos, dst, dst_positions(dst, G), items.tokens)
    mdig = md.digest()
    h = hashlib.sha256(PLAN_VERSION + b"-samples")
    h.update(mdig.encode())
    hash_route(h, "samples", dispatch)
    return SamplePlan(G, items, total, per_phase, dispatch, before, after, alg, mdig, h.hexdigest())


def _group_sizes(groups: np.ndarray, sizes: np.ndarray, G: int) -> np.ndarray:
    out = np.zeros((G, sizes.shape[1]), dtype=np.int64)
    np.add.at(out, groups, sizes)
    return out


def _stage_vectors(
    per_phase: Mapping[str, np.ndarray], shares: Mapping[str, Sequence[float]]
) -> np.ndarray:
    stages = {len(v) for v in shares.values()}
    if len(stages) != 1:
        raise PlanError(
            f"stage_shares must give every phase the same number of stages, got {dict(shares)}"
        )
    S = stages.pop()
    n = next(iter(per_phase.values())).size
    vec = np.zeros((n, S))
    for phase, costs in per_phase.items():
        if phase not in shares:
            raise PlanError(f"stage_shares lacks phase {phase!r}")
        vec += costs[:, None] * np.asarray(shares[phase], dtype=np.float64)[None, :]
    return vec


def _bottleneck(ranks: np.ndarray, vec: np.ndarray, G: int) -> np.ndarray:
    loads = np.zeros((G, vec.shape[1]))
    np.add.at(loads, ranks, vec)
    return loads.max(axis=1)
