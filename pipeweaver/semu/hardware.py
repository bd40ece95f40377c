# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Device and cluster specs: the peaks SEMU divides work by.

Every number carries its source in place: a public spec page, NVIDIA's datasheets, or a paper
that describes its cluster (Llama 3's for the H100 network, DIP's for the H800 and H20 ones).
Bandwidths are per GPU and per direction (NVLink figures are usually quoted bidirectional:
halved here). Latencies are assumptions (typical NCCL small-message latencies), refined by
calibration where a device is at hand.

The ``cpu`` entry describes the machine of the CPU main job (gloo over loopback TCP). Its
peaks are placeholders until ``tools/calibrate.py`` fills them: a calibration file's
``efficiency`` and ``comm`` sections, and its measured layer times, override them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """Peak figures of one accelerator and its links."""

    name: str
    """Identifier, e.g. ``h100-sxm``."""

    peak_flops: float
    """Dense bf16 tensor FLOP/s (no 2:4 sparsity)."""

    hbm_bandwidth: float
    """Device memory bandwidth, bytes/s."""

    hbm_bytes: float
    """Device memory capacity, bytes."""

    intra_node_bandwidth: float
    """GPU-to-GPU bandwidth inside a node (NVLink), bytes/s per direction."""

    inter_node_bandwidth: float
    """Network bandwidth per GPU (its NIC), bytes/s per direction."""

    intra_node_latency_s: float = 10e-6
    """Latency of one transfer inside a node (assumed: NCCL p2p launch plus NVLink hop)."""

    inter_node_latency_s: float = 20e-6
    """Latency of one transfer between nodes (assumed: NCCL over IB/RoCE)."""

    host_bandwidth: float = 25 * GB
    """Host-device bandwidth (PCIe), bytes/s per direction: the cost of offloading."""

    flash_attention: bool = True
    """Attention keeps no score matrix (Transformer Engine / flash kernels on GPUs)."""

    kernel_overhead_s: float = 0.0
    """Fixed time per transformer layer pass (kernel launches); 0 on GPUs with overlap."""


