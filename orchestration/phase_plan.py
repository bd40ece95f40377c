# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Per-phase balance plans (PP = 1): every encoder phase and the LLM phase get their own plan.

Pure numpy; no collectives. Every rank computes the same plan from the same all-gathered
metadata (:mod:`orchestration.metadata`) and compares digests. :func:`plan_iteration` returns
an :class:`IterationPlan`: one :class:`PhasePlan` per phase (each encoder, then the LLM), whose
``dispatch`` route takes every item from the rank that loaded it to the rank that computes it,
and per encoder the route that takes the encoder's outputs straight to the LLM-phase worker of
their sample (:mod:`orchestration.routing`).

With ``exchange`` (an :class:`~orchestration.exchange_cost.ExchangeCost`, costs in seconds),
:func:`check_exchanges` weighs each phase's predicted gain against the exchanges its plan
adds and keeps the ordinary assignment where moving does not pay; each :class:`PhasePlan`
records the decision, the gain and the cost, and the digest covers them. Without it the
plans are exactly those of before the check existed.

Usage on DP rank ``me`` (the dispatcher does the collectives)::

    md = dispatcher.gather_metadata(local_samples)          # GatheredMetadata, all ranks
    plan = plan_iteration(md, CostModel.build(shape, calibration), algorithm="auto",
                          caps={"vision": 65536}, gpus_per_node=8)
    dispatcher.check_digest(plan.digest)
    parts = []
    for phase in plan.phases:                               # "vision", "audio", then "llm"
        sizes = phase.items.tokens[phase.dispatch.src_items(me)]   # my local items' rows
        send = dispatcher.send_rows(phase.dispatch, payload[phase.phase], sizes)
        parts.append((send, phase.dispatch.rows_matrix()))
    got = dispatcher.exchange_many(parts)                   # one all-to-all for all phases
    rows = plan.encoder_arrivals("vision", me)              # arrival -> destination order
    mb = form_microbatches(llm.costs[mine], llm.items.tokens[mine], num_microbatches,
                           max_tokens=micro_batch_size * seq_length)
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from orchestration.balance import (
    DEFAULT_BUDGET,
    TIE_SLACK,
    BalanceResult,
    InfeasibleCapError,
    WorkBudget,
    balance,
    balance_padded,
    hold_at_least,
    max_over_mean,
)
from orchestration.cost_model import CostModel, PhaseCostModel
from orchestration.exchange_cost import ExchangeCost, route_bytes
from orchestration.locality import map_bins_to_ranks
from orchestration.metadata import (
    GatheredMetadata,
    PhaseItems,
    PlanError,
    as_metadata,
    check_encoders,
    phase_items,
)
from orchestration.robust_fit import format_seconds
from orchestration.routing import Route, dst_positions, exclusive_cumsum, row_index
from orchestration.workload import PHASES, SampleMeta

PLAN_VERSION = b"orchweave-plan-v1"
"""Prefix of every plan digest."""


class PlannedLoads:
    """Imbalance of a plan's per-rank loads, before and after (a mixin of the plan types)."""

    __slots__ = ()

    @property
    def imbalance_before(self) -> float:
        """Max over mean load without balancing."""
        return max_over_mean(self.loads_before)

    @property
    def imbalance_after(self) -> float:
        """Max over mean load with the plan."""
        return max_over_mean(self.loads_after)


@dataclass(frozen=True)
class EncoderArrivals:
    """Where an encoder's outputs land on one LLM-phase worker, row by row."""

    order: np.ndarray
    """(rows,) for each row of the worker's destination list (per sample, its units in order),
    the row of the receive buffer that holds it."""

    sample_rows: Mapping[int, tuple[int, int]]
    """Global sample index -> its ``[start, stop)`` rows in the destination list."""


