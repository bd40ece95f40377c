# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Placement: which pipeline rank holds each chunk of each module, and the chunk's layers.

A module's layers are cut into contiguous chunks; chunk ``c`` of a module feeds chunk ``c + 1``,
and chunk 0 holds the module's input layer, the last chunk its head (an encoder's projector, the
LLM's output layer and loss). These policies build placements:

* :meth:`Placement.baseline`: upstream Megatron's, every encoder whole on rank 0 and the LLM
  split evenly (round robin over the ranks with virtual pipeline stages);
* :meth:`Placement.interleaved`: DIP's, every module cut into P x K_i chunks, chunk j on rank
  j mod P;
* :meth:`Placement.balanced_stages`: the layers of every module, encoders first, cut into P x K
  consecutive pipeline stages of balanced weight, stage v on rank v mod P (a stage may end one
  module and start the next): with parameters as weights, Megatron's as DIP ran it (its
  baseline); with each layer's measured cost, stages of balanced time;
* :meth:`Placement.from_splits`: the same rule over explicit layer ranges (the partitioner's
  splits by measured cost, :mod:`pipeweaver.search.partition`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from orchestration.packing import balanced_contiguous_split
from pipeweaver.ir import MODULES, ScheduleError


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

    def stages(self) -> list[list[tuple[str, int]]]:
        """The pipeline stages Megatron's schedules run: every chunk, encoders first, in the
        order a sample flows through them, consecutive chunks on one rank forming one stage.

        Stage v of a Megatron layout is on rank v mod P: the baseline's stage 0 holds the
        encoders and LLM chunk 0, the others one LLM chunk each; a parameter-balanced layout's
        stage may hold the end of one module and the start of the next. Encoders are
        independent branches, so running one after the other along the stages respects the
        data flow (each chunk's inputs are in earlier stages, or earlier in its own).
        """
        out: list[list[tuple[str, int]]] = []
        last_rank = None
        for module, cps in self.chunks.items():
            for c, cp in enumerate(cps):
                if cp.rank != last_rank:
                    out.append([])
                    last_rank = cp.rank
                out[-1].append((module, c))
        return out

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

    @classmethod
    def from_splits(
        cls, num_ranks: int, splits: Mapping[str, Sequence[tuple[int, int]]]
    ) -> "Placement":
        """Explicit layer ranges per module, chunk j on rank j mod P.

        Args:
            num_ranks: pipeline ranks P.
            splits: per module present, the ``(start, stop)`` layers of each chunk in order
                (contiguous from layer 0; checked as every placement is).
        """
        chunks = {
            module: tuple(
                ChunkPlacement(j % num_ranks, int(a), int(b)) for j, (a, b) in enumerate(ranges)
            )
            for module, ranges in splits.items()
        }
        return cls(num_ranks, chunks)

    @classmethod
    def balanced_stages(
        cls, num_ranks: int, layer_weights: Mapping[str, Sequence[float]], chunks_per_rank: int = 1
    ) -> "Placement":
        """All layers, encoders first, cut into P x K consecutive stages whose largest weight is
        the smallest possible; stage v on rank v mod P. With parameter counts as the weights this
        is Megatron as DIP ran it (``--pipeline-layout balanced``); with each layer's cost in a
        typical iteration, stages of balanced time (``--pipeline-layout balanced-cost``).

        The layers are concatenated in :data:`~pipeweaver.ir.MODULES` order (encoders, then the
        LLM) and split by :func:`orchestration.packing.balanced_contiguous_split`; each module's
        chunks are its pieces of the stages it meets, so a stage that ends the vision encoder
        and starts the LLM holds one chunk of each, on one rank.

        Args:
            num_ranks: pipeline ranks P.
            layer_weights: per module present, the weight of each of its layers (the input
                layer counted in layer 0, the head in the last): parameters (e.g. SEMU's
                ``ModelCosts.chunk_params(module, i, i + 1)``) or costs
                (:func:`pipeweaver.search.partition.iteration_layer_costs`).
            chunks_per_rank: virtual pipeline stages per rank K (Megatron's
                ``--num-virtual-stages-per-pipeline-rank``).

        Raises:
            ScheduleError: no LLM, fewer layers than stages, or a negative weight.
        """
        if chunks_per_rank < 1:
            raise ScheduleError(f"chunks_per_rank must be >= 1, got {chunks_per_rank}")
        if not layer_weights.get("llm"):
            raise ScheduleError("a placement needs the llm module")
        unknown = set(layer_weights) - set(MODULES)
        if unknown:
            raise ScheduleError(f"unknown modules {sorted(unknown)}")
        owner: list[tuple[str, int]] = []  # (module, layer) of each concatenated layer
        weights: list[float] = []
        for module in MODULES:
            for i, w in enumerate(layer_weights.get(module, ())):
                if not w >= 0:
                    raise ScheduleError(f"{module} layer {i} has weight {w}; need >= 0")
                owner.append((module, i))
                weights.append(float(w))
        stages = num_ranks * chunks_per_rank
        if len(weights) < stages:
            raise ScheduleError(
                f"cannot cut {len(weights)} layers into {stages} non-empty pipeline stages"
            )
        chunks: dict[str, list[ChunkPlacement]] = {}
        for v, (a, b) in enumerate(balanced_contiguous_split(weights, stages)):
            rank = v % num_ranks
            i = a
            while i < b:  # one chunk per module the stage meets
                module, first = owner[i]
                j = i
                while j < b and owner[j][0] == module:
                    j += 1
                chunks.setdefault(module, []).append(ChunkPlacement(rank, first, first + j - i))
                i = j
        return cls(num_ranks, {m: tuple(c) for m, c in chunks.items()})
