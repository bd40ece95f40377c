# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The schedule IR's vocabulary and grammar: the actions a pipeline rank runs.

One IR for the whole project. The generators (:mod:`pipeweaver.generators`,
:mod:`pipeweaver.interleave`) produce schedules of it (:mod:`pipeweaver.schedule`),
:mod:`pipeweaver.checker` validates them, SEMU (:mod:`pipeweaver.semu`) simulates them and the
runtime (:mod:`pipeweaver.runtime`) executes them. Where chunks live is
:mod:`pipeweaver.placement`; what each compute consumes is :mod:`pipeweaver.dataflow`.

Vocabulary (DIP's, and Megatron's for the stage):

* **module**: ``vision``, ``audio`` (the encoders) or ``llm``;
* **chunk**: a contiguous range of a module's layers placed on one pipeline rank; chunk ``c``
  of a module feeds chunk ``c + 1``;
* **microbatch**: a group of samples; the LLM sees it as one packed sequence;
* **sub-microbatch** (*sub*): a group of a microbatch's encoder units that flows through the
  encoder's chunks on its own; the LLM always has sub 0;
* **compute**: the forward (F) or backward (B) of one chunk on one (sub-)microbatch: a
  :class:`Compute` action; the F and the B of the same chunk and (sub-)microbatch form an *F/B
  pair*;
* **stage**: a pipeline stage, as in Megatron: one pipeline rank and the chunks it holds.

String form, compact and round-trippable (``parse(str(a)) == a``)::

    compute := MODULE CHUNK KIND MICROBATCH ["." SUB] ["+" MEMORY]
    comm    := ("s" | "r") PEER ":" MODULE CHUNK KIND MICROBATCH ["." SUB] ["@" MODULE "." SUB]
    MODULE  := "v" | "a" | "l"          vision, audio, llm
    KIND    := "F" | "B"
    MEMORY  := "r" | "o" | "s" | "l" N  recompute, offload, selective, first N layers
                                        (absent: keep activations)

Encoder computes always print their sub, LLM computes never do: ``v1F3.0`` is vision chunk 1,
forward, microbatch 3, sub 0; ``l0B2+r`` is the backward of LLM chunk 0 on microbatch 2 with
the chunk recomputed, ``l0B2+s`` with its core attention recomputed, ``l0B2+l3`` with its first
3 layers recomputed. ``s1:v1F3.0`` sends the output of ``v1F3.0`` to rank 1; ``r0:l0B2@v.1``
receives from rank 0 the part of ``l0B2``'s input gradient that belongs to vision sub 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Union

from orchestration.workload import PHASES

MODULES: tuple[str, ...] = PHASES
"""Every module, encoders first, in the order a sample flows through them: the balancer's
phases (:data:`orchestration.workload.PHASES`), so that the balancer and the IR share one
order."""

MODULE_INDEX: Mapping[str, int] = {m: i for i, m in enumerate(MODULES)}
"""Position of each module in :data:`MODULES` (schedulers order computes by it)."""

ENCODERS: tuple[str, ...] = tuple(m for m in MODULES if m != "llm")
"""The modules whose outputs are spliced into the LLM sequence."""

MODULE_LETTER: Mapping[str, str] = {m: m[0] for m in MODULES}
"""One-letter module names of the string form: each module's initial."""

LETTER_MODULE: Mapping[str, str] = {v: k for k, v in MODULE_LETTER.items()}
"""Inverse of :data:`MODULE_LETTER`."""

# Two modules sharing an initial would make the string form ambiguous.
assert len(LETTER_MODULE) == len(MODULES), "module initials must differ"


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
    """Forward or backward of a compute."""

    F = "F"
    B = "B"


class Memory(str, Enum):
    """What the forward of a chunk keeps for its backward.

    Both computes of an F/B pair carry the same strategy.
    """

    NONE = "none"
    """Keep every activation the backward needs."""

    RECOMPUTE = "recompute"
    """Keep only the chunk's input; the backward reruns the forward first."""

    OFFLOAD = "offload"
    """Move the activations to host memory after the forward and back before the backward."""

    SELECTIVE = "selective"
    """Keep everything but each layer's core attention, which the backward reruns (Megatron's
    ``--recompute-granularity selective``, for this pair only)."""

    LAYERS = "layers"
    """Keep only the inputs of the chunk's first :attr:`Compute.recompute_layers` layers,
    whose forwards the backward reruns, and everything of the others (Megatron's
    ``--recompute-method block --recompute-num-layers n``, for this pair only)."""