@dataclass(frozen=True, slots=True)
class PhasePlan(PlannedLoads):
    """The balanced assignment of one phase's items, and the exchange that carries it out."""

    phase: str
    """"vision", "audio" or "llm"."""

    items: PhaseItems
    """The items, in canonical order."""

    costs: np.ndarray
    """(n,) predicted cost of each item."""

    dispatch: Route
    """Owner -> worker: inputs (pixels, features, token ids) go to the rank computing them;
    its transpose brings outputs or gradients back."""

    loads_before: np.ndarray
    """(R,) predicted phase cost of each rank without balancing."""

    loads_after: np.ndarray
    """(R,) predicted phase cost of each rank with this plan."""

    algorithm: str
    """The algorithm whose assignment was kept ("ordinary" when nothing beat it)."""

    lower_bound: float
    """Combinatorial lower bound on the optimal max load (``orchestration.bounds``)."""

    unit: str
    """Unit of costs and loads: "flops" or "seconds"."""

    gain: float = 0.0
    """Predicted max load of the ordinary assignment minus that of the balancer's (with
    :attr:`gain_bounded`, a bound of it: the balancer did not run)."""

    gain_bounded: bool = False
    """The check kept every phase without running the balancer: even a perfect balance of
    all phases together would gain less than one exchange's latency (:attr:`gain` holds this
    phase's share of that bound, :attr:`exchange_cost` the latency)."""

    decision: str = "balanced"
    """"balanced": the balancer's assignment runs (which may itself be the ordinary one, see
    ``algorithm``); "kept": the exchange check kept the ordinary assignment because moving
    does not pay (``dispatch`` is the identity and ``loads_after`` equals ``loads_before``)."""

    exchange_cost: float | None = None
    """Predicted seconds of the exchanges that balancing this phase adds, given the other
    phases' decisions; None without an exchange check."""

    @property
    def moved_fraction(self) -> float:
        """Fraction of items that change rank."""
        return self.dispatch.moved_items / self.items.size if self.items.size else 0.0


@dataclass(frozen=True, slots=True)
class IterationPlan:
    """Every phase's plan for one iteration (PP = 1), and the digest ranks compare."""

    num_ranks: int
    """DP ranks."""

    phases: tuple[PhasePlan, ...]
    """Per phase, in iteration order: encoders, then the LLM."""

    to_llm: Mapping[str, Route]
    """Per encoder phase: encoder worker -> LLM-phase worker of the unit's sample. Source list
    = the encoder worker's destination list; destination list = for each sample of the LLM
    worker (in its order), the sample's units of this encoder in order. ``rows`` = encoder
    tokens (hidden states before pooling); ``.with_rows(phase.items.out_tokens)`` gives the
    projected rows' sizes when pooling runs per unit on the encoder worker."""

    metadata_digest: str
    """:meth:`GatheredMetadata.digest` of the input."""

    digest: str
    """sha256 of the metadata digest and every phase's destinations: equal on every rank."""

    def phase(self, name: str) -> PhasePlan:
        """The plan of one phase."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"no plan for phase {name!r}; have {[p.phase for p in self.phases]}")

    def describe_decisions(self) -> str:
        """``vision balanced (gain 1.2 ms > cost 0.31 ms) llm kept (...)`` for the log line;
        empty without an exchange check."""
        parts = []
        for p in self.phases:
            if p.exchange_cost is None:
                continue
            sign = ">" if p.decision == "balanced" else "<="
            gain = ("at most " if p.gain_bounded else "") + format_seconds(p.gain)
            parts.append(
                f"{p.phase} {p.decision} (gain {gain} {sign} cost "
                f"{format_seconds(p.exchange_cost)})"
            )
        return " ".join(parts)

    def home_samples(self, rank: int) -> frozenset[int]:
        """``rank``'s LLM samples whose every encoder output was computed on ``rank``: their
        microbatches need nothing of the outputs' exchange, so they can run while it does."""
        llm = self.phase("llm")
        mine = set(llm.items.sample[llm.dispatch.dst_items(rank)].tolist())
        for encoder, route in self.to_llm.items():
            sample = self.phase(encoder).items.sample
            mine -= set(sample[(route.dst == rank) & (route.src != rank)].tolist())
        return frozenset(mine)

    def encoder_arrivals(self, encoder: str, rank: int) -> EncoderArrivals:
        """How ``rank``'s receive buffer of ``to_llm[encoder]`` maps to its destination list."""
        route = self.to_llm[encoder]
        order = route.arrival_order(rank)
        rows = route.rows[order]
        by_dst = np.argsort(route.dst_pos[order], kind="stable")
        sample = self.phase(encoder).items.sample
        offsets: dict[int, tuple[int, int]] = {}
        start = 0
        for item, n in zip(order[by_dst].tolist(), rows[by_dst].tolist()):
            s = int(sample[item])
            a, b = offsets.get(s, (start, start))
            offsets[s] = (a, b + n)
            start += n
        return EncoderArrivals(row_index(by_dst, rows), offsets)


