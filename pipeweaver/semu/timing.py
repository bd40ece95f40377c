# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Time of every compute and collective on a cluster.

Compute: each op (a chunk's linear work, its attention, its input layer or head) takes

    max(FLOPs / (peak x efficiency), bytes / (memory bandwidth x memory efficiency))

(DIP's analytical model), plus the chunk's tensor-parallel collectives, which Megatron does not
overlap. A :class:`~orchestration.calibration.Calibration` replaces this with measured per-layer
times for the modules it covers: then a layer over packed sequences of lengths n_i takes ``const +
per_sequence * (k - 1) + linear * sum(n_i) + quadratic * sum(n_i**2)`` (forward; backward =
``backward_ratio`` x forward), plus the measured input layer and head per token.

Communication (per device, bytes per direction):

* p2p: ``latency + bytes / (bandwidth x efficiency)``, NVLink inside a node, the NIC between;
* ring all-reduce over n devices: ``2 (n-1) latency + 2 (n-1)/n bytes / bandwidth``;
* reduce-scatter and all-gather: half of that;
* all-to-all: each device sends and receives its bytes for the others; the slowest device
  sets the time, with the share that stays in its node on NVLink and the rest on its NIC.

A group that spans nodes runs at the network bandwidth (rail-optimised fabrics give each GPU its
own NIC).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from orchestration.calibration import Calibration, LayerTimeModel
from pipeweaver.semu.batches import MicrobatchMeta
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.work import ComputeWork, ModelCosts

_WHOLE_CHUNK = frozenset(("recompute", "offload"))
"""Strategies that keep only the chunk's input: Megatron's recompute inside it does not apply."""


@dataclass(frozen=True)
class ComputeCost:
    """Time and memory of one compute on one device."""

    time_s: float
    """Duration of the compute, TP collectives included."""

    kept_bytes: float
    """Activation bytes kept from its F to its B."""

    transient_bytes: float
    """Extra bytes alive during the compute only."""


class KeptBytes:
    """Bytes an F/B pair keeps from its F to its B, per :meth:`Semu.compute_cost
    <pipeweaver.semu.simulator.Semu.compute_cost>` (what :meth:`Semu.activation_bytes
    <pipeweaver.semu.simulator.Semu.activation_bytes>` returns). A class, not a closure: the
    schedule search's worker processes unpickle it.

    Args:
        semu: the simulator whose compute costs count.
        placement: where each chunk lives.
        microbatches: SEMU's metadata of each microbatch.
        memory: count every compute as if it had this memory strategy (None: its own).
    """

    def __init__(self, semu, placement, microbatches: Sequence[MicrobatchMeta], memory=None):
        self.semu, self.placement, self.memory = semu, placement, memory
        self.microbatches = tuple(microbatches)

    def __call__(self, a) -> int:
        if self.memory is not None:
            a = a.with_memory(self.memory)
        mb = self.microbatches[a.microbatch]
        return int(self.semu.compute_cost(self.placement, a, mb).kept_bytes)


class CommModel:
    """Collective and point-to-point times on a cluster.

    Args:
        cluster: devices and their links.
        calibration: its ``comm`` section, when given, replaces the device's p2p latency and
            bandwidth (both intra- and inter-node: the CPU job has one host).
    """

    def __init__(self, cluster: ClusterSpec, calibration: Calibration | None = None):
        dev, eff = cluster.device, cluster.efficiency
        self.cluster = cluster
        self.intra_bw = dev.intra_node_bandwidth * eff.intra_node
        self.inter_bw = dev.inter_node_bandwidth * eff.inter_node
        self.intra_lat = dev.intra_node_latency_s
        self.inter_lat = dev.inter_node_latency_s
        comm = calibration.comm if calibration is not None else {}
        if "p2p_bandwidth" in comm:
            self.intra_bw = self.inter_bw = float(comm["p2p_bandwidth"])
        if "p2p_latency_s" in comm:
            self.intra_lat = self.inter_lat = float(comm["p2p_latency_s"])
        # Collectives of the transport (gloo's all-reduce), when measured apart from p2p:
        # ``(bandwidth, latency)`` for every ring collective, else the p2p link's.
        self.collective: tuple[float, float] | None = None
        if "allreduce_bandwidth" in comm and "allreduce_latency_s" in comm:
            self.collective = (
                float(comm["allreduce_bandwidth"]),
                float(comm["allreduce_latency_s"]),
            )

    def _link(self, intra: bool) -> tuple[float, float]:
        return (self.intra_bw, self.intra_lat) if intra else (self.inter_bw, self.inter_lat)

    def p2p(self, nbytes: float, intra: bool) -> float:
        """One transfer between two devices."""
        bw, lat = self._link(intra)
        return lat + nbytes / bw

    def p2p_parts(self, nbytes: float, intra: bool) -> tuple[float, float]:
        """``(occupancy, latency)`` of a transfer: the link is busy for the first part."""
        bw, lat = self._link(intra)
        return nbytes / bw, lat

    def _collective_link(self, intra: bool) -> tuple[float, float]:
        return self.collective if self.collective is not None else self._link(intra)

    def all_reduce(self, nbytes: float, n: int, intra: bool) -> float:
        """Ring all-reduce of ``nbytes`` on each of ``n`` devices."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self._collective_link(intra)
        return 2 * (n - 1) * lat + 2 * (n - 1) / n * nbytes / bw

    def reduce_scatter(self, nbytes: float, n: int, intra: bool) -> float:
        """Ring reduce-scatter (or all-gather) of ``nbytes`` per device."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self._collective_link(intra)
        return (n - 1) * lat + (n - 1) / n * nbytes / bw

    all_gather = reduce_scatter

    def all_to_all(
        self, matrix: Sequence[Sequence[float]], ranks: Sequence[int] | None = None
    ) -> float:
        """All-to-all where device i sends ``matrix[i][j]`` bytes to device j.

        Args:
            matrix: n x n bytes (the diagonal stays local and costs nothing).
            ranks: global ranks of the n devices, to tell intra- from inter-node traffic;
                default 0..n-1.
        """
        volume = np.array(matrix, dtype=np.float64)  # a copy: its diagonal is cleared
        n = volume.shape[0]
        if n <= 1:
            return 0.0
        np.fill_diagonal(volume, 0.0)
        ranks = list(ranks) if ranks is not None else list(range(n))
        node = np.array([self.cluster.node_of(r) for r in ranks])
        same = node[:, None] == node[None, :]
        intra = np.where(same, volume, 0.0)
        inter = np.where(same, 0.0, volume)
        worst = 0.0
        # Summed over axis 0 of C-ordered arrays, each device's bytes add up peer by peer in
        # rank order (not pairwise): sends are the transposes' columns, receives the columns.
        for intra_b, inter_b in (
            (np.ascontiguousarray(intra.T).sum(axis=0), np.ascontiguousarray(inter.T).sum(axis=0)),
            (intra.sum(axis=0), inter.sum(axis=0)),
        ):
            t = np.maximum(
                intra_b / self.intra_bw + np.where(intra_b != 0, self.intra_lat, 0.0),
                inter_b / self.inter_bw + np.where(inter_b != 0, self.inter_lat, 0.0),
            )
            worst = max(worst, float(t.max()))
        return worst

    def all_to_all_total(self, bytes_per_device: float, n: int, intra: bool) -> float:
        """All-to-all where each of n devices sends ``bytes_per_device`` spread evenly."""
        if n <= 1 or bytes_per_device <= 0:
            return 0.0
        bw, lat = self._link(intra)
        return (n - 1) * lat + (n - 1) / n * bytes_per_device / bw


class TimeModel:
    """Compute and collective times, and compute memory, for one model on one cluster.

    Args:
        spec: the model and its parallel layout.
        cluster: the devices.
        calibration: measured layer times (per module) and fitted efficiency factors; None
            for the purely analytical model.
    """

    def __init__(
        self, spec: ModelSpec, cluster: ClusterSpec, calibration: Calibration | None = None
    ):
        self.spec = spec
        self.cluster = cluster
        self.calibration = calibration
        self.costs = ModelCosts(spec, flash_attention=cluster.device.flash_attention)
        eff = cluster.efficiency
        if calibration is not None and calibration.efficiency:
            eff = eff.replace(**calibration.efficiency)
        dev = cluster.device
        peak = dev.peak_flops
        bw = dev.hbm_bandwidth
        if calibration is not None:
            peak = float(calibration.hardware.get("peak_flops", peak))
            bw = float(calibration.hardware.get("hbm_bandwidth", bw))
        self.peak_flops = peak
        self.flops_rate = peak * eff.compute
        self.attention_rate = peak * eff.attention
        self.memory_rate = bw * eff.memory
        self.efficiency = eff
        self.comm = CommModel(cluster, calibration)
        self.tp_intra = spec.parallel.tensor <= cluster.devices_per_node
        self.host = dict(calibration.host) if calibration is not None else {}
        # Ranks that share a node's cores, caches and memory bandwidth (the CPU job's
        # processes) compute slower together than alone: the measured factor, when given.
        shared = cluster.num_devices > 1 and cluster.devices_per_node > 1
        self.slowdown = float(self.host.get("shared_node_slowdown", 1.0)) if shared else 1.0
        self._fingerprint: str | None = None
        self._tables: dict[str, LayerTimeModel] = (
            dict(calibration.modules) if calibration is not None else {}
        )

    def host_time(self, microbatches: Sequence[MicrobatchMeta], rank: int) -> float:
        """Host seconds before the pipeline starts on a rank (building its microbatches), from the
        calibration's ``host`` section (0 without one)."""
        host = self.host
        if not host:
            return 0.0
        t = host.get("microbatch_s", 0.0) * len(microbatches)
        samples = sum(mb.num_samples or len(mb.llm_seq_lens) for mb in microbatches)
        real = sum(mb.real_tokens for mb in microbatches)
        t += host.get("sample_s", 0.0) * samples + host.get("token_s", 0.0) * real
        # Every rank cuts each microbatch's encoder units into its sub-microbatches.
        subs = sum(len(s) for mb in microbatches for s in mb.encoders.values())
        t += host.get("sub_split_s", 0.0) * subs
        if rank == 0:
            feats = 0.0
            for mb in microbatches:
                for enc, subs in mb.encoders.items():
                    dim = self.spec.shape.encoders[enc].input_flops_per_token / (
                        2 * self.spec.shape.encoders[enc].hidden_size
                    )
                    feats += dim * sum(sum(s.units) for s in subs)
            t += host.get("feature_s_per_element", 0.0) * feats
        return t * self.slowdown

    def transfer_host_s(self, at_step_start: bool = False) -> tuple[float, ...]:
        """The runtime's host seconds per posted send, per waited send, per posted receive (one
        of those posted back to back when the step starts with ``at_step_start``:
        ``recv_post_start_s``, else as any) and per waited receive (zero uncalibrated), and
        what a receive posted after its tensor was sent costs more while the sender computes
        (``recv_post_ready_s`` over ``recv_post_s``; 0 without it). A transfer also takes
        compute from both of its ranks (the transport's threads run on the cores they compute
        on, ``transfer_compute_s``): charged with its posts."""
        host, slow = self.host, self.slowdown
        transfer = host.get("transfer_compute_s", 0.0)
        recv_post = host.get("recv_post_s", 0.0)
        ready = max(0.0, host.get("recv_post_ready_s", recv_post) - recv_post)
        if at_step_start:
            recv_post = host.get("recv_post_start_s", recv_post)
        return (
            (host.get("send_post_s", 0.0) + transfer) * slow,
            host.get("send_wait_s", 0.0) * slow,
            (recv_post + transfer) * slow,
            host.get("recv_wait_s", 0.0) * slow,
            ready * slow,
        )

    def balancer_time(self, balancer_bytes: Mapping[str, Any] | None) -> float:
        """Seconds of the PP = 1 balancer's all-to-alls (``Semu.simulate_step``'s
        ``balancer_bytes``) over one DP group (TP rank 0, PP rank 0)."""
        if not balancer_bytes:
            return 0.0
        comm = self.comm
        tp = self.spec.parallel.tensor
        dp = self.spec.parallel.data(self.cluster.num_devices)
        ranks = [tp * d for d in range(dp)]  # one DP group (TP rank 0, PP rank 0)
        total = 0.0
        for phase, volume in balancer_bytes.items():
            if isinstance(volume, (int, float)):
                t = comm.all_to_all_total(float(volume), dp, self.cluster.same_node(ranks))
            else:
                t = comm.all_to_all(volume, ranks)
            total += 2 * t  # forward dispatch and the transposed exchange in the backward
        return total

    def fingerprint(self) -> str:
        """A digest of everything that changes a cost (the reuse caches key on it), so that
        caches shared between instances never mix two cost models."""
        if self._fingerprint is None:
            parts = [
                repr(self.spec.shape),
                repr(self.spec.parallel),
                repr(self.spec.training),
                repr(self.spec.projector_ffn),
                repr(self.cluster),
                json.dumps(self.calibration.to_json(), sort_keys=True) if self.calibration else "",
            ]
            self._fingerprint = hashlib.sha1("\n".join(parts).encode()).hexdigest()
        return self._fingerprint

    def _op(self, flops: float, nbytes: float, rate: float) -> float:
        return max(flops / rate if flops else 0.0, nbytes / self.memory_rate if nbytes else 0.0)

    def compute_cost(
        self,
        module: str,
        start: int,
        stop: int,
        kind: str,
        memory: str,
        seq_lens: Sequence[int],
        out_rows: int = 0,
    ) -> ComputeCost:
        """Time and memory of the F or B of chunk ``[start, stop)`` of ``module``.

        Args:
            seq_lens: independent sequences (encoder units; LLM samples and padding runs).
            out_rows: LLM rows an encoder's last chunk produces.
        """
        work = self.costs.compute_work(module, start, stop, kind, memory, seq_lens, out_rows)
        table = self._tables.get(module)
        if table is not None:
            fwd, bwd = self._calibrated_passes(table, module, start, stop, seq_lens, out_rows)
            # A recomputing backward reruns the forward first.
            time = fwd if kind == "F" else (bwd + fwd if memory == "recompute" else bwd)
            if kind == "B" and memory not in _WHOLE_CHUNK:
                time += self._layer_rerun_s(table, module, stop - start, seq_lens, memory)
            kept, transient = self._calibrated_memory(
                table, module, start, stop, kind, memory, seq_lens, work, out_rows
            )
        else:
            time = (
                self._op(work.linear_flops, work.linear_bytes, self.flops_rate)
                + self._op(work.attention_flops, work.attention_bytes, self.attention_rate)
                + self._op(work.edge_flops, work.edge_bytes, self.flops_rate)
                + work.layer_passes * self.cluster.device.kernel_overhead_s
            )
            kept, transient = work.kept_bytes, work.transient_bytes
        if work.tp_collectives:
            time += work.tp_collectives * self.comm.all_reduce(
                work.tp_collective_bytes, self.spec.parallel.tensor, self.tp_intra
            )
        if work.offload_bytes:
            time += work.offload_bytes / self.cluster.device.host_bandwidth
        # Host overhead of every compute (the calibration's ``stage_s``: per F or B of a chunk).
        time += self.host.get("stage_s", 0.0)
        # The schedule's glue around each forward_step / backward_step call (loss function,
        # loss scaling, the backward's entry), measured per call by tools/calibrate.py.
        time += self.host.get("forward_step_s" if kind == "F" else "backward_step_s", 0.0)
        if kind == "B" and memory == "recompute":
            time += self.host.get("forward_step_s", 0.0)
        # The runtime's own bookkeeping around that call (inputs gathered, outputs routed).
        time += self.host.get("runtime_forward_s" if kind == "F" else "runtime_backward_s", 0.0)
        return ComputeCost(time * self.slowdown, kept, transient)

    def _calibrated_passes(
        self,
        t: LayerTimeModel,
        module: str,
        start: int,
        stop: int,
        seq_lens: Sequence[int],
        out_rows: int,
    ) -> tuple[float, float]:
        """Measured seconds of the chunk's forward and of its backward (without recompute)."""
        shape = self.spec.shape.module(module)
        tokens = sum(seq_lens)
        layers = stop - start
        fwd = layers * t.forward_packed_s(seq_lens) + t.chunk_const_s
        # The backward: its own fit when measured, else the forward x backward_ratio (edges
        # likewise; the ratio alone reproduces files without the backward fits).
        bwd = layers * t.backward_packed_s(seq_lens)
        bwd += (
            t.backward_chunk_const_s
            if t.backward_const_s is not None
            else t.chunk_const_s * t.backward_ratio
        )
        first, last = start == 0, stop == shape.num_layers
        if t.input_s_per_token is not None or t.head_s_per_token is not None:
            if first:
                f = t.input_const_s + (t.input_s_per_token or 0.0) * tokens
                fwd += f
                if t.input_backward_const_s is None:
                    bwd += f * t.backward_ratio
                else:
                    bwd += t.input_backward_const_s + t.input_backward_s_per_token * tokens
            if last:
                f = t.head_const_s + (t.head_s_per_token or 0.0) * tokens
                f += t.head_s_per_row * out_rows
                fwd += f
                if t.head_backward_const_s is None:
                    bwd += f * t.backward_ratio
                else:
                    bwd += (
                        t.head_backward_const_s
                        + t.head_backward_s_per_token * tokens
                        + t.head_backward_s_per_row * out_rows
                    )
        elif last:
            fwd += t.edge_s_per_token * tokens
            bwd += t.edge_s_per_token * tokens * t.backward_ratio
        # A measured table is for TP = 1 on its device; TP divides the work evenly.
        fwd /= self.spec.parallel.tensor
        bwd /= self.spec.parallel.tensor
        return fwd, bwd

    def _calibrated_memory(
        self,
        t: LayerTimeModel,
        module: str,
        start: int,
        stop: int,
        kind: str,
        memory: str,
        seq_lens: Sequence[int],
        work: ComputeWork,
        out_rows: int = 0,
    ) -> tuple[float, float]:
        """``(kept, transient)`` bytes from the measured activation sizes, as the runtime holds
        them: a recomputing forward runs without autograd (it frees each layer's activations
        as it goes), its backward rebuilds all of them; an offloading pair holds them during
        both halves and keeps only the chunk's input in between."""
        if t.act_bytes_per_token is None:
            return work.kept_bytes, work.transient_bytes
        shape = self.spec.shape.module(module)
        tokens = sum(seq_lens)
        full = (stop - start) * (
            t.act_bytes_per_token * tokens + t.act_bytes_per_token_sq * sum(n * n for n in seq_lens)
        )
        if start == 0:
            full += (t.input_act_bytes_per_token or 0.0) * tokens
        if stop == shape.num_layers:
            full += (
                t.head_act_bytes_per_token or 0.0
            ) * tokens + t.head_act_bytes_per_row * out_rows
        full /= self.spec.parallel.tensor
        recompute = self.costs.recompute_of(memory)
        if memory not in _WHOLE_CHUNK and recompute.granularity != "none":
            tp = self.spec.parallel.tensor
            layer = t.act_bytes_per_token * tokens + t.act_bytes_per_token_sq * sum(
                n * n for n in seq_lens
            )
            in_kept = (t.input_act_bytes_per_token or 0.0) * tokens if start == 0 else 0.0
            kept, transient, _, _ = self.costs.layer_recompute(
                module, stop - start, seq_lens, layer / tp, in_kept / tp,
                full - (stop - start) * layer / tp - in_kept / tp, recompute,
            )  # fmt: skip
            return kept, transient if kind == "B" else 0.0
        if memory == "none":
            return full, 0.0
        boundary = self.costs.boundary_bytes(module, tokens)
        if memory == "recompute" and kind == "F":
            return boundary, 0.0
        return boundary, full

    def _layer_rerun_s(
        self, t: LayerTimeModel, module: str, layers: int, seq_lens: Sequence[int],
        memory: str = "none",
    ) -> float:  # fmt: skip
        """Measured seconds of the forwards Megatron's recompute (the run's, or the pair's own
        under ``memory``) reruns in a chunk's backward: its recomputed layers (full), or every
        layer's attention (selective: the fit's quadratic term)."""
        recompute = self.costs.recompute_of(memory)
        if recompute.granularity == "selective":
            rerun = layers * t.quadratic_s * sum(n * n for n in seq_lens)
        else:
            rerun = recompute.plan(layers)[2] * t.forward_packed_s(seq_lens)
        return rerun / self.spec.parallel.tensor

    def join_time(self, kind: str, parts: int) -> float:
        """LLM chunk 0 joining ``parts`` encoder subs' rows (F), or splitting their gradient
        (B): the calibration's ``sub_join_s`` / ``sub_join_backward_s`` per part."""
        key = "sub_join_s" if kind == "F" else "sub_join_backward_s"
        return self.host.get(key, 0.0) * parts * self.slowdown

    # ---------------------------------------------------------------- step-level work

    def param_tensors(self, module: str, start: int, stop: int) -> int | None:
        """Parameter tensors of chunk ``[start, stop)`` of ``module``, from the calibration's
        counts (None: not counted)."""
        t = self._tables.get(module)
        if t is None or t.layer_param_tensors is None:
            return None
        n = (stop - start) * t.layer_param_tensors
        if start == 0:
            n += t.input_param_tensors or 0
        if stop == self.spec.shape.module(module).num_layers:
            n += t.head_param_tensors or 0
        return n

    def rank_param_tensors(self, placement, rank: int) -> int | None:
        """Parameter tensors of a pipeline rank's chunks (None: some chunk is not counted)."""
        total = 0
        for m, c in placement.chunks_on(rank):
            n = self.param_tensors(m, *placement.layer_range(m, c))
            if n is None:
                return None
            total += n
        return total

    def optimizer_time(
        self, params: float, data_parallel: int, tensors: int | None = None
    ) -> float:
        """One optimizer step over ``params`` local parameters in ``tensors`` tensors.

        With a calibration's host figures: ``optimizer_step_s`` (fixed: gradient norm,
        clipping, bookkeeping) + ``optimizer_s_per_tensor`` x tensors (per-tensor Python and
        kernel overheads, when the tensors are known) + ``optimizer_s_per_param`` x params.
        """
        if "optimizer_s_per_param" in self.host:
            per = self.host["optimizer_s_per_param"]
            if self.spec.parallel.sharded("optim"):
                per /= data_parallel
            t = params * per + self.host.get("optimizer_step_s", 0.0)
            if tensors is not None:
                t += tensors * self.host.get("optimizer_s_per_tensor", 0.0)
            return t * self.slowdown
        return self.costs.optimizer_bytes_moved(params, data_parallel) / self.memory_rate
