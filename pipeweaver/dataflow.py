# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The data flow of a step: which computes exist, what each consumes, who consumes its output.

A step's computes follow from its placement and its :class:`MicrobatchStructure` (microbatches,
and each encoder's subs per microbatch): :func:`all_computes` lists them all. The rules
(:func:`dependencies`, the one definition used by the lowering, the checker, SEMU and the
runtime):

* F of chunk ``c > 0`` needs F of chunk ``c - 1`` (same module, microbatch and sub);
* F of LLM chunk 0 for microbatch ``m`` needs F of the last chunk of every encoder, for every
  sub of ``m`` (an encoder with no units in ``m`` has no subs there);
* B of a chunk needs its own F (the activations it saved) and B of the next chunk; B of the
  last LLM chunk needs only its F (the loss);
* B of an encoder's last chunk for ``(m, s)`` needs B of LLM chunk 0 for ``m``: the gradient
  of the rows that sub ``s`` spliced into the LLM sequence (a *part* of that input gradient).

:func:`data_inputs` and :func:`consumers` give the tensors that travel between computes (the
saved activations of an F never do); :func:`dependency_graph` prepares them for list schedulers.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from pipeweaver.ir import ENCODERS, Action, Comm, Compute, Kind, Part, ScheduleError
from pipeweaver.placement import Placement