def plan_iteration(
    metadata: GatheredMetadata | Sequence[Sequence[tuple[int, SampleMeta]]],
    cost_model: CostModel,
    *,
    algorithm: str = "auto",
    phases: Iterable[str] | None = None,
    caps: Mapping[str, int] | None = None,
    gpus_per_node: int = 8,
    bytes_per_token: Mapping[str, float] | None = None,
    budget: WorkBudget = DEFAULT_BUDGET,
    slack: float = TIE_SLACK,
    exchange: ExchangeCost | None = None,
    min_llm_samples: int = 0,
) -> IterationPlan:
    """Plan every phase of one iteration in per-phase mode (PP = 1).

    Args:
        metadata: the gathered metadata, or every rank's (stream index, metadata) pairs.
        cost_model: per-phase costs; its phases are the phases planned.
        algorithm: "none" (everything stays with its owner) or a name of
            ``orchestration.balance.ALGORITHMS``.
        phases: phases to balance (default all); the others keep the ordinary assignment.
        caps: per phase, the largest summed tokens per rank (memory).
        gpus_per_node: ranks per node, for the node-aware locality mapping.
        bytes_per_token: per phase, payload bytes per token moved (pixels, features, ids), to
            weigh locality; default 1 (tokens).
        budget: deterministic work limits of the algorithms.
        slack: relative max-load slack traded for fewer moved items (see
            ``orchestration.balance.balance``).
        exchange: the gain-versus-exchange check (:func:`check_exchanges`): a phase keeps
            the ordinary assignment when moving its data costs more than balancing gains.
            Needs a cost model in seconds. None: every phase runs the balancer's assignment.
        min_llm_samples: the LLM phase leaves every rank at least this many samples (the
            step's microbatch count, so that every rank runs as many microbatches as
            Megatron's step: :mod:`orchestration.balance.cardinality`), or at least as many as
            the loader gave the rank that got fewest; where it cannot, the phase keeps the
            ordinary assignment. 0: no floor.

    Raises:
        InfeasibleCapError: a cap cannot be met (names the sample; its ``phase`` is set).
        PlanError: a phase to balance that the model lacks; an exchange check with costs
            not in seconds, or without the payload sizes of a phase.
        WorkloadError: the data has items of a phase the model lacks.
    """
    md = as_metadata(metadata)
    R = md.num_ranks
    chosen = set(cost_model.phase_order if phases is None else phases)
    unknown = chosen - set(cost_model.phase_order)
    if unknown:
        raise PlanError(
            f"cannot balance phases {sorted(unknown)}: the model has {list(cost_model.phase_order)}"
        )
    check_encoders(md, cost_model.phase_order)
    if exchange is not None and cost_model.unit != "seconds":
        raise PlanError(
            f"the exchange check compares seconds, but the costs are in {cost_model.unit}"
        )
    phase_list = [(phase, phase_items(md, phase)) for phase in PHASES if phase in cost_model]
    bounds = None
    if exchange is not None and not caps:
        bounds = _gain_bounds(phase_list, cost_model, R)
    keep_all = bounds is not None and sum(bounds.values()) <= exchange.margin * exchange.latency_s
    plans = []
    for phase, items in phase_list:
        alg = algorithm if phase in chosen and not keep_all else "none"
        try:
            plan = _plan_phase(
                md,
                items,
                cost_model[phase],
                alg,
                (caps or {}).get(phase),
                gpus_per_node,
                (bytes_per_token or {}).get(phase, 1.0),
                budget,
                slack,
                min_llm_samples if phase == "llm" else 0,
            )
        except InfeasibleCapError as e:
            e.phase = phase
            raise
        plans.append(plan)
    llm = next((p for p in plans if p.phase == "llm"), None)
    if llm is None:
        raise PlanError(
            "the cost model has no 'llm' phase: encoder outputs would have nowhere to go"
        )
    if keep_all:
        plans = [
            dataclasses.replace(_kept(p, R), gain=bounds.get(p.phase, 0.0), gain_bounded=True,
                                exchange_cost=exchange.latency_s)  # fmt: skip
            for p in plans
        ]
        llm = plans[-1]
    elif exchange is not None:
        plans = check_exchanges(plans, R, exchange)
        llm = plans[-1]
    to_llm = {p.phase: _route_to_llm(p, llm, R) for p in plans if p.phase != "llm"}
    mdig = md.digest()
    h = hashlib.sha256(PLAN_VERSION)
    h.update(mdig.encode())
    for p in plans:
        hash_route(h, p.phase, p.dispatch)
    if exchange is not None:
        h.update(b"exchange\0")
        for p in plans:
            h.update(f"{p.phase}:{p.decision}\0".encode())
            h.update(np.array([p.gain, p.exchange_cost], dtype="<f8").tobytes())
    return IterationPlan(R, tuple(plans), to_llm, mdig, h.hexdigest())


