# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Losses and gradient norms of the main job in every training mode, over 4 optimizer steps.

``golden/losses.json`` holds the values of commit 73f5d61, before the restructuring of issue 9;
``test_golden_losses.py`` reruns every mode and compares bit for bit. The numerics are pinned
(1 thread, ATen's and MKL's AVX2 code paths) so that any x86-64 machine with AVX2 computes the
same floats. Regenerate only when training is meant to change:
``python tests/mllm/golden_losses.py --write``.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden") / "losses.json"
WORKER = Path(__file__).with_name("train_worker.py")


def main_job_flags() -> list[str]:
    """The flags ``scripts/pretrain_mllm_cpu.sh`` passes to ``scripts/pretrain_mllm.py``."""
    script = (REPO / "scripts" / "pretrain_mllm_cpu.sh").read_text()
    body = script.split('scripts/pretrain_mllm.py" \\\n', 1)[1].split('"$@"', 1)[0]
    return shlex.split(body.replace("\\\n", " "))


MAIN_JOB = [
    *main_job_flags(),
    # Each mode below says what it switches on; 4 iterations, one of them warm-up.
    "--post-balance", "none", "--pipeline-schedule", "megatron",
    "--train-iters", "4", "--lr-warmup-iters", "1", "--log-interval", "1",
]  # fmt: skip
"""The main job's flags, every OrchWeave feature off, 4 iterations."""

PP2 = ["--pipeline-model-parallel-size", "2"]
MODES: dict[int, dict[str, list[str]]] = {
    2: {
        "dp2-megatron": [],
        "dp2-balanced-auto": ["--post-balance", "auto"],
        "dp2-balanced-lpt-node-wise": ["--post-balance", "lpt", "--node-wise-a2a",
                                       "--gpus-per-node", "1"],  # fmt: skip
        "pp2-megatron": [*PP2],
        "pp2-1f1b": [*PP2, "--pipeline-schedule", "1f1b"],
        "pp2-interleaved": [*PP2, "--pipeline-schedule", "interleaved",
                            "--llm-chunks-per-stage", "2"],  # fmt: skip
        "pp2-dynamic": [*PP2, "--pipeline-schedule", "dynamic"],
        "pp2-dynamic-subs-recompute": [*PP2, "--pipeline-schedule", "dynamic",
                                       "--vision-chunks-per-stage", "1",
                                       "--llm-chunks-per-stage", "2",
                                       "--encoder-sub-microbatch-tokens", "40",
                                       "--pipeline-recompute", "all"],  # fmt: skip
    },
    4: {
        "dp2-pp2-megatron": [*PP2],
        "dp2-pp2-whole-samples-megatron": [*PP2, "--post-balance", "auto"],
        "dp2-pp2-whole-samples-dynamic": [*PP2, "--post-balance", "auto",
                                          "--pipeline-schedule", "dynamic"],  # fmt: skip
    },
}
"""World size -> mode -> flags added to :data:`MAIN_JOB`."""

FIELDS = ("lm_loss", "grad_norm", "samples", "tokens")


def pinned_numerics() -> str | None:
    """Why this machine cannot reproduce the pinned floats, or None when it can."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the golden floats come from x86-64 AVX2 kernels; this is {platform.machine()}"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return None if " avx2" in flags else "this CPU has no AVX2"


def pinned_env(repo: Path) -> dict[str, str]:
    """The environment of the pinned runs."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(repo), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        ATEN_CPU_CAPABILITY="avx2",
        MKL_CBWR="AVX2",
        PYTHONWARNINGS="ignore",
    )
    return env


def run_modes(out_dir: Path, world: int, timeout: float = 600) -> dict[str, list[dict]]:
    """Run every mode of one world size in one launch; per mode, its per-iteration records."""
    sys.path.insert(0, str(Path(__file__).parent))
    from launch import check, free_port, run

    argv = [str(out_dir)]
    for name, flags in MODES[world].items():
        argv += [name, *MAIN_JOB, *flags, "---"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
           "--master-port", str(free_port()), str(WORKER), *argv]  # fmt: skip
    check(run(cmd, timeout, env=pinned_env(REPO)))
    out = {}
    for name in MODES[world]:
        lines = (out_dir / f"{name}.jsonl").read_text().splitlines()
        out[name] = [{k: json.loads(line)[k] for k in FIELDS} for line in lines]
    return out


if __name__ == "__main__":
    import tempfile

    values = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in MODES:
            d = Path(tmp) / f"world{world}"
            d.mkdir()
            values.update(run_modes(d, world))
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")
    print(json.dumps(values, indent=1, sort_keys=True))
