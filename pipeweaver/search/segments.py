# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Segments and segment groups: what phase 1 of the search orders.

A *segment* is one full forward (or backward) of one module's sub-microbatch across the
pipeline: every chunk of that module for that ``(microbatch, sub)``, of one kind. DIP prunes
the search by letting the segments of one module in one microbatch share a priority and keep
their relative order (lower sub first); so the search orders *segment groups*
``(module, microbatch, kind)``, not single segments.

An order of the groups becomes a priority function for phase 2
(:func:`pipeweaver.interleave.greedy_dual_queue`): a compute's key is ``(kind, position of
its group, sub, chunk)``, lower first. The greedy interleaver compares priorities only within
one rank's forward queue or within its backward queue, never a forward against a backward,
so only the relative order of the forward groups and that of the backward groups matter.
The search space is therefore (orders of the forward groups) x (orders of the backward
groups), written as one *canonical* order that alternates them; :class:`SegmentSpace`
enumerates the moves of that space. (Where a forward and a backward become ready at the same
instant on one rank, the interleaver compares them too; an order's keys then always run the
forward: the keys start with the kind.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.ir import MODULE_LETTER, Compute, Kind, ScheduleError
from pipeweaver.placement import Placement


@dataclass(frozen=True, slots=True)
class SegmentGroup:
    """The segments of one module in one microbatch, of one kind: one priority for all."""

    module: str
    """One of :data:`pipeweaver.ir.MODULES`."""

    microbatch: int
    """Microbatch index within the step."""

    kind: Kind
    """Forward or backward."""

    def __str__(self) -> str:
        return f"{MODULE_LETTER[self.module]}{self.kind.value}{self.microbatch}"


def group_of(compute: Compute) -> SegmentGroup:
    """The segment group a compute belongs to."""
    return SegmentGroup(compute.module, compute.microbatch, compute.kind)


def segment_groups(
    placement: Placement, structure: MicrobatchStructure
) -> tuple[SegmentGroup, ...]:
    """Every segment group of a step, in the greedy default order (see :func:`default_order`).

    An encoder with no units in a microbatch has no group there.
    """
    groups = []
    for kind in (Kind.F, Kind.B):
        for m in range(structure.num_microbatches):
            for module in placement.modules:
                if module != "llm" and structure.num_subs(module, m) == 0:
                    continue
                groups.append(SegmentGroup(module, m, kind))
    return tuple(groups)


def default_order(placement: Placement, structure: MicrobatchStructure) -> tuple[SegmentGroup, ...]:
    """The order that reproduces :func:`pipeweaver.interleave.default_priority` exactly.

    Forward groups, then backward groups, each by (microbatch, module in
    :data:`pipeweaver.ir.MODULES` order): within one kind, the keys of
    :func:`order_priority` then compare as ``(microbatch, module, sub, chunk)`` do.
    """
    return segment_groups(placement, structure)


def order_priority(order: Sequence[SegmentGroup]) -> Callable[[Compute], tuple[int, int, int, int]]:
    """The phase-2 priority of an order of segment groups: ``(kind, position, sub, chunk)``.

    Forwards (kind 0) before backwards (kind 1) decides only the rare comparisons of a
    forward with a backward; within one kind, the earlier group in ``order`` runs first.

    Raises:
        ScheduleError: a group appears twice (and, when called, a compute's group is missing).
    """
    # Keyed by plain tuples: phase 2 asks once per compute per rollout, and a tuple is made
    # and hashed in C where a SegmentGroup would be a dataclass call and a Python hash.
    position = {(g.module, g.microbatch, g.kind): i for i, g in enumerate(order)}
    if len(position) != len(order):
        raise ScheduleError("a segment group appears twice in the priority order")

    def priority(compute: Compute) -> tuple[int, int, int, int]:
        kind = compute.kind
        try:
            return (kind is Kind.B, position[compute.module, compute.microbatch, kind],
                    compute.sub, compute.chunk)  # fmt: skip
        except KeyError:
            raise ScheduleError(
                f"the priority order has no segment group {group_of(compute)}", action=compute
            ) from None

    return priority


def format_order(order: Sequence[SegmentGroup]) -> str:
    """The order as a compact string: ``vF0 lF0 vF1 ... | lB0 vB0 ...``."""
    fwd = [str(g) for g in order if g.kind is Kind.F]
    bwd = [str(g) for g in order if g.kind is Kind.B]
    return " ".join(fwd) + " | " + " ".join(bwd)


class SegmentSpace:
    """The canonical orders of a step's segment groups, as moves over group indices.

    Only the order of the forward groups among themselves and that of the backward groups
    matter, so a canonical order alternates them: forward, backward, forward, ... (the rest
    of one kind once the other runs out). Alternating lets the tree search refine the head of
    both orders near its root, where the first microbatches are decided. A partial order is
    a prefix of group indices (into :attr:`groups`, which lists the forward groups first);
    every complete canonical order is reached by exactly one sequence of moves.

    Args:
        placement: where each chunk lives.
        structure: microbatches and subs of the step.
    """

    def __init__(self, placement: Placement, structure: MicrobatchStructure):
        self.groups: tuple[SegmentGroup, ...] = segment_groups(placement, structure)
        self.num_forward: int = sum(1 for g in self.groups if g.kind is Kind.F)
        self.index = {g: i for i, g in enumerate(self.groups)}

    def __len__(self) -> int:
        return len(self.groups)

    def next_is_forward(self, forwards_placed: int, backwards_placed: int) -> bool:
        """Whether the next position of a canonical order holds a forward group."""
        forwards_left = forwards_placed < self.num_forward
        backwards_left = backwards_placed < len(self.groups) - self.num_forward
        return forwards_left and (forwards_placed <= backwards_placed or not backwards_left)

    def moves(self, prefix: Sequence[int]) -> list[int]:
        """Indices that may follow a canonical prefix, in index order."""
        placed = set(prefix)
        nf = sum(1 for i in prefix if i < self.num_forward)
        if self.next_is_forward(nf, len(prefix) - nf):
            return [i for i in range(self.num_forward) if i not in placed]
        return [i for i in range(self.num_forward, len(self.groups)) if i not in placed]

    def merge(self, forwards: Sequence[int], backwards: Sequence[int]) -> tuple[int, ...]:
        """The canonical order of a forward order and a backward order."""
        out: list[int] = []
        f = b = 0
        while f < len(forwards) or b < len(backwards):
            if self.next_is_forward(f, b):
                out.append(int(forwards[f]))
                f += 1
            else:
                out.append(int(backwards[b]))
                b += 1
        return tuple(out)

    def default(self) -> tuple[int, ...]:
        """:func:`default_order` as a canonical order."""
        nf = self.num_forward
        return self.merge(range(nf), range(nf, len(self.groups)))

    def to_groups(self, indices: Sequence[int]) -> tuple[SegmentGroup, ...]:
        """Group indices as groups."""
        return tuple(self.groups[i] for i in indices)

    def to_indices(self, order: Sequence[SegmentGroup]) -> tuple[int, ...]:
        """Any complete order of groups as its canonical order.

        Raises:
            ScheduleError: the order is not a permutation of this step's groups.
        """
        try:
            idx = [self.index[g] for g in order]
        except KeyError as e:
            raise ScheduleError(f"the step has no segment group {e.args[0]}") from None
        if sorted(idx) != list(range(len(self.groups))):
            raise ScheduleError(
                f"a priority order must list each of the step's {len(self.groups)} segment "
                f"groups once, got {len(order)} entries ({len(set(idx))} distinct)"
            )
        nf = self.num_forward
        return self.merge([i for i in idx if i < nf], [i for i in idx if i >= nf])


__all__ = [
    "SegmentGroup",
    "SegmentSpace",
    "default_order",
    "format_order",
    "group_of",
    "order_priority",
    "segment_groups",
]
