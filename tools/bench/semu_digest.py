# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Digests of SEMU's results on a fixed set of cases, to show that a speed-up changed nothing.

Usage (from the repository root)::

    python tools/bench/semu_digest.py OUT_DIR [CASE ...]

Writes one JSON file per case into ``OUT_DIR`` and prints ``case: sha256-prefix bytes
seconds``; run it before and after a change and compare the files (``cmp``): equal files mean
bit-identical results. The cases: the 84B model's dynamic step on 2,560 H100 with a few
replicas (``py-*``: every replica's schedule, checker report and timeline, and the step's JSON
with its events), the same on 256 H100 with all replicas, and ``tools/semu.py --json --trace``
on the shipped configs (every model config, the schedules, placements, post-balancing, packed
and padded Megatron baselines, calibrated host costs, no reuse), without the run's own
``simulation_s``. The calibration probe is off (``ORCHWEAVE_CALIBRATION_PROBE=0``), so the
digests do not depend on the host. All cases take about a minute.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time

os.environ["ORCHWEAVE_CALIBRATION_PROBE"] = "0"  # before the calibration is loaded

from megatron.mllm.cli import semu as semu_cli  # noqa: E402
from megatron.mllm.config_files import find_config, load_run_config, set_flags  # noqa: E402
from pipeweaver.checker import check  # noqa: E402
from pipeweaver.semu import scenario  # noqa: E402
from pipeweaver.semu.hardware import ClusterSpec  # noqa: E402
from pipeweaver.semu.simulator import Semu  # noqa: E402

C256 = os.path.join(tempfile.gettempdir(), "orchweave-digest-h100-256.json")
"""A 256-device H100 cluster (DP 8 for the 84B model), written by :func:`main`."""


class Rec(Semu):
    """A simulator that keeps every replica's pipeline result."""

    def simulate_pipeline(self, *a, **k):
        r = super().simulate_pipeline(*a, **k)
        self.got.append(r)
        return r


def pyl(cluster_path: str, gbs: int, replicas: int | None) -> dict:
    """The 84B dynamic step as ``tools/bench/semu_scale.py`` builds it, every part kept."""
    cluster = ClusterSpec.load(cluster_path)
    spec = load_run_config(
        "omni-84b", set_flags({"global-batch-size": gbs}), world_size=cluster.num_devices
    ).semu
    scheds, mbs, info = scenario.build_step(
        spec, cluster, schedule="dynamic", pad=False, replicas=replicas
    )
    reports = [check(s).__dict__ for s in scheds]
    s = Rec(spec, cluster)
    s.got = []
    res = s.simulate_step(scheds, mbs)
    return {
        "info": info,
        "schedules": [[[str(a) for a in acts] for acts in sc.actions] for sc in scheds],
        "checks": reports,
        "pipelines": [
            {
                **{k: v for k, v in p.__dict__.items() if k != "events"},
                "events": [e.__dict__ for e in p.events],
            }
            for p in s.got
        ],
        "result": res.to_json(with_events=True),
    }


def cli(argv: list[str]) -> dict:
    """One ``tools/semu.py`` run: exit status, stderr, its JSON and its trace."""
    with tempfile.TemporaryDirectory() as d:
        tr = os.path.join(d, "t.json")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = semu_cli.main([*argv, "--json", "--trace", tr])
        o = {"rc": rc, "err": err.getvalue()}
        if rc == 0:
            j = json.loads(out.getvalue())
            j["config"].pop("simulation_s", None)
            o["json"] = j
            with open(tr, encoding="utf-8") as f:
                o["trace"] = json.load(f)
        return o