DEVICES: dict[str, DeviceSpec] = {
    # H100 SXM5: peak 989.4 TFLOP/s bf16 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s
    # bidirectional = 450 GB/s per direction (NVIDIA's H100 datasheet, as on
    # glennklockwood.com/garden/processors/h100); network 400 Gb/s = 50 GB/s per GPU NIC (the
    # Llama 3 paper's cluster); PCIe Gen5 x16 ~64 GB/s per direction (spec pages, e.g.
    # saulelectric.com H200 page: "PCIe Gen5: 128GB/s" bidirectional).
    "h100-sxm": DeviceSpec(
        name="h100-sxm",
        peak_flops=989.4 * TB,
        hbm_bandwidth=3.35 * TB,
        hbm_bytes=80 * GB,
        intra_node_bandwidth=450 * GB,
        inter_node_bandwidth=50 * GB,
        host_bandwidth=64 * GB,
    ),
    # H200 SXM: same GH100 compute as the H100 (989.4 TFLOP/s); 141 GB HBM3e at 4.8 TB/s and
    # NVLink 4 450 GB/s per direction (NVIDIA's H200 datasheet); network: DGX/HGX
    # H200 nodes have one 400 Gb/s NIC per GPU like the H100 (assumed, same platform);
    # PCIe Gen5 128 GB/s bidirectional (saulelectric.com/nvidia-h200.html).
    "h200": DeviceSpec(
        name="h200",
        peak_flops=989.4 * TB,
        hbm_bandwidth=4.8 * TB,
        hbm_bytes=141 * GB,
        intra_node_bandwidth=450 * GB,
        inter_node_bandwidth=50 * GB,
        host_bandwidth=64 * GB,
    ),
    # A100 80 GB SXM4: 312 TFLOP/s bf16 dense, 80 GB HBM2e at 2.039 TB/s, NVLink 3 300+300
    # GB/s, PCIe Gen4 32+32 GB/s: glennklockwood.com/garden/processors/A100 (from NVIDIA's
    # A100 datasheet); network 200 Gb/s HDR = 25 GB/s per GPU (DGX A100: one ConnectX-6 per
    # GPU; assumed).
    "a100-80gb": DeviceSpec(
        name="a100-80gb",
        peak_flops=312 * TB,
        hbm_bandwidth=2.039 * TB,
        hbm_bytes=80 * GB,
        intra_node_bandwidth=300 * GB,
        inter_node_bandwidth=25 * GB,
        host_bandwidth=32 * GB,
    ),
    # H800 SXM: the H100 die with NVLink cut to 400 GB/s bidirectional (philisun.com "H800 vs
    # H100"; the DIP paper's testbed: "8 GPUs on 200 GB/s NVLink") and the same bf16 tensor
    # peak and HBM3 (80 GB at 3.35 TB/s, same page); network 8x200 Gb/s RoCEv2 per 8-GPU node
    # = 25 GB/s per GPU (the DIP paper's cluster).
    "h800": DeviceSpec(
        name="h800",
        peak_flops=989.4 * TB,
        hbm_bandwidth=3.35 * TB,
        hbm_bytes=80 * GB,
        intra_node_bandwidth=200 * GB,
        inter_node_bandwidth=25 * GB,
        host_bandwidth=64 * GB,
    ),
    # H20: 148 TFLOP/s fp16/bf16 dense, 96 GB HBM3 at 4.0 TB/s, NVLink 4 900 GB/s
    # bidirectional (willitrunai.com/gpus/h20-96gb; zangshuxian.com: "FP16 dense 148
    # TFLOPS"); network: the DIP paper's second cluster (2 nodes x 8 H20) gives no NIC
    # figure, 400 Gb/s per GPU assumed (HGX platform).
    "h20": DeviceSpec(
        name="h20",
        peak_flops=148 * TB,
        hbm_bandwidth=4.0 * TB,
        hbm_bytes=96 * GB,
        intra_node_bandwidth=450 * GB,
        inter_node_bandwidth=50 * GB,
        host_bandwidth=64 * GB,
    ),
    # This CPU (2 shared cores, fp32 through PyTorch, gloo over loopback TCP). Placeholders:
    # a few tens of GFLOP/s for two AVX2/AVX-512 cores at PyTorch's small-matrix efficiency,
    # ~10 GB/s of memory bandwidth per core, loopback TCP at ~1 GB/s with ~100 us per message;
    # calibration replaces them (tools/calibrate.py).
    "cpu": DeviceSpec(
        name="cpu",
        peak_flops=50e9,
        hbm_bandwidth=20 * GB,
        hbm_bytes=128 * GB,
        intra_node_bandwidth=1 * GB,
        inter_node_bandwidth=1 * GB,
        intra_node_latency_s=100e-6,
        inter_node_latency_s=100e-6,
        host_bandwidth=20 * GB,
        flash_attention=True,
    ),
}
"""Built-in devices by name."""


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the peaks that real kernels reach (fitted by calibration).

    Defaults are assumptions for a GPU running Megatron with Transformer Engine: large bf16
    GEMMs reach ~70% of the dense peak, flash attention ~50%, elementwise kernels ~80% of HBM
    bandwidth; NVLink collectives ~82% (370 of 450 GB/s bus bandwidth, a typical NCCL all-reduce
    figure on H100 NVLink), network ~85%.
    """

    compute: float = 0.7
    """Matrix multiplies: fraction of ``peak_flops``."""

    attention: float = 0.5
    """Attention scores and weighted sums: fraction of ``peak_flops``."""

    memory: float = 0.8
    """Memory-bound work: fraction of ``hbm_bandwidth``."""

    intra_node: float = 0.82
    """Collectives and p2p inside a node: fraction of ``intra_node_bandwidth``."""

    inter_node: float = 0.85
    """Between nodes: fraction of ``inter_node_bandwidth``."""

    def replace(self, **kw: float) -> "Efficiency":
        """A copy with some factors replaced (unknown keys are ignored)."""
        fields = {f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: float(v) for k, v in kw.items() if k in fields})


@dataclass(frozen=True)
class ClusterSpec:
    """The machines a run uses: device type, how many, how they are grouped in nodes."""

    device: DeviceSpec
    """The accelerator (all devices are alike)."""

    num_devices: int
    """World size: devices of the run."""

    devices_per_node: int = 8
    """Devices sharing a node (NVLink domain)."""

    efficiency: Efficiency = Efficiency()
    """Fractions of the peaks reached."""

    name: str = ""
    """Free-text name of the cluster."""

    def node_of(self, global_rank: int) -> int:
        """Node of a global rank (ranks fill nodes in order, as torchrun and SLURM do)."""
        return global_rank // self.devices_per_node

    def same_node(self, ranks: list[int]) -> bool:
        """Whether every rank of a group sits in one node."""
        return len({self.node_of(r) for r in ranks}) <= 1

    def pipeline_same_node(
        self, tp: int, dp: int, pp: int, replica: int
    ) -> tuple[tuple[bool, ...], ...]:
        """``intra[a][b]``: pipeline ranks a and b of DP replica ``replica`` share a node
        (Megatron's rank order: TP fastest, then DP, then PP)."""
        node = [self.node_of(tp * (replica + dp * r)) for r in range(pp)]
        return tuple(tuple(node[a] == node[b] for b in range(pp)) for a in range(pp))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "cluster") -> "ClusterSpec":
        """Build from a cluster config object (see ``scripts/configs/README.md``).

        Keys: ``device`` (a name of :data:`DEVICES`), ``num_devices``, ``devices_per_node``,
        optional ``efficiency`` (factors) and ``device_overrides`` (DeviceSpec fields).

        Raises:
            ValueError: unknown device or malformed field, naming it.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: a cluster config must be a JSON object")
        name = obj.get("device")
        if name not in DEVICES:
            raise ValueError(f"{where}: unknown device {name!r}; expected one of {sorted(DEVICES)}")
        device = DEVICES[name]
        overrides = dict(obj.get("device_overrides", {}))
        fields = {f.name for f in dataclasses.fields(DeviceSpec)}
        bad = set(overrides) - fields
        if bad:
            raise ValueError(f"{where}: unknown device_overrides {sorted(bad)}")
        if overrides:
            device = dataclasses.replace(device, **overrides)
        try:
            num = int(obj["num_devices"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: 'num_devices' must be an int") from e
        per_node = int(obj.get("devices_per_node", 8))
        if num < 1 or per_node < 1:
            raise ValueError(f"{where}: num_devices and devices_per_node must be >= 1")
        eff = Efficiency().replace(**obj.get("efficiency", {}))
        return cls(device, num, per_node, eff, str(obj.get("name", name)))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ClusterSpec":
        """Read a cluster config file (``scripts/configs/h100-2560.json``).

        Raises:
            OSError: the file cannot be read.
            ValueError: malformed JSON or config, naming the file.
        """
        with open(path, encoding="utf-8") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_json(obj, where=os.fspath(path))
