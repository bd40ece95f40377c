# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A step's cross-rank transfers with integer ids, made once per data-flow piece.

The lowering, the checker and SEMU's replay each walk every compute of a step and ask the same
questions of it: on which rank its chunk lives, which of its inputs come from another rank and
which of its consumers live elsewhere. The answers depend only on the placement and on one
microbatch's :class:`~pipeweaver.dataflow.FlowPiece` (every dependency stays inside its
microbatch), and DP replicas share most pieces (the 84B model's 10,240 microbatches on 2,560
H100 have 384 pieces): :class:`PieceTransfers` answers them once per piece, with ids from 0,
and a :class:`TransferGraph` numbers a whole step by adding each microbatch's offsets.

Every transfer is one ``(tensor, part)`` with one consumer: the data flow's rules give each
output (or part of an input gradient) one consuming compute.
"""

from __future__ import annotations

from typing import Any

from pipeweaver.dataflow import FlowPiece, MicrobatchStructure, flow_pieces
from pipeweaver.ir import Comm, CommOp, Compute, Kind
from pipeweaver.placement import Placement


class PieceTransfers:
    """One microbatch's computes and cross-rank transfers, with ids from 0 (shared, never
    modified).

    Attributes:
        index: compute -> its id (its position in the piece).
        edges: per transfer id, its ``(tensor, part)``; numbered in the piece's compute order,
            then in each compute's :func:`~pipeweaver.dataflow.consumers` order.
        edge_id: ``(tensor, part)`` -> its transfer id.
        remote: compute -> ``(waits, sends)``: the transfer ids of its remote inputs (in
            :func:`~pipeweaver.dataflow.data_inputs` order) and ``(transfer id, consumer's
            rank)`` of its remote consumers (in consumers order).
        facts: compute -> ``(home, forward, local inputs, waits, sends)``: the rank that holds
            its chunk, the F of a B (None for an F), its inputs produced on its own rank, and
            ``remote``'s two.
        consumer: per transfer id, the compute that consumes it.
        src: per transfer id, the rank that produces it.
        consumer_ranks: per transfer id, the ranks of the computes that consume its tensor's
            part (the checker's endpoint test).
        send, recv: per transfer id, the lowered :class:`Comm` that sends it from its producer's
            rank and receives it there (shared by every schedule lowered with the piece).
        names: per compute id, its string form (SEMU's timeline names its events so).
    """

    __slots__ = (
        "index", "edges", "edge_id", "remote", "facts", "consumer", "src", "consumer_ranks",
        "send", "recv", "names",
    )  # fmt: skip

    def __init__(self, placement: Placement, piece: FlowPiece):
        computes = piece.computes
        self.index: dict[Compute, int] = dict(zip(computes, range(len(computes))))
        self.names: list[str] = [str(a) for a in computes]
        self.edges: list[tuple[Compute, Any]] = []
        self.edge_id: dict[tuple[Compute, Any], int] = {}
        self.remote: dict[Compute, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {}
        self.facts: dict[Compute, tuple] = {}
        self.consumer: list[Compute] = []
        self.src: list[int] = []
        self.consumer_ranks: list[frozenset[int]] = []
        self.send: list[Comm] = []
        self.recv: list[Comm] = []
        home = {m: tuple(cp.rank for cp in cps) for m, cps in placement.chunks.items()}
        ranks = [home[a.module][a.chunk] for a in computes]
        edges, edge_id = self.edges, self.edge_id
        sends_of = []
        for a, r in zip(computes, ranks):
            sends = []
            outputs = piece.outputs[a]
            for consumer, part in outputs:
                dst = home[consumer.module][consumer.chunk]
                if dst != r:
                    e = (a, part)
                    assert e not in edge_id, f"{a} part {part} has two consumers"
                    edge_id[e] = len(edges)
                    sends.append((len(edges), dst))
                    edges.append(e)
                    self.consumer.append(consumer)
                    self.src.append(r)
                    self.consumer_ranks.append(
                        frozenset(home[c.module][c.chunk] for c, p in outputs if p == part)
                    )
                    self.send.append(Comm.trusted(CommOp.SEND, dst, a, part))
                    self.recv.append(Comm.trusted(CommOp.RECV, r, a, part))
            sends_of.append(tuple(sends))
        for i, (a, r, sends) in enumerate(zip(computes, ranks, sends_of)):
            waits, local = [], []
            for p, part in piece.inputs[a]:
                if home[p.module][p.chunk] != r:
                    waits.append(edge_id[(p, part)])
                else:
                    local.append(p)
            self.remote[a] = (tuple(waits), sends)
            # The F of a B is its neighbour before it (FlowPiece lists F/B pairs side by side).
            forward = None if a.kind is Kind.F else computes[i - 1]
            self.facts[a] = (r, forward, tuple(local), tuple(waits), sends)


class TransferGraph:
    """The data flow of one (placement, structure) with integer ids.

    Computes and cross-rank transfers are numbered in the data flow's order; a microbatch's ids
    are its piece's ids (its :class:`PieceTransfers`, computed once for every step that shares
    the piece) plus the microbatch's offsets.

    Attributes:
        pieces: per microbatch, its transfers with ids from 0.
        compute_base: per microbatch, the id of its first compute.
        edge_base: per microbatch, the id of its first transfer.
        num_computes: computes of the step.
        num_edges: cross-rank transfers of the step.
    """

    def __init__(self, placement: Placement, structure: MicrobatchStructure):
        self.pieces: list[PieceTransfers] = []
        self.compute_base: list[int] = []
        self.edge_base: list[int] = []
        n_computes = n_edges = 0
        for piece in flow_pieces(placement, structure):
            transfers = piece.derived.get("transfers")
            if transfers is None:
                transfers = piece.derived["transfers"] = PieceTransfers(placement, piece)
            self.pieces.append(transfers)
            self.compute_base.append(n_computes)
            self.edge_base.append(n_edges)
            n_computes += len(transfers.index)
            n_edges += len(transfers.edges)
        self.num_computes = n_computes
        self.num_edges = n_edges

    def edge_of(self, tensor: Compute, part) -> int:
        """The id of the transfer of ``(tensor, part)``."""
        m = tensor.microbatch
        return self.edge_base[m] + self.pieces[m].edge_id[(tensor, part)]