def _gain_bounds(phase_list, cost_model: CostModel, num_ranks: int) -> dict[str, float] | None:
    """Per phase, a bound of what even a perfect balance would gain (None: no cheap bound).
    When their sum is below one exchange's latency the ordinary assignment wins and the
    balancer need not run at all: balancing anything moves something, which costs at least
    one hop's latency.

    A phase's balanced max load is at least its mean load and its largest item (plus the
    per-call cost of a rank holding anything), so ``max(before) - that`` bounds its gain."""
    bounds = {}
    for phase, items in phase_list:
        if items.size == 0:
            bounds[phase] = 0.0
            continue
        model = cost_model[phase]
        if model.padded:
            return None  # padded loads are not additive: no cheap bound
        costs = model.item_costs(items.tokens, items.out_tokens)
        before = np.bincount(items.owner, weights=costs, minlength=num_ranks)
        before = before + model.per_call * (np.bincount(items.owner, minlength=num_ranks) > 0)
        best = max(float(costs.sum()) / num_ranks, float(costs.max())) + model.per_call
        bounds[phase] = max(0.0, float(before.max()) - best)
    return bounds


def check_exchanges(
    plans: Sequence[PhasePlan], num_ranks: int, exchange: ExchangeCost
) -> list[PhasePlan]:
    """``auto`` never loses: per phase, keep the ordinary assignment when moving does not pay.

    The predicted step is the sum over phases of the max load plus the time of the step's
    exchanges, which are three packed all-to-alls (``megatron.mllm.steps.phase_balanced``):
    every encoder's inputs with the LLM's token ids; every encoder's outputs to the LLM-phase
    worker of their sample; and their gradients back. A hop costs its latency once when any of
    its routes moves something (else it is skipped) plus the bytes of its routes over the
    bandwidth (:meth:`ExchangeCost.seconds` of the summed busiest-rank bytes, an upper bound).
    Each phase either runs its balanced plan or keeps the ordinary one; every combination is
    priced (at most 2^3 with two encoders) and the cheapest wins, with exchange times weighed
    by ``exchange.margin``; ties keep the ordinary assignment (fewer balanced phases first).
    Each plan records the gain of balancing and the exchange seconds balancing it adds given
    the others' choices.

    Args:
        plans: every phase's balanced plan, encoders first, the LLM last.
        num_ranks: R.
        exchange: the exchange model and the payload sizes of every route.

    Returns:
        The plans with their decisions; a kept phase's dispatch is the identity.

    Raises:
        PlanError: ``exchange.payload`` lacks the sizes of a phase.
    """
    inputs, outputs = exchange.payload.inputs, exchange.payload.outputs
    missing = [f"inputs[{p.phase!r}]" for p in plans if p.phase not in inputs]
    missing += [f"outputs[{p.phase!r}]" for p in plans[:-1] if p.phase not in outputs]
    if missing:
        raise PlanError(f"the exchange check needs the payload bytes {', '.join(missing)}")
    options = [[_kept(p, num_ranks), p] for p in plans]  # per phase: 0 kept, 1 balanced
    # Every combination's hops are sums of the same few routes' bytes: each phase's dispatch
    # (kept or balanced) and each encoder's outputs to the LLM worker (per encoder and LLM
    # choice), so each route is costed once, not once per combination priced.
    first_bytes = [[route_bytes(o.dispatch, inputs[o.phase]) for o in pair] for pair in options]
    second_bytes = [
        [
            [route_bytes(_route_to_llm(o, llm, num_ranks), outputs[o.phase]) for llm in options[-1]]
            for o in pair
        ]
        for pair in options[:-1]
    ]

    def hop_seconds(nbytes: list[float]) -> float:
        moved = sum(nbytes)
        return exchange.seconds(moved) if moved > 0 else 0.0

    def exchange_seconds(choice: tuple[int, ...]) -> float:
        first = [first_bytes[i][c] for i, c in enumerate(choice)]
        second = [second_bytes[i][c][choice[-1]] for i, c in enumerate(choice[:-1])]
        return hop_seconds(first) + 2.0 * hop_seconds(second)

    def total(choice: tuple[int, ...]) -> float:
        compute = sum(
            float(options[i][c].loads_after.max(initial=0.0)) for i, c in enumerate(choice)
        )
        return compute + exchange.margin * exchange_seconds(choice)

    combos = sorted(itertools.product((0, 1), repeat=len(plans)), key=lambda c: (sum(c), c))
    best = combos[0]
    best_total = total(best)
    for c in combos[1:]:
        t = total(c)
        if t < best_total:
            best, best_total = c, t
    out = []
    for i, p in enumerate(plans):
        on, off = list(best), list(best)
        on[i], off[i] = 1, 0
        cost = exchange_seconds(tuple(on)) - exchange_seconds(tuple(off))
        out.append(_decided(p, best[i], cost, num_ranks))
    return out