_MEMORY_MARK = {
    Memory.RECOMPUTE: "r",
    Memory.OFFLOAD: "o",
    Memory.SELECTIVE: "s",
    Memory.LAYERS: "l",
}
_MARK_MEMORY = {v: k for k, v in _MEMORY_MARK.items()}


@dataclass(frozen=True, slots=True, order=True)
class Compute:
    """The forward or backward of one chunk on one (sub-)microbatch."""

    module: str
    """One of :data:`MODULES`."""

    chunk: int
    """Index of the chunk within its module (0 holds the module's input layer)."""

    kind: Kind
    """F or B."""

    microbatch: int
    """Microbatch index within the step."""

    sub: int = 0
    """Sub-microbatch index; always 0 for the LLM."""

    memory: Memory = Memory.NONE
    """Memory strategy of this compute (the same on both halves of its F/B pair)."""

    recompute_layers: int = 0
    """With :attr:`Memory.LAYERS`, how many of the chunk's first layers are recomputed (>= 1);
    0 with every other strategy."""

    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Coerce so that "F" and Kind.F give equal, equally hashed actions.
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", Kind(self.kind))
        if type(self.memory) is not Memory:
            object.__setattr__(self, "memory", Memory(self.memory))
        module, chunk, microbatch, sub = self.module, self.chunk, self.microbatch, self.sub
        if module not in MODULE_LETTER:
            raise ScheduleError(f"unknown module {module!r}; expected one of {MODULES}")
        # Millions of computes are made per simulated step: one test for the valid case.
        if not (
            type(chunk) is int
            and type(microbatch) is int
            and type(sub) is int
            and chunk >= 0
            and microbatch >= 0
            and sub >= 0
        ):
            for value, name in ((chunk, "chunk"), (microbatch, "microbatch"), (sub, "sub")):
                if type(value) is not int or value < 0:
                    raise ScheduleError(f"{name} must be an int >= 0, got {value!r}")
        if sub != 0 and module == "llm":
            raise ScheduleError(f"the LLM has no sub-microbatches, got sub {sub}")
        memory = self.memory
        # One test in the common case (no layer count, not LAYERS).
        if self.recompute_layers or memory is Memory.LAYERS:
            layers = self.recompute_layers
            if memory is not Memory.LAYERS:
                raise ScheduleError(
                    f"recompute_layers applies to memory strategy layers only, got {layers} "
                    f"with {memory.value}"
                )
            if type(layers) is not int or layers < 1:
                raise ScheduleError(f"recompute_layers must be an int >= 1, got {layers!r}")
        # Simulators and checkers hash actions millions of times: hash once, on plain values
        # (``_value_`` is what the enums' ``value`` property returns, without its lookup). The
        # layer count is left out, as cheap as before: only first-n variants of one compute
        # share a hash, and equality tells them apart.
        object.__setattr__(
            self, "_hash", hash((module, chunk, self.kind._value_, microbatch, sub, memory._value_))
        )

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt, not restored: the cached hash mixes string hashes, which differ between
        # processes (the schedule search's workers unpickle computes as dictionary keys).
        return Compute, (
            self.module, self.chunk, self.kind, self.microbatch, self.sub, self.memory,
            self.recompute_layers,
        )  # fmt: skip

    @property
    def key(self) -> "Compute":
        """The compute itself, without its memory strategy (nor its layer count): the id of the
        tensor it produces."""
        if self.memory is Memory.NONE:
            return self
        return Compute(self.module, self.chunk, self.kind, self.microbatch, self.sub)

    def partner(self) -> "Compute":
        """The other half of the F/B pair: the B of an F, the F of a B (same memory)."""
        other = Kind.B if self.kind is Kind.F else Kind.F
        return Compute(
            self.module, self.chunk, other, self.microbatch, self.sub, self.memory,
            self.recompute_layers,
        )  # fmt: skip

    def with_memory(self, memory: Memory | str, recompute_layers: int = 0) -> "Compute":
        """The same compute with another memory strategy (``recompute_layers`` with
        :attr:`Memory.LAYERS`)."""
        if memory is self.memory and recompute_layers == self.recompute_layers:
            return self  # computes are immutable; searches ask this of every compute per rollout
        return Compute(
            self.module, self.chunk, self.kind, self.microbatch, self.sub, memory, recompute_layers
        )

    @property
    def strategy(self) -> str:
        """The memory strategy as one word: the :class:`Memory` value, or ``layers<n>`` for the
        first n layers recomputed (SEMU's and the plans' name of it)."""
        if self.memory is Memory.LAYERS:
            return f"layers{self.recompute_layers}"
        return self.memory._value_

    def _id(self) -> str:
        sub = "" if self.module == "llm" else f".{self.sub}"
        return f"{MODULE_LETTER[self.module]}{self.chunk}{self.kind.value}{self.microbatch}{sub}"

    def __str__(self) -> str:
        mark = _MEMORY_MARK.get(self.memory)
        if not mark:
            return self._id()
        return f"{self._id()}+{mark}{self.recompute_layers or ''}"

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

    The tensor is named by the compute that produces it: the output activation of an F, or the
    input gradient of a B. LLM chunk 0's input gradient has one part per encoder sub that fed
    it, each sent separately, so ``part`` names the ``(encoder, sub)`` for those.
    """

    op: CommOp
    """Send or receive."""

    peer: int
    """The other rank."""

    tensor: Compute
    """The producing compute (its memory strategy is dropped: it does not change the tensor)."""

    part: Part | None = None
    """``(encoder, sub)`` for a part of LLM chunk 0's input gradient, else None."""

    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.op) is not CommOp:
            object.__setattr__(self, "op", CommOp(self.op))
        tensor = self.tensor
        if not isinstance(tensor, Compute):
            raise ScheduleError(f"a comm's tensor must be a Compute, got {tensor!r}")
        if tensor.memory is not Memory.NONE:
            tensor = tensor.key
            object.__setattr__(self, "tensor", tensor)
        peer = self.peer
        if type(peer) is not int and (isinstance(peer, bool) or not isinstance(peer, int)):
            raise ScheduleError(f"peer must be a rank >= 0, got {peer!r}")
        if peer < 0:
            raise ScheduleError(f"peer must be a rank >= 0, got {peer!r}")
        if self.part is not None:
            part = tuple(self.part)
            if len(part) != 2 or part[0] not in ENCODERS or not isinstance(part[1], int):
                raise ScheduleError(f"part must be (encoder, sub), got {self.part!r}")
            object.__setattr__(self, "part", part)
        needs_part = tensor.module == "llm" and tensor.chunk == 0 and tensor.kind is Kind.B
        if needs_part != (self.part is not None):
            raise ScheduleError(
                f"only LLM chunk 0's input gradient is sent in parts, got tensor "
                f"{tensor} with part {self.part}"
            )
        object.__setattr__(self, "_hash", hash((self.op._value_, self.peer, tensor, self.part)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt, not restored: the cached hash differs between processes (see Compute's).
        return Comm, (self.op, self.peer, self.tensor, self.part)

    @classmethod
    def trusted(cls, op: CommOp, peer: int, tensor: Compute, part: Part | None) -> "Comm":
        """The comm of these fields, without the constructor's checks and coercions, for
        callers that take them from a step's data flow (the lowering makes one per transfer
        end): ``op`` a :class:`CommOp`, ``tensor`` without a memory strategy, ``part`` a tuple
        exactly where the tensor is LLM chunk 0's input gradient."""
        c = object.__new__(cls)
        setattr_ = object.__setattr__
        setattr_(c, "op", op)
        setattr_(c, "peer", peer)
        setattr_(c, "tensor", tensor)
        setattr_(c, "part", part)
        setattr_(c, "_hash", hash((op._value_, peer, tensor, part)))
        return c

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

_MODULE_RE = "[" + "".join(MODULE_LETTER[m] for m in MODULES) + "]"
_ENCODER_RE = "[" + "".join(MODULE_LETTER[m] for m in ENCODERS) + "]"
_COMPUTE_RE = rf"({_MODULE_RE})(\d+)([FB])(\d+)(?:\.(\d+))?"
_COMPUTE = re.compile(rf"^{_COMPUTE_RE}(?:\+([ros]|l(\d+)))?$")
_COMM = re.compile(rf"^([sr])(\d+):{_COMPUTE_RE}(?:@({_ENCODER_RE})\.(\d+))?$")


def parse(text: str) -> Action:
    """Parse the string form of one action (see the module docstring for the grammar).

    Raises:
        ScheduleError: the text is not an action.
    """
    s = text.strip()
    m = _COMPUTE.match(s)
    if m:
        letter, chunk, kind, mb, sub, mark, layers = m.groups()
        return Compute(
            LETTER_MODULE[letter],
            int(chunk),
            Kind(kind),
            int(mb),
            int(sub or 0),
            Memory.LAYERS if layers else (_MARK_MEMORY[mark] if mark else Memory.NONE),
            int(layers or 0),
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