@dataclass(frozen=True)
class MicrobatchStructure:
    """How many microbatches a step has, and how many subs each encoder has in each."""

    num_microbatches: int
    """Microbatches of the step on this pipeline."""

    subs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Per encoder, the number of subs in each microbatch (0: no units of that encoder)."""

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise ScheduleError(
                f"a step needs at least one microbatch, got {self.num_microbatches}"
            )
        subs = {}
        for enc, counts in self.subs.items():
            if enc not in ENCODERS:
                raise ScheduleError(f"subs given for {enc!r}, which is not an encoder")
            counts = tuple(int(c) for c in counts)
            if len(counts) != self.num_microbatches or any(c < 0 for c in counts):
                raise ScheduleError(
                    f"{enc} needs {self.num_microbatches} sub counts >= 0, got {counts}"
                )
            subs[enc] = counts
        object.__setattr__(self, "subs", subs)

    def num_subs(self, encoder: str, microbatch: int) -> int:
        """Subs of an encoder in a microbatch (0 when the encoder is absent)."""
        counts = self.subs.get(encoder)
        return 0 if counts is None else counts[microbatch]

    def key(self) -> tuple:
        """A hashable fingerprint (for caches)."""
        return (self.num_microbatches, tuple(sorted(self.subs.items())))

    def __hash__(self) -> int:
        return hash(self.key())

    @classmethod
    def uniform(
        cls, num_microbatches: int, subs: Mapping[str, int] | None = None
    ) -> "MicrobatchStructure":
        """Every microbatch with the same number of subs per encoder."""
        subs = subs or {}
        return cls(num_microbatches, {e: (n,) * num_microbatches for e, n in subs.items()})


def all_computes(placement: Placement, structure: MicrobatchStructure) -> Iterator[Compute]:
    """Every compute (F and B) the step must run, without memory strategies; the B of each F
    comes right after it (:class:`DataFlow` users rely on this)."""
    for m in range(structure.num_microbatches):
        for module in placement.modules:
            subs = 1 if module == "llm" else structure.num_subs(module, m)
            for s in range(subs):
                for c in range(placement.num_chunks(module)):
                    for kind in (Kind.F, Kind.B):
                        yield Compute(module, c, kind, m, s)


def check_compute(a: Compute, placement: Placement, structure: MicrobatchStructure) -> None:
    """Raise unless the compute exists in this placement and structure.

    Raises:
        ScheduleError: naming what it does not have (module, chunk, microbatch or sub).
    """
    if a.module not in placement.chunks:
        raise ScheduleError(f"the model has no {a.module} module", action=a)
    if a.chunk >= placement.num_chunks(a.module):
        raise ScheduleError(
            f"{a.module} has {placement.num_chunks(a.module)} chunks, no chunk {a.chunk}", action=a
        )
    if a.microbatch >= structure.num_microbatches:
        raise ScheduleError(
            f"the step has {structure.num_microbatches} microbatches, no microbatch {a.microbatch}",
            action=a,
        )
    if a.module != "llm" and a.sub >= structure.num_subs(a.module, a.microbatch):
        raise ScheduleError(
            f"microbatch {a.microbatch} has {structure.num_subs(a.module, a.microbatch)} "
            f"{a.module} subs, no sub {a.sub}",
            action=a,
        )


def data_inputs(
    action: Compute, placement: Placement, structure: MicrobatchStructure
) -> list[tuple[Compute, Part | None]]:
    """The tensors a compute consumes from other computes: ``(producer, part)`` pairs.

    Its own F (for a B) is not listed: saved activations never travel.

    Raises:
        ScheduleError: the compute does not exist in this placement and structure.
    """
    a = action.key
    check_compute(a, placement, structure)
    last = placement.num_chunks(a.module) - 1
    if a.kind is Kind.F:
        if a.chunk > 0:
            return [(Compute(a.module, a.chunk - 1, Kind.F, a.microbatch, a.sub), None)]
        if a.module != "llm":
            return []
        return [
            (Compute(enc, placement.num_chunks(enc) - 1, Kind.F, a.microbatch, s), None)
            for enc in placement.encoders
            for s in range(structure.num_subs(enc, a.microbatch))
        ]
    if a.chunk < last:
        return [(Compute(a.module, a.chunk + 1, Kind.B, a.microbatch, a.sub), None)]
    if a.module == "llm":
        return []
    return [(Compute("llm", 0, Kind.B, a.microbatch, 0), (a.module, a.sub))]


def dependencies(
    action: Action, placement: Placement, structure: MicrobatchStructure
) -> tuple[Compute, ...]:
    """The computes an action needs finished before it can run (without memory strategies).

    The one definition of the data flow, used by the lowering, the checker, SEMU and the
    runtime. For a :class:`Comm`, the compute that produces its tensor.

    Raises:
        ScheduleError: the action names a compute that does not exist.
    """
    if isinstance(action, Comm):
        check_compute(action.tensor, placement, structure)
        return (action.tensor,)
    deps = [p for p, _ in data_inputs(action, placement, structure)]
    if action.kind is Kind.B:
        deps.insert(0, action.key.partner())
    return tuple(deps)


def dependency_graph(
    computes: Sequence[Compute], placement: Placement, structure: MicrobatchStructure
) -> tuple[dict[Compute, int], dict[Compute, list[Compute]]]:
    """For list schedulers: how many computes each compute waits for, and who waits for each.

    Returns:
        ``(missing, dependents)``: per compute, the count of its :func:`dependencies`, and the
        computes that depend on it.
    """
    missing: dict[Compute, int] = {}
    dependents: dict[Compute, list[Compute]] = {a: [] for a in computes}
    for a in computes:
        deps = dependencies(a, placement, structure)
        missing[a] = len(deps)
        for d in deps:
            dependents[d].append(a)
    return missing, dependents


def consumers(
    action: Compute, placement: Placement, structure: MicrobatchStructure
) -> list[tuple[Compute, Part | None]]:
    """The computes that consume a compute's output: ``(consumer, part)`` pairs.

    For a backward they are the producers' backwards, in the order :func:`data_inputs` lists
    the producers for its forward: the order of the forward's inputs, and so of the input
    gradients the backward returns (the runtime pairs them up in this order).

    Raises:
        ScheduleError: the compute does not exist.
    """
    a = action.key
    check_compute(a, placement, structure)
    last = placement.num_chunks(a.module) - 1
    if a.kind is Kind.F:
        if a.chunk < last:
            return [(Compute(a.module, a.chunk + 1, Kind.F, a.microbatch, a.sub), None)]
        if a.module == "llm":
            return []
        return [(Compute("llm", 0, Kind.F, a.microbatch, 0), None)]
    if a.chunk > 0:
        return [(Compute(a.module, a.chunk - 1, Kind.B, a.microbatch, a.sub), None)]
    if a.module != "llm":
        return []
    return [
        (Compute(enc, placement.num_chunks(enc) - 1, Kind.B, a.microbatch, s), (enc, s))
        for enc in placement.encoders
        for s in range(structure.num_subs(enc, a.microbatch))
    ]


@dataclass(frozen=True)
class DataFlow:
    """Every compute of one step with what it consumes and who consumes it, listed once.

    The greedy scheduler, the lowering, the checker and SEMU's replay each walk the whole data
    flow of a schedule; :func:`data_flow` lets them share one listing (the same entries
    :func:`data_inputs` and :func:`consumers` return, as tuples: shared, never modified).
    """

    computes: tuple[Compute, ...]
    """:func:`all_computes`, in its order: each F/B pair side by side, F first (the greedy
    scheduler finds a B's F one place before it)."""

    inputs: Mapping[Compute, tuple[tuple[Compute, Part | None], ...]]
    """Per compute (without memory strategy), :func:`data_inputs`."""

    outputs: Mapping[Compute, tuple[tuple[Compute, Part | None], ...]]
    """Per compute (without memory strategy), :func:`consumers`."""


FLOWS_KEPT = 4
"""How many steps' :class:`DataFlow` :func:`data_flow` keeps (most recently used): a
schedule is made, lowered, checked and simulated in a row, and the simulator keeps its own."""

PIECES_KEPT = 100_000
"""How many microbatches' pieces of a data flow :func:`data_flow` keeps (cleared past it)."""

_flows: OrderedDict[tuple, DataFlow] = OrderedDict()
_flows_lock = threading.Lock()  # the trainer plans the next batch's schedule in a thread
_pieces: dict[tuple, "FlowPiece"] = {}
# Pieces are keyed by their placement's id here, not by its key: hashing a placement's key (its
# chunks' dataclasses) for each of a step's microbatches cost more than the lookups. Ids are
# never reused, so a cleared table never gives one placement's pieces to another.
_placement_ids: dict[tuple, int] = {}
_next_placement_id = itertools.count()


class FlowPiece:
    """One microbatch's share of a :class:`DataFlow` (shared, never modified).

    Attributes:
        computes: the microbatch's computes in :func:`all_computes` order.
        inputs: per compute, :func:`data_inputs`.
        outputs: per compute, :func:`consumers`.
        derived: what users of the piece derive from it once for all the steps that share it
            (:mod:`pipeweaver.transfers`' transfer ids, the greedy scheduler's dependency ids),
            by the user's name.
    """

    __slots__ = ("computes", "inputs", "outputs", "derived")

    def __init__(self, computes: tuple, inputs: dict, outputs: dict):
        self.computes = computes
        self.inputs = inputs
        self.outputs = outputs
        self.derived: dict = {}


def clear_flow_caches() -> None:
    """Forget every kept :class:`DataFlow` and :class:`FlowPiece` (benchmarks time cold steps)."""
    with _flows_lock:
        _flows.clear()
        _pieces.clear()
        _placement_ids.clear()


def _microbatch_piece(placement: Placement, m: int, subs: tuple[int, ...]) -> FlowPiece:
    """One microbatch's share of a :class:`DataFlow`.

    Every dependency stays inside its microbatch, so a step's data flow is the union of its
    microbatches' pieces, and a piece depends only on the placement, the microbatch's index and
    its encoders' sub counts (``subs``, in :attr:`Placement.encoders` order). DP replicas share
    most pieces; each piece makes its computes once and lists the same objects as inputs and
    consumers, so the lookups that follow find them by identity. The entries equal
    :func:`data_inputs` and :func:`consumers` (their rules, without their checks: every compute
    listed exists).
    """
    encoders = placement.encoders
    n_subs = dict(zip(encoders, subs))
    made: dict[tuple, Compute] = {}
    computes = []
    for module in placement.modules:
        for s in range(1 if module == "llm" else n_subs[module]):
            for c in range(placement.num_chunks(module)):
                for kind in (Kind.F, Kind.B):
                    a = made[(module, c, kind, s)] = Compute(module, c, kind, m, s)
                    computes.append(a)
    inputs: dict[Compute, tuple] = {}
    outputs: dict[Compute, tuple] = {}
    F, B = Kind.F, Kind.B
    llm_f0, llm_b0 = made[("llm", 0, F, 0)], made[("llm", 0, B, 0)]
    for a in computes:
        module, c, s = a.module, a.chunk, a.sub
        last = placement.num_chunks(module) - 1
        if a.kind is F:
            if c > 0:
                ins = ((made[(module, c - 1, F, s)], None),)
            elif module != "llm":
                ins = ()
            else:
                ins = tuple(
                    (made[(e, placement.num_chunks(e) - 1, F, k)], None)
                    for e in encoders
                    for k in range(n_subs[e])
                )
            if c < last:
                outs = ((made[(module, c + 1, F, s)], None),)
            else:
                outs = () if module == "llm" else ((llm_f0, None),)
        else:
            if c < last:
                ins = ((made[(module, c + 1, B, s)], None),)
            else:
                ins = () if module == "llm" else ((llm_b0, (module, s)),)
            if c > 0:
                outs = ((made[(module, c - 1, B, s)], None),)
            elif module != "llm":
                outs = ()
            else:
                outs = tuple(
                    (made[(e, placement.num_chunks(e) - 1, B, k)], (e, k))
                    for e in encoders
                    for k in range(n_subs[e])
                )
        inputs[a] = ins
        outputs[a] = outs
    return FlowPiece(tuple(computes), inputs, outputs)


def flow_pieces(placement: Placement, structure: MicrobatchStructure) -> list[FlowPiece]:
    """Per microbatch of the step, its :class:`FlowPiece` (kept for later steps)."""
    pkey = placement.key()
    with _flows_lock:
        pid = _placement_ids.get(pkey)
        if pid is None:
            if len(_placement_ids) >= PIECES_KEPT:
                _placement_ids.clear()
            pid = _placement_ids[pkey] = next(_next_placement_id)
    out = []
    counts = [structure.subs.get(e) for e in placement.encoders]
    for m in range(structure.num_microbatches):
        subs = tuple(0 if n is None else n[m] for n in counts)
        pk = (pid, m, subs)
        piece = _pieces.get(pk)
        if piece is None:
            piece = _microbatch_piece(placement, m, subs)
            with _flows_lock:
                if len(_pieces) >= PIECES_KEPT:
                    _pieces.clear()
                _pieces[pk] = piece
        out.append(piece)
    return out


def data_flow(placement: Placement, structure: MicrobatchStructure) -> DataFlow:
    """The :class:`DataFlow` of a placement and structure (kept for the last few asked)."""
    pkey = placement.key()
    key = (pkey, structure.key())
    with _flows_lock:
        flow = _flows.get(key)
        if flow is not None:
            _flows.move_to_end(key)
            return flow
    computes: list[Compute] = []
    inputs: dict[Compute, tuple] = {}
    outputs: dict[Compute, tuple] = {}
    for piece in flow_pieces(placement, structure):
        computes.extend(piece.computes)
        inputs.update(piece.inputs)
        outputs.update(piece.outputs)
    flow = DataFlow(tuple(computes), inputs, outputs)
    with _flows_lock:
        _flows[key] = flow
        if len(_flows) > FLOWS_KEPT:
            _flows.popitem(last=False)
    return flow
