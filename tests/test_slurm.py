# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Tests for the SLURM launch template scripts/slurm/pretrain_mllm.sbatch.

No SLURM installation is needed: the SLURM_* variables are faked, `scontrol`, `srun` and
`torchrun` are replaced by small scripts on PATH, and most tests use the template's DRY_RUN mode,
which prints the srun command line instead of running it.
"""

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SBATCH = REPO_ROOT / "scripts" / "slurm" / "pretrain_mllm.sbatch"
TRAIN_SCRIPT = REPO_ROOT / "scripts" / "pretrain_mllm.py"

# Forwarded arguments that a naive `bash -c "... $*"` launcher would break.
FORWARDED = [
    "--tensor-model-parallel-size",
    "2",
    "--save",
    "/tmp/my ckpt",
    "--note",
    "it's $HOME; `date` *",
    "--empty",
    "",
]


def _path_without(program):
    """The current PATH minus every directory that holds `program`."""
    dirs = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / program).exists())


def _write_exe(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _fake_env(**overrides):
    """A clean fake 2-node allocation; a value of None removes the variable."""
    env = {
        "PATH": _path_without("scontrol"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "SLURM_JOB_NODELIST": "gpu-node-7",
        "SLURM_NNODES": "2",
        "SLURM_SUBMIT_DIR": str(REPO_ROOT),
        "GPUS_PER_NODE": "4",
        "DRY_RUN": "1",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def _run(env, args=(), script=SBATCH):
    return subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60
    )


def _dry_run(env, args=FORWARDED, script=SBATCH):
    proc = _run(env, args, script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return lines[0]


def _split_launch(line):
    """Split the printed line into (srun options, per-task script, torchrun argv).

    The template runs `srun OPTS bash -c SCRIPT torchrun ARGS...`; inside each task SCRIPT is
    `exec torchrun --node-rank "$SLURM_NODEID" "$@"`, so the torchrun argv is SCRIPT's words with
    "$@" replaced by ARGS.
    """
    tokens = shlex.split(line)
    assert tokens[0] == "srun", line
    bash_at = tokens.index("bash")
    srun_opts = tokens[1:bash_at]
    assert tokens[bash_at + 1] == "-c", line
    task_script = tokens[bash_at + 2]
    positional = tokens[bash_at + 4 :]
    assert tokens[bash_at + 3] == "torchrun"  # $0 of the per-task shell
    words = shlex.split(task_script)
    assert words[:2] == ["exec", "torchrun"], task_script
    at = words.index("$@")
    torchrun_argv = words[2:at] + positional + words[at + 1 :]
    return srun_opts, task_script, torchrun_argv


def _option(argv, name):
    return argv[argv.index(name) + 1]


def _assert_launch(line, master_addr, root=REPO_ROOT):
    srun_opts, task_script, argv = _split_launch(line)
    assert "--nodes=2" in srun_opts
    assert "--ntasks-per-node=1" in srun_opts
    assert _option(argv, "--nnodes") == "2"
    assert _option(argv, "--nproc-per-node") == "4"
    assert _option(argv, "--master-addr") == master_addr
    assert _option(argv, "--master-port") == "29500"
    # The node rank is left for each srun task's shell to expand, quoted and unevaluated.
    assert '--node-rank "$SLURM_NODEID"' in task_script
    assert _option(argv, "--node-rank") == "$SLURM_NODEID"
    script_at = argv.index(str(root / "scripts" / "pretrain_mllm.py"))
    # Everything after the script belongs to pretrain_mllm.py: nccl first, then the user's args.
    assert argv[script_at + 1 :] == ["--distributed-backend", "nccl", *FORWARDED]
    assert "/tmp/my ckpt" in argv


def test_bash_syntax():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)


def test_executable_and_sbatch_header():
    assert os.access(SBATCH, os.X_OK)
    text = SBATCH.read_text()
    assert "set -euo pipefail" in text
    for directive in (
        "--nodes=",
        "--ntasks-per-node=1",
        "--gpus-per-node=",
        "--exclusive",
        "--job-name=",
        "--output=%x_%j",
        "--error=%x_%j",
    ):
        assert f"#SBATCH {directive}" in text, directive


def test_dry_run_without_scontrol_uses_plain_nodelist():
    line = _dry_run(_fake_env())
    assert line.startswith("srun ")
    _assert_launch(line, master_addr="gpu-node-7")


def test_dry_run_with_fake_scontrol_uses_first_host(tmp_path):
    calls = tmp_path / "scontrol.calls"
    fake_bin = tmp_path / "bin"
    _write_exe(
        fake_bin / "scontrol",
        f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\n'
        '[ "$1 $2" = "show hostnames" ] || exit 2\n'
        "printf 'gpu-a01\\ngpu-a02\\n'\n",
    )
    env = _fake_env(
        PATH=f"{fake_bin}{os.pathsep}{_path_without('scontrol')}", SLURM_JOB_NODELIST="gpu-a[01-02]"
    )
    line = _dry_run(env)
    _assert_launch(line, master_addr="gpu-a01")
    assert calls.read_text().split() == ["show", "hostnames", "gpu-a[01-02]"]


def test_dry_run_with_fake_scontrol_and_plain_nodelist(tmp_path):
    fake_bin = tmp_path / "bin"
    _write_exe(fake_bin / "scontrol", "#!/bin/sh\nprintf 'gpu-b17\\ngpu-b18\\n'\n")
    env = _fake_env(PATH=f"{fake_bin}{os.pathsep}{_path_without('scontrol')}")
    _assert_launch(_dry_run(env), master_addr="gpu-b17")


def test_scontrol_host_count_must_match_nnodes(tmp_path):
    fake_bin = tmp_path / "bin"
    _write_exe(fake_bin / "scontrol", "#!/bin/sh\nprintf 'gpu-b17\\n'\n")
    proc = _run(_fake_env(PATH=f"{fake_bin}{os.pathsep}{_path_without('scontrol')}"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error:") and "SLURM_NNODES=2" in proc.stderr


def test_compressed_nodelist_without_scontrol_is_an_error():
    proc = _run(_fake_env(SLURM_JOB_NODELIST="gpu[01-02]"))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("error:") and "gpu[01-02]" in proc.stderr


def test_master_addr_and_port_overrides_skip_scontrol():
    env = _fake_env(SLURM_JOB_NODELIST="gpu[01-02]", MASTER_ADDR="10.0.0.5", MASTER_PORT="31337")
    _, _, argv = _split_launch(_dry_run(env))
    assert _option(argv, "--master-addr") == "10.0.0.5"
    assert _option(argv, "--master-port") == "31337"


@pytest.mark.parametrize("missing", ["SLURM_JOB_NODELIST", "SLURM_NNODES"])
def test_missing_slurm_env_is_an_error(missing):
    proc = _run(_fake_env(**{missing: None}))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("error:")
    assert missing in proc.stderr


def test_gpus_per_node_must_match_slurm_allocation():
    proc = _run(_fake_env(GPUS_PER_NODE="4", SLURM_GPUS_ON_NODE="8"))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("error:")
    assert "GPUS_PER_NODE=4" in proc.stderr and "SLURM_GPUS_ON_NODE=8" in proc.stderr


@pytest.mark.parametrize(
    "gpus_per_node, slurm_gpus, expected", [(None, None, "8"), (None, "2", "2"), ("4", "4", "4")]
)
def test_gpus_per_node_default(gpus_per_node, slurm_gpus, expected):
    env = _fake_env(GPUS_PER_NODE=gpus_per_node, SLURM_GPUS_ON_NODE=slurm_gpus)
    _, _, argv = _split_launch(_dry_run(env))
    assert _option(argv, "--nproc-per-node") == expected


def test_cpus_per_task_follows_allocation():
    srun_opts, _, _ = _split_launch(_dry_run(_fake_env(SLURM_CPUS_ON_NODE="96")))
    assert "--cpus-per-task=96" in srun_opts
    srun_opts, _, _ = _split_launch(_dry_run(_fake_env(SLURM_CPUS_ON_NODE="96", CPUS_PER_TASK="")))
    assert not any(opt.startswith("--cpus-per-task") for opt in srun_opts)


def test_container_flags_only_when_set():
    srun_opts, _, _ = _split_launch(_dry_run(_fake_env()))
    assert not any(opt.startswith("--container") for opt in srun_opts)

    env = _fake_env(CONTAINER_IMAGE="nvcr.io/nvidia/pytorch:25.01-py3")
    srun_opts, _, _ = _split_launch(_dry_run(env))
    assert "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in srun_opts
    assert not any(opt.startswith("--container-mounts") for opt in srun_opts)

    env["CONTAINER_MOUNTS"] = "/lustre/data:/data,/home/me/my repo:/workspace"
    srun_opts, _, _ = _split_launch(_dry_run(env))
    assert "--container-mounts=/lustre/data:/data,/home/me/my repo:/workspace" in srun_opts


def test_container_mounts_without_image_is_an_error():
    proc = _run(_fake_env(CONTAINER_MOUNTS="/data:/data"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error:") and "CONTAINER_IMAGE" in proc.stderr


def test_spooled_copy_defaults_root_to_submit_dir(tmp_path):
    # sbatch runs a copy of the file from its spool directory, far from the repo.
    spooled = tmp_path / "spool" / "job42" / "slurm_script"
    spooled.parent.mkdir(parents=True)
    shutil.copy(SBATCH, spooled)
    submit_dir = tmp_path / "checkout with space"
    _, _, argv = _split_launch(
        _dry_run(_fake_env(SLURM_SUBMIT_DIR=str(submit_dir)), script=spooled)
    )
    assert str(submit_dir / "scripts" / "pretrain_mllm.py") in argv

    _, _, argv = _split_launch(_dry_run(_fake_env(ORCHWEAVE_ROOT="/opt/orchweave"), script=spooled))
    assert "/opt/orchweave/scripts/pretrain_mllm.py" in argv


def test_real_launch_through_fake_srun_and_torchrun(tmp_path):
    """Run without DRY_RUN: srun and torchrun are fakes that record what they receive."""
    fake_bin = tmp_path / "bin"
    srun_log = tmp_path / "srun.args"
    torchrun_log = tmp_path / "torchrun.args"
    # Fake srun: record its options, then run the task command as node 1 of the job.
    _write_exe(
        fake_bin / "srun",
        "#!/bin/bash\n"
        f"out={shlex.quote(str(srun_log))}\n"
        'while [[ $1 == --* ]]; do printf "%s\\n" "$1" >> "$out"; shift; done\n'
        'SLURM_NODEID=1 exec "$@"\n',
    )
    # Fake torchrun: record argv NUL-separated so spaces and newlines stay unambiguous.
    _write_exe(
        fake_bin / "torchrun",
        f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {shlex.quote(str(torchrun_log))}\n",
    )
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "pretrain_mllm.py").write_text("")
    env = _fake_env(
        PATH=f"{fake_bin}{os.pathsep}{_path_without('scontrol')}",
        DRY_RUN=None,
        ORCHWEAVE_ROOT=str(root),
        VENV="",
        SLURM_NODEID="0",  # what the batch shell sees; the task must not inherit this value
    )
    proc = _run(env, FORWARDED)
    assert proc.returncode == 0, proc.stderr
    assert srun_log.read_text().split() == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
    ]
    argv = torchrun_log.read_bytes().decode().split("\0")[:-1]
    assert argv == [
        "--node-rank",
        "1",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--master-addr",
        "gpu-node-7",
        "--master-port",
        "29500",
        str(root / "scripts" / "pretrain_mllm.py"),
        "--distributed-backend",
        "nccl",
        *FORWARDED,
    ]


def test_real_launch_requires_train_script(tmp_path):
    fake_bin = tmp_path / "bin"
    _write_exe(fake_bin / "srun", "#!/bin/sh\nexit 99\n")
    _write_exe(fake_bin / "torchrun", "#!/bin/sh\nexit 99\n")
    env = _fake_env(
        PATH=f"{fake_bin}{os.pathsep}{_path_without('scontrol')}",
        DRY_RUN=None,
        ORCHWEAVE_ROOT=str(tmp_path / "nowhere"),
        VENV="",
    )
    proc = _run(env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error:") and "pretrain_mllm.py" in proc.stderr


def test_printed_command_is_what_the_shell_would_run(tmp_path):
    """Executing the printed line with bash gives torchrun the same argv as the real launch."""
    fake_bin = tmp_path / "bin"
    torchrun_log = tmp_path / "torchrun.args"
    _write_exe(
        fake_bin / "srun",
        '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=3 exec "$@"\n',
    )
    _write_exe(
        fake_bin / "torchrun",
        f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {shlex.quote(str(torchrun_log))}\n",
    )
    line = _dry_run(_fake_env())
    env = {"PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"}
    subprocess.run(["bash", "-c", line], env=env, check=True, timeout=30)
    argv = torchrun_log.read_bytes().decode().split("\0")[:-1]
    assert argv[:2] == ["--node-rank", "3"]
    assert argv[-len(FORWARDED) :] == FORWARDED