def _kept(p: PhasePlan, num_ranks: int) -> PhasePlan:
    """``p`` with the ordinary assignment: every item computed where it was loaded."""
    owner = p.items.owner
    route = Route(
        num_ranks, owner, p.items.src_pos, owner, dst_positions(owner, num_ranks), p.items.tokens
    )
    return dataclasses.replace(p, dispatch=route, loads_after=p.loads_before, decision="kept")


def _decided(p: PhasePlan, balanced: int, cost: float, num_ranks: int) -> PhasePlan:
    plan = p if balanced else _kept(p, num_ranks)
    return dataclasses.replace(plan, exchange_cost=float(cost))


def hash_route(h, name: str, ex: Route) -> None:
    """Add a route's destinations to a plan digest."""
    h.update(name.encode() + b"\0")
    h.update(np.int64(ex.size).tobytes())
    h.update(np.ascontiguousarray(ex.dst, dtype="<i4").tobytes())


def _plan_phase(
    md: GatheredMetadata,
    items: PhaseItems,
    model: PhaseCostModel,
    algorithm: str,
    cap: int | None,
    gpus_per_node: int,
    bytes_per_token: float,
    budget: WorkBudget,
    slack: float,
    min_items: int = 0,
) -> PhasePlan:
    R = md.num_ranks
    costs = model.item_costs(items.tokens, items.out_tokens)
    owner = items.owner
    labels = item_labeler(md, items)
    if model.padded:
        dst, before, after, alg = _plan_padded(
            items, model, R, algorithm, cap, gpus_per_node, bytes_per_token, labels
        )
        lb = float(after.max()) if after.size and alg != "none" else 0.0
    else:
        alg_name = "ordinary" if algorithm == "none" else algorithm
        result: BalanceResult = balance(
            costs,
            R,
            algorithm=alg_name,
            sizes=items.tokens if cap is not None else None,
            cap=cap,
            owners=owner,
            item_bytes=items.tokens * float(bytes_per_token),
            gpus_per_node=gpus_per_node,
            labels=labels,
            budget=budget,
            slack=slack,
        )
        dst = result.bins
        before = result.ordinary_loads
        after = result.loads
        alg = result.algorithm
        lb = result.lower_bound
        if min_items and alg != "ordinary" and items.size:
            floor = min(min_items, int(np.bincount(owner, minlength=R).min()))
            sizes = items.tokens if cap is not None else None
            held = hold_at_least(dst, costs, R, floor, sizes, cap)
            if held is None:
                dst, after, alg = owner, before, "ordinary"
            elif not np.array_equal(held, dst):
                dst, after = held, np.bincount(held, weights=costs, minlength=R)
                if after.max() >= before.max():  # the floor took the gain: keep the loader's
                    dst, after, alg = owner, before, "ordinary"
    if model.per_call:
        # Paid once by every rank holding anything: it never changes which items go together.
        before = before + model.per_call * (np.bincount(owner, minlength=R) > 0)
        after = after + model.per_call * (np.bincount(dst, minlength=R) > 0)
        lb = lb + model.per_call if items.size else lb
    gain = float(before.max() - after.max()) if items.size else 0.0
    dispatch = Route(R, owner, items.src_pos, dst, dst_positions(dst, R), items.tokens)
    return PhasePlan(items.phase, items, costs, dispatch, before, after, alg, lb, model.unit, gain)