OMNI = ["--model", "omni-84b", "--cluster", C256]
CLI = {
    "cpu-main": ["--model", "cpu-main", "--cluster", "cpu-2ranks"],
    "cpu-main-cal": [
        "--model",
        "cpu-main",
        "--cluster",
        "cpu-2ranks",
        "--calibration",
        "scripts/configs/calibration-cpu.json",
    ],
    "cpu-main-pp2-cal-dyn": [
        "--model",
        "cpu-main",
        "--cluster",
        "cpu-2ranks",
        "--set",
        "pipeline-model-parallel-size=2",
        "--schedule",
        "dynamic",
        "--pad",
        "none",
        "--calibration",
        "scripts/configs/calibration-cpu.json",
    ],
    "cpu-main-pp2-cal-1f1b": [
        "--model",
        "cpu-main",
        "--cluster",
        "cpu-2ranks",
        "--set",
        "pipeline-model-parallel-size=2",
        "--schedule",
        "1f1b",
        "--calibration",
        "scripts/configs/calibration-cpu.json",
    ],
    "cpu-main-pb": [
        "--model",
        "cpu-main",
        "--cluster",
        "cpu-2ranks",
        "--post-balance",
        "auto",
        "--calibration",
        "scripts/configs/calibration-cpu.json",
    ],
    "vlm-s": ["--model", "vlm-s", "--cluster", "h800-16"],
    "vlm-s-h20": ["--model", "vlm-s", "--cluster", "h20-16"],
    "vlm-s-dyn": [
        "--model",
        "vlm-s",
        "--cluster",
        "h800-16",
        "--schedule",
        "dynamic",
        "--pad",
        "none",
    ],
    "vlm-s-dyn-noreuse": [
        "--model",
        "vlm-s",
        "--cluster",
        "h800-16",
        "--schedule",
        "dynamic",
        "--pad",
        "none",
        "--no-reuse",
    ],
    "vlm-s-dataflow": [
        "--model",
        "vlm-s",
        "--cluster",
        "h800-16",
        "--schedule",
        "dataflow",
        "--placement",
        "interleaved",
    ],
    "vlm-s-balanced": [
        "--model",
        "vlm-s",
        "--cluster",
        "h800-16",
        "--placement",
        "balanced",
        "--overlap-grad-reduce",
    ],
    "vlm-m": ["--model", "vlm-m", "--cluster", "h800-32"],
    "vlm-l": ["--model", "vlm-l", "--cluster", "h800-64", "--schedule", "dynamic", "--pad", "none"],
    "t2v-s": ["--model", "t2v-s", "--cluster", "h800-16", "--schedule", "dynamic", "--pad", "none"],
    "t2v-l": ["--model", "t2v-l", "--cluster", "h800-64"],
    "gpu-check": ["--model", "gpu-check", "--cluster", "cpu-2ranks"],
    "gpu-check-tiny": ["--model", "gpu-check-tiny", "--cluster", "cpu-2ranks"],
    "omni-padded": OMNI + ["--overlap-grad-reduce"],
    "omni-packed-strong": OMNI
    + [
        "--pad",
        "packed",
        "--placement",
        "balanced",
        "--memory",
        "recompute",
        "--overlap-grad-reduce",
    ],
    "omni-pp4-dyn-pb": OMNI + ["--post-balance", "auto", "--schedule", "dynamic", "--pad", "none"],
    "omni-pp4-dyn-pb-rc": OMNI
    + ["--post-balance", "auto", "--schedule", "dynamic", "--pad", "none", "--memory", "recompute"],
    "omni-pp1-pb": OMNI + ["--set", "pipeline-model-parallel-size=1", "--post-balance", "auto"],
    "omni-dyn-2560-r2": [
        "--model",
        "omni-84b",
        "--cluster",
        "h100-2560",
        "--schedule",
        "dynamic",
        "--pad",
        "none",
        "--replicas",
        "2",
    ],
}


def main(outdir: str, selected: list[str]) -> None:
    """Write the selected cases' digests (all by default) into ``outdir``."""
    with open(C256, "w", encoding="utf-8") as f:
        json.dump({"name": "h100-256", "description": "SEMU digests: 32 nodes of 8 H100",
                   "device": "h100-sxm", "num_devices": 256, "devices_per_node": 8}, f)  # fmt: skip
    os.makedirs(outdir, exist_ok=True)
    cases = {
        "py-dp80-m16-r3": lambda: pyl(find_config("h100-2560"), 1280, 3),
        "py-dp80-m128-r2": lambda: pyl(find_config("h100-2560"), 10240, 2),
        "py-dp8-m16": lambda: pyl(C256, 128, None),
    }
    cases.update({k: (lambda v=v: cli(v)) for k, v in CLI.items()})
    sel = selected or list(cases)
    for k in sel:
        t = time.perf_counter()
        data = json.dumps(cases[k](), sort_keys=True)
        with open(os.path.join(outdir, k + ".json"), "w", encoding="utf-8") as f:
            f.write(data)
        digest = hashlib.sha256(data.encode()).hexdigest()[:16]
        print(f"{k}: {digest} {len(data)} {time.perf_counter() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
