# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The schedule IR: what every pipeline rank runs, in order, for one training step.

One IR for the whole project. The baseline generators (:mod:`pipeweaver.schedules`) and the
searcher produce it, :mod:`pipeweaver.checker` validates it, SEMU (:mod:`pipeweaver.semu`)
simulates it and the runtime executes it.

Vocabulary (DIP's, ``shared/research/pipeweaver.md`` section 2.1):

* **module**: ``vision``, ``audio`` (the encoders) or ``llm``;
* **chunk**: a contiguous range of a module's layers placed on one pipeline rank
  (:class:`Placement`); chunk ``c`` of a module feeds chunk ``c + 1``;
* **microbatch**: a group of samples; the LLM sees it as one packed sequence;
* **sub-microbatch** (*sub*): a group of a microbatch's encoder units that flows through the
  encoder's chunks on its own; the LLM always has sub 0;
* **stage**: the forward (F) or backward (B) of one chunk on one (sub-)microbatch: a
  :class:`Compute` action.

Data flow (:func:`dependencies`, the one definition everyone uses):

* F of chunk ``c > 0`` needs F of chunk ``c - 1`` (same module, microbatch and sub);
* F of LLM chunk 0 for microbatch ``m`` needs F of the last chunk of every encoder, for every
  sub of ``m`` (an encoder with no units in ``m`` has no subs there);
* B of a chunk needs its own F (the activations it saved) and B of the next chunk; B of the
  last LLM chunk needs only its F (the loss);
* B of an encoder's last chunk for ``(m, s)`` needs B of LLM chunk 0 for ``m``: the gradient
  of the rows that sub ``s`` spliced into the LLM sequence (a *part* of that input gradient).

String form, compact and round-trippable (``parse(str(a)) == a``)::

    compute := MODULE CHUNK KIND MICROBATCH ["." SUB] ["+" MEMORY]
    comm    := ("s" | "r") PEER ":" MODULE CHUNK KIND MICROBATCH ["." SUB] ["@" MODULE "." SUB]
    MODULE  := "v" | "a" | "l"          vision, audio, llm
    KIND    := "F" | "B"
    MEMORY  := "r" | "o"                recompute, offload (absent: keep activations)

Encoder stages always print their sub, LLM stages never do: ``v1F3.0`` is vision chunk 1,
forward, microbatch 3, sub 0; ``l0B2+r`` is the backward of LLM chunk 0 on microbatch 2 with
the chunk recomputed. ``s1:v1F3.0`` sends the output of ``v1F3.0`` to rank 1; ``r0:l0B2@v.1``
receives from rank 0 the part of ``l0B2``'s input gradient that belongs to vision sub 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Iterator, Mapping, Sequence, Union

MODULES: tuple[str, ...] = ("vision", "audio", "llm")
"""Every module, encoders first, in the order a sample flows through them."""

ENCODERS: tuple[str, ...] = ("vision", "audio")
"""The modules whose outputs are spliced into the LLM sequence."""

MODULE_LETTER: Mapping[str, str] = {"vision": "v", "audio": "a", "llm": "l"}
"""One-letter module names of the string form."""

LETTER_MODULE: Mapping[str, str] = {v: k for k, v in MODULE_LETTER.items()}


class ScheduleError(ValueError):
    """An invalid schedule or action; names the first offending action where there is one.

    Attributes:
        rank: the pipeline rank of the offending action (None when not tied to one).
        index: its position in that rank's action list (None for a missing action).
        action: its string form (None when not tied to one).
    """

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        index: int | None = None,
        action: "Action | str | None" = None,
    ):
        self.rank = rank
        self.index = index
        self.action = None if action is None else str(action)
        where = ""
        if rank is not None:
            where = f"rank {rank}"
            if index is not None:
                where += f" action {index}"
            if action is not None:
                where += f" '{action}'"
            where += ": "
        elif action is not None:
            where = f"'{action}': "
        super().__init__(where + message)


class Kind(str, Enum):
    """Forward or backward of a stage."""

    F = "F"
    B = "B"