def item_labeler(md: GatheredMetadata, items: PhaseItems):
    """How balancing errors name item ``i`` of a phase: its unit and sample."""
    if items.phase == "llm":
        return lambda i: md.sample_label(int(items.sample[i]))
    return lambda i: (
        f"{items.phase} unit {int(items.unit_in_sample[i])} of "
        f"{md.sample_label(int(items.sample[i]))}"
    )


def _plan_padded(items, model, R, algorithm, cap, gpus_per_node, bytes_per_token, labels):
    """Padded phase: exact contiguous-runs algorithm, then locality; keep the ordinary if better."""
    lengths = items.tokens if model.pad_to is None else np.full(items.size, model.pad_to)
    f = lambda L: model.linear * L + model.quadratic * L * L + model.const  # noqa: E731
    before = _padded_loads(items.owner, lengths, R, f) + _proj_loads(items, model, items.owner, R)
    if algorithm == "none" or items.size == 0:
        return items.owner, before, before, "ordinary"
    res = balance_padded(lengths, R, f, cap=cap, labels=labels)
    mapping = map_bins_to_ranks(
        res.bins, items.owner, items.tokens * float(bytes_per_token), R, gpus_per_node
    )
    dst = mapping.bin_to_rank[res.bins]
    after = _padded_loads(dst, lengths, R, f) + _proj_loads(items, model, dst, R)
    ordinary_ok = cap is None or _padded_sizes(items.owner, lengths, R).max() <= cap
    if ordinary_ok and before.max() <= after.max():
        return items.owner, before, before, "ordinary"
    return dst, before, after, "padded-exact"


def _padded_loads(ranks, lengths, R, f) -> np.ndarray:
    counts = np.bincount(ranks, minlength=R)
    longest = np.zeros(R)
    np.maximum.at(longest, ranks, lengths.astype(np.float64))
    return counts * np.where(counts > 0, f(longest), 0.0)


def _padded_sizes(ranks, lengths, R) -> np.ndarray:
    counts = np.bincount(ranks, minlength=R)
    longest = np.zeros(R, dtype=np.int64)
    np.maximum.at(longest, ranks, lengths.astype(np.int64))
    return counts * longest


def _proj_loads(items, model, ranks, R) -> np.ndarray:
    if not model.per_output_token:
        return np.zeros(R)
    return model.per_output_token * np.bincount(ranks, weights=items.out_tokens, minlength=R)


def _route_to_llm(enc: PhasePlan, llm: PhasePlan, R: int) -> Route:
    """Encoder worker -> LLM worker of each unit's sample, in the LLM worker's sample order.

    No sort: the LLM plan already orders every worker's samples, and a sample's units are
    consecutive in canonical order, so each unit's place follows from counts.
    """
    s = enc.items.sample
    S = llm.items.size
    dst = llm.dispatch.dst[s]
    # Every sample's rank in the destination-major order of all LLM workers' lists...
    grank = exclusive_cumsum(np.bincount(llm.dispatch.dst, minlength=R))[llm.dispatch.dst]
    grank += llm.dispatch.dst_pos
    # ...gives where its run of units starts in the same order over all units...
    per_sample = np.bincount(s, minlength=S)
    by_rank = np.empty(S, dtype=np.int64)
    by_rank[grank] = per_sample
    unit_start = exclusive_cumsum(by_rank)[grank]
    # ...and each unit's position in its worker's list.
    pos = unit_start[s] + enc.items.unit_in_sample
    dst_pos = pos - exclusive_cumsum(np.bincount(dst, minlength=R))[dst]
    return Route(R, enc.dispatch.dst, enc.dispatch.dst_pos, dst, dst_pos, enc.items.tokens)
