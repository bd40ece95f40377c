# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Every gloo group of a process on one transport device
(:func:`megatron.mllm.distributed.share_gloo_device`), in a process of its own: the change is
to torch's backend registry, for the process's lifetime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launch import REPO, free_port

SCRIPT = r"""
import json, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from megatron.mllm.distributed import share_gloo_device
from train_worker import gloo_transport_threads

shared = share_gloo_device()
again = share_gloo_device()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0,
                        world_size=1, timeout=timedelta(seconds=60))
groups = [None] + [dist.new_group([0], timeout=timedelta(seconds=30)) for _ in range(3)]
sums = []
for k, group in enumerate(groups):
    t = torch.full((3,), float(k + 1))
    dist.all_reduce(t, group=group)
    sums.append(t.tolist())
# A transport thread names itself once it runs: the most seen over a second counts them all
# (none ends while its group lives).
threads = 0
for _ in range(20):
    threads = max(threads, gloo_transport_threads())
    time.sleep(0.05)
print(json.dumps({"shared": shared, "again": again, "threads": threads, "sums": sums}))
dist.destroy_process_group()
"""


def run_script(env_extra: dict) -> dict:
    path = os.pathsep.join([str(REPO), os.path.dirname(__file__)])  # train_worker's helper
    env = dict(os.environ, PYTHONPATH=path, **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port())], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads only")
def test_four_groups_one_transport_thread_and_each_group_still_works():
    result = run_script({"ORCHWEAVE_GLOO_DEVICE_PER_GROUP": "0"})
    assert result["shared"] and result["again"]
    assert result["threads"] == 1
    assert result["sums"] == [[float(k + 1)] * 3 for k in range(4)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads only")
def test_the_environment_variable_restores_a_device_per_group():
    result = run_script({"ORCHWEAVE_GLOO_DEVICE_PER_GROUP": "1"})
    assert not result["shared"]
    assert result["threads"] == 4