class Memory(str, Enum):
    """What a stage keeps between its forward and its backward.

    The forward and the backward of one stage carry the same strategy.
    """

    NONE = "none"
    """Keep every activation the backward needs."""

    RECOMPUTE = "recompute"
    """Keep only the chunk's input; the backward reruns the forward first."""

    OFFLOAD = "offload"
    """Move the activations to host memory after the forward and back before the backward."""


_MEMORY_MARK = {Memory.RECOMPUTE: "r", Memory.OFFLOAD: "o"}
_MARK_MEMORY = {v: k for k, v in _MEMORY_MARK.items()}


@dataclass(frozen=True, slots=True, order=True)
class Compute:
    """The forward or backward of one chunk on one (sub-)microbatch."""

    module: str
    """"vision", "audio" or "llm"."""

    chunk: int
    """Index of the chunk within its module (0 holds the module's input layer)."""

    kind: Kind
    """F or B."""

    microbatch: int
    """Microbatch index within the step."""

    sub: int = 0
    """Sub-microbatch index; always 0 for the LLM."""

    memory: Memory = Memory.NONE
    """Memory strategy of this stage (the same on its F and its B)."""

    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Coerce so that "F" and Kind.F give equal, equally hashed actions.
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", Kind(self.kind))
        if type(self.memory) is not Memory:
            object.__setattr__(self, "memory", Memory(self.memory))
        if self.module not in MODULE_LETTER:
            raise ScheduleError(f"unknown module {self.module!r}; expected one of {MODULES}")
        for value, name in (
            (self.chunk, "chunk"),
            (self.microbatch, "microbatch"),
            (self.sub, "sub"),
        ):
            if type(value) is not int or value < 0:
                raise ScheduleError(f"{name} must be an int >= 0, got {value!r}")
        if self.module == "llm" and self.sub != 0:
            raise ScheduleError(f"the LLM has no sub-microbatches, got sub {self.sub}")
        # Simulators and checkers hash actions millions of times: hash once, on plain values.
        object.__setattr__(
            self,
            "_hash",
            hash(
                (
                    self.module,
                    self.chunk,
                    self.kind.value,
                    self.microbatch,
                    self.sub,
                    self.memory.value,
                )
            ),
        )

    def __hash__(self) -> int:
        return self._hash

    @property
    def key(self) -> "Compute":
        """The stage itself, without its memory strategy: the id of the tensor it produces."""
        if self.memory is Memory.NONE:
            return self
        return Compute(self.module, self.chunk, self.kind, self.microbatch, self.sub)

    @property
    def is_forward(self) -> bool:
        """Whether this is a forward."""
        return self.kind is Kind.F

    def partner(self) -> "Compute":
        """The other half of the stage pair: the B of an F, the F of a B (same memory)."""
        other = Kind.B if self.kind is Kind.F else Kind.F
        return Compute(self.module, self.chunk, other, self.microbatch, self.sub, self.memory)

    def with_memory(self, memory: Memory | str) -> "Compute":
        """The same stage with another memory strategy."""
        return Compute(self.module, self.chunk, self.kind, self.microbatch, self.sub, memory)

    def _id(self) -> str:
        sub = "" if self.module == "llm" else f".{self.sub}"
        return f"{MODULE_LETTER[self.module]}{self.chunk}{self.kind.value}{self.microbatch}{sub}"

    def __str__(self) -> str:
        mark = _MEMORY_MARK.get(self.memory)
        return self._id() + (f"+{mark}" if mark else "")

    def __repr__(self) -> str:
        return f"Compute({self})"


class CommOp(str, Enum):
    """Direction of a point-to-point transfer."""

    SEND = "s"
    RECV = "r"


Part = tuple[str, int]
"""``(encoder, sub)``: the slice of LLM chunk 0's input gradient that goes back to one encoder
sub-microbatch."""


@dataclass(frozen=True, slots=True)
class Comm:
    """A send or receive of one tensor to or from another rank.

    The tensor is named by the stage that produces it: the output activation of an F, or the
    input gradient of a B. LLM chunk 0's input gradient has one part per encoder sub that fed
    it, each sent separately, so ``part`` names the ``(encoder, sub)`` for those.
    """

    op: CommOp
    """Send or receive."""

    peer: int
    """The other rank."""

    tensor: Compute
    """The producing stage (its memory strategy is dropped: it does not change the tensor)."""

    part: Part | None = None
    """``(encoder, sub)`` for a part of LLM chunk 0's input gradient, else None."""

    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", CommOp(self.op))
        if not isinstance(self.tensor, Compute):
            raise ScheduleError(f"a comm's tensor must be a Compute, got {self.tensor!r}")
        object.__setattr__(self, "tensor", self.tensor.key)
        if isinstance(self.peer, bool) or not isinstance(self.peer, int) or self.peer < 0:
            raise ScheduleError(f"peer must be a rank >= 0, got {self.peer!r}")
        if self.part is not None:
            part = tuple(self.part)
            if len(part) != 2 or part[0] not in ENCODERS or not isinstance(part[1], int):
                raise ScheduleError(f"part must be (encoder, sub), got {self.part!r}")
            object.__setattr__(self, "part", part)
        needs_part = (
            self.tensor.module == "llm" and self.tensor.chunk == 0 and self.tensor.kind is Kind.B
        )
        if needs_part != (self.part is not None):
            raise ScheduleError(
                f"only LLM chunk 0's input gradient is sent in parts, got tensor "
                f"{self.tensor} with part {self.part}"
            )
        object.__setattr__(self, "_hash", hash((self.op.value, self.peer, self.tensor, self.part)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_send(self) -> bool:
        """Whether this is a send."""
        return self.op is CommOp.SEND

    @property
    def edge(self) -> tuple[Compute, Part | None]:
        """``(tensor, part)``: what travels, independent of direction."""
        return self.tensor, self.part

    def __str__(self) -> str:
        part = "" if self.part is None else f"@{MODULE_LETTER[self.part[0]]}.{self.part[1]}"
        return f"{self.op.value}{self.peer}:{self.tensor._id()}{part}"

    def __repr__(self) -> str:
        return f"Comm({self})"


Action = Union[Compute, Comm]
"""One entry of a rank's action list."""

_COMPUTE_RE = r"([val])(\d+)([FB])(\d+)(?:\.(\d+))?"
_COMPUTE = re.compile(rf"^{_COMPUTE_RE}(?:\+([ro]))?$")
_COMM = re.compile(rf"^([sr])(\d+):{_COMPUTE_RE}(?:@([va])\.(\d+))?$")


def parse(text: str) -> Action:
    """Parse the string form of one action (see the module docstring for the grammar).

    Raises:
        ScheduleError: the text is not an action.
    """
    s = text.strip()
    m = _COMPUTE.match(s)
    if m:
        letter, chunk, kind, mb, sub, mark = m.groups()
        return Compute(
            LETTER_MODULE[letter],
            int(chunk),
            Kind(kind),
            int(mb),
            int(sub or 0),
            _MARK_MEMORY[mark] if mark else Memory.NONE,
        )
    m = _COMM.match(s)
    if m:
        op, peer, letter, chunk, kind, mb, sub, part_letter, part_sub = m.groups()
        tensor = Compute(LETTER_MODULE[letter], int(chunk), Kind(kind), int(mb), int(sub or 0))
        part = None if part_letter is None else (LETTER_MODULE[part_letter], int(part_sub))
        return Comm(CommOp(op), int(peer), tensor, part)
    raise ScheduleError(f"not an action: {text!r} (expected e.g. 'v1F3.0', 'l0B2+r', 's1:l0F3')")


def parse_actions(text: str) -> list[Action]:
    """Parse a whitespace-separated list of actions."""
    return [parse(tok) for tok in text.split()]


# --------------------------------------------------------------------------------------------
# Placement


@dataclass(frozen=True, slots=True)
class ChunkPlacement:
    """Where one chunk lives and which layers it holds."""

    rank: int
    """Pipeline rank."""

    start: int
    """First layer (global index within the module)."""

    stop: int
    """One past the last layer."""

    @property
    def num_layers(self) -> int:
        """Layers of the chunk."""
        return self.stop - self.start


def split_layers(num_layers: int, num_chunks: int) -> list[tuple[int, int]]:
    """Split ``num_layers`` into ``num_chunks`` contiguous ranges, sizes differing by at most 1.

    The earlier chunks take the extra layers: chunk 0 of an encoder also embeds, and the last
    LLM chunk also runs the head, so the ends are where a smaller share helps least.

    Raises:
        ScheduleError: fewer layers than chunks.
    """
    if num_chunks < 1:
        raise ScheduleError(f"a module needs at least one chunk, got {num_chunks}")
    if num_layers < num_chunks:
        raise ScheduleError(f"cannot cut {num_layers} layers into {num_chunks} non-empty chunks")
    base, extra = divmod(num_layers, num_chunks)
    out, start = [], 0
    for c in range(num_chunks):
        size = base + (1 if c < extra else 0)
        out.append((start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class Placement:
    """Which rank holds each chunk of each module, and the chunk's layer range.

    The runtime builds ``ChunkId(module, start, stop)`` for every chunk whose rank is its own.
    """

    num_ranks: int
    """Pipeline ranks (P)."""

    chunks: Mapping[str, tuple[ChunkPlacement, ...]]
    """Per module present in the model, its chunks in order."""

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ScheduleError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if "llm" not in self.chunks:
            raise ScheduleError("a placement needs the llm module")
        ordered = {}
        for module in MODULES:
            if module not in self.chunks:
                continue
            cps = tuple(self.chunks[module])
            if not cps:
                raise ScheduleError(f"{module} has no chunks")
            stop = 0
            for c, cp in enumerate(cps):
                if cp.start != stop or cp.stop <= cp.start:
                    raise ScheduleError(
                        f"{module} chunk {c} holds layers [{cp.start}, {cp.stop}); chunks must be "
                        f"non-empty and contiguous from layer 0"
                    )
                if not 0 <= cp.rank < self.num_ranks:
                    raise ScheduleError(
                        f"{module} chunk {c} is on rank {cp.rank}, outside 0..{self.num_ranks - 1}"
                    )
                stop = cp.stop
            ordered[module] = cps
        unknown = set(self.chunks) - set(MODULES)
        if unknown:
            raise ScheduleError(f"unknown modules {sorted(unknown)}")
        object.__setattr__(self, "chunks", ordered)

    @property
    def modules(self) -> tuple[str, ...]:
        """Modules present, encoders first."""
        return tuple(self.chunks)

    @property
    def encoders(self) -> tuple[str, ...]:
        """Encoders present."""
        return tuple(m for m in self.chunks if m != "llm")

    def num_chunks(self, module: str) -> int:
        """Chunks of a module."""
        return len(self.chunks[module])

    def num_layers(self, module: str) -> int:
        """Layers of a module."""
        return self.chunks[module][-1].stop

    def rank_of(self, module: str, chunk: int) -> int:
        """Rank that holds a chunk."""
        return self.chunks[module][chunk].rank

    def layer_range(self, module: str, chunk: int) -> tuple[int, int]:
        """``(start, stop)`` layers of a chunk: with the module, the runtime's ``ChunkId``."""
        cp = self.chunks[module][chunk]
        return cp.start, cp.stop

    def chunks_on(self, rank: int) -> list[tuple[str, int]]:
        """``(module, chunk)`` of every chunk on a rank."""
        return [
            (module, c)
            for module, cps in self.chunks.items()
            for c, cp in enumerate(cps)
            if cp.rank == rank
        ]

    def key(self) -> tuple:
        """A hashable fingerprint (for caches)."""
        return (self.num_ranks, tuple((m, cps) for m, cps in self.chunks.items()))

    def __hash__(self) -> int:
        return hash(self.key())

    @classmethod
    def baseline(
        cls, num_ranks: int, layers: Mapping[str, int], llm_chunks_per_rank: int = 1
    ) -> "Placement":
        """Upstream Megatron: every encoder whole on rank 0, the LLM split evenly.

        With ``llm_chunks_per_rank`` K > 1 the LLM is cut into P*K chunks, chunk j on rank
        j mod P (Megatron's interleaved schedule); the encoders stay whole on rank 0.

        Args:
            num_ranks: pipeline ranks P.
            layers: layers per module present ("llm" required; an encoder with 0 layers is
                absent).
            llm_chunks_per_rank: virtual pipeline stages of the LLM.
        """
        chunks: dict[str, tuple[ChunkPlacement, ...]] = {}
        for module in MODULES:
            n = layers.get(module, 0)
            if module != "llm" and n > 0:
                chunks[module] = (ChunkPlacement(0, 0, n),)
        n_llm = num_ranks * llm_chunks_per_rank
        chunks["llm"] = tuple(
            ChunkPlacement(j % num_ranks, a, b)
            for j, (a, b) in enumerate(split_layers(layers["llm"], n_llm))
        )
        return cls(num_ranks, chunks)

    @classmethod
    def interleaved(
        cls, num_ranks: int, layers: Mapping[str, int], chunks_per_rank: Mapping[str, int]
    ) -> "Placement":
        """DIP's layout: module i cut into P*K_i chunks, chunk j on rank j mod P.

        Args:
            num_ranks: pipeline ranks P.
            layers: layers per module present.
            chunks_per_rank: K_i per module (default 1 for a module not named).
        """
        chunks = {}
        for module in MODULES:
            n = layers.get(module, 0)
            if n <= 0:
                if module == "llm":
                    raise ScheduleError("a placement needs the llm module")
                continue
            k = chunks_per_rank.get(module, 1)
            chunks[module] = tuple(
                ChunkPlacement(j % num_ranks, a, b)
                for j, (a, b) in enumerate(split_layers(n, num_ranks * k))
            )
        return cls(num_ranks, chunks)


# --------------------------------------------------------------------------------------------
# Microbatch structure


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


# --------------------------------------------------------------------------------------------
# Dependencies


def stages(placement: Placement, structure: MicrobatchStructure) -> Iterator[Compute]:
    """Every stage (F and B) the step must run, without memory strategies."""
    for m in range(structure.num_microbatches):
        for module in placement.modules:
            subs = 1 if module == "llm" else structure.num_subs(module, m)
            for s in range(subs):
                for c in range(placement.num_chunks(module)):
                    for kind in (Kind.F, Kind.B):
                        yield Compute(module, c, kind, m, s)


def _check_stage(a: Compute, placement: Placement, structure: MicrobatchStructure) -> None:
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
    """The tensors a stage consumes from other stages: ``(producer, part)`` pairs.

    Its own F (for a B) is not listed: saved activations never travel.

    Raises:
        ScheduleError: the stage does not exist in this placement and structure.
    """
    a = action.key
    _check_stage(a, placement, structure)
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
    """The stages an action needs finished before it can run (without memory strategies).

    The one definition of the data flow, used by the lowering, the checker, SEMU and the
    runtime. For a :class:`Comm`, the stage that produces its tensor.

    Raises:
        ScheduleError: the action names a stage that does not exist.
    """
    if isinstance(action, Comm):
        _check_stage(action.tensor, placement, structure)
        return (action.tensor,)
    deps = [p for p, _ in data_inputs(action, placement, structure)]
    if action.kind is Kind.B:
        deps.insert(0, action.key.partner())
    return tuple(deps)


def dependency_graph(
    all_stages: Sequence[Compute], placement: Placement, structure: MicrobatchStructure
) -> tuple[dict[Compute, int], dict[Compute, list[Compute]]]:
    """For list schedulers: how many stages each stage waits for, and who waits for each.

    Returns:
        ``(missing, dependents)``: per stage, the count of its :func:`dependencies`, and the
        stages that depend on it.
    """
    missing: dict[Compute, int] = {}
    dependents: dict[Compute, list[Compute]] = {a: [] for a in all_stages}
    for a in all_stages:
        deps = dependencies(a, placement, structure)
        missing[a] = len(deps)
        for d in deps:
            dependents[d].append(a)
    return missing, dependents


def consumers(
    action: Compute, placement: Placement, structure: MicrobatchStructure
) -> list[tuple[Compute, Part | None]]:
    """The stages that consume a stage's output: ``(consumer, part)`` pairs.

    Raises:
        ScheduleError: the stage does not exist.
    """
    a = action.key
    _check_stage(a, placement, structure)
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


# --------------------------------------------------------------------------------------------
# Schedule


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists for one step, with the placement and microbatch structure.

    A *compute-only* schedule lists only :class:`Compute` actions (the searcher's output and
    SEMU's input); :func:`pipeweaver.lowering.lower` adds the :class:`Comm` actions that the
    runtime executes and the checker validates.
    """

    placement: Placement
    """Where each chunk lives."""

    structure: MicrobatchStructure
    """Microbatches and subs of the step."""

    actions: tuple[tuple[Action, ...], ...]
    """``actions[r]``: rank r's actions in execution order."""

    name: str = ""
    """Which generator made it (for logs and traces)."""

    def __post_init__(self) -> None:
        actions = tuple(tuple(rank) for rank in self.actions)
        if len(actions) != self.placement.num_ranks:
            raise ScheduleError(
                f"the placement has {self.placement.num_ranks} ranks but the schedule lists "
                f"{len(actions)}"
            )
        object.__setattr__(self, "actions", actions)

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks."""
        return self.placement.num_ranks

    @property
    def has_comms(self) -> bool:
        """Whether communication actions are present (a lowered schedule)."""
        return any(isinstance(a, Comm) for rank in self.actions for a in rank)

    def computes(self, rank: int) -> list[Compute]:
        """Rank ``rank``'s compute actions, in order."""
        return [a for a in self.actions[rank] if isinstance(a, Compute)]

    def compute_only(self) -> "Schedule":
        """The same order without communication actions."""
        return Schedule(
            self.placement,
            self.structure,
            tuple(tuple(a for a in rank if isinstance(a, Compute)) for rank in self.actions),
            self.name,
        )

    def dependencies(self, action: Action) -> tuple[Compute, ...]:
        """:func:`dependencies` in this schedule's placement and structure."""
        return dependencies(action, self.placement, self.structure)

    def format(self) -> str:
        """One line per rank: ``rank R: a0 a1 ...``."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in rank) for r, rank in enumerate(self.actions)
        )

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def from_strings(
        cls,
        placement: Placement,
        structure: MicrobatchStructure,
        ranks: Sequence[str | Iterable[str]],
        name: str = "",
    ) -> "Schedule":
        """Build from per-rank strings (``"l0F0 s1:l0F0 ..."``) or lists of action strings."""
        actions = []
        for rank in ranks:
            tokens = rank.split() if isinstance(rank, str) else list(rank)
            actions.append(tuple(parse(t) for t in tokens))
        return cls(placement, structure, tuple(actions), name)

    def to_json(self) -> dict:
        """A JSON object: placement, structure and the per-rank action strings."""
        return {
            "name": self.name,
            "num_ranks": self.num_ranks,
            "placement": {
                m: [[cp.rank, cp.start, cp.stop] for cp in cps]
                for m, cps in self.placement.chunks.items()
            },
            "num_microbatches": self.structure.num_microbatches,
            "subs": {e: list(c) for e, c in self.structure.subs.items()},
            "actions": [[str(a) for a in rank] for rank in self.actions],
        }

    @classmethod
    def from_json(cls, obj: Mapping) -> "Schedule":
        """Inverse of :meth:`to_json`."""
        placement = Placement(
            int(obj["num_ranks"]),
            {
                m: tuple(ChunkPlacement(int(r), int(a), int(b)) for r, a, b in cps)
                for m, cps in obj["placement"].items()
            },
        )
        structure = MicrobatchStructure(
            int(obj["num_microbatches"]), {e: tuple(c) for e, c in obj.get("subs", {}).items()}
        )
        return cls.from_strings(placement, structure, obj["actions"], obj.get("name", ""))
