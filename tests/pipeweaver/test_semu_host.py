# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's host terms (what the runtime pays around its actions) and the calibration host probe."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_semu import CPU_FLAGS, _cluster, _uniform_mbs, model_spec

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from orchestration import host_probe
from orchestration.calibration import Calibration, LayerTimeModel
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.generators import dataflow, one_f_one_b
from pipeweaver.ir import Comm, Compute, Kind, Memory
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch, structure_of
from pipeweaver.semu.replay import posted_receives, receive_posts
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.timing import ComputeCost

# Distinct binary fractions: every coefficient of a hand-computed sum shows in the result.
F, B = 1.0, 2.0
SEND_POST, SEND_WAIT, RECV_POST, RECV_WAIT = 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-10
TRANSFER = 2.0**-12


def _host_calibration(**host: float) -> Calibration:
    return Calibration(device="test", host=dict(host))


def _llm_spec(p: int):
    return model_spec(
        {
            **CPU_FLAGS,
            "vision-num-layers": 0,
            "audio-num-layers": 0,
            "num-layers": 2 * p,
            "pipeline-model-parallel-size": p,
        }
    )


@pytest.mark.parametrize("transfer", [0.0, TRANSFER])
def test_two_rank_makespan_with_host_terms_is_the_hand_computed_one(transfer):
    """P = 2, one microbatch, free links. Rank 0: F0, send, recv, B0; rank 1: recv, F1, B1,
    send. Rank 1 posts its receive first (RECV_POST), waits for F0's output (leaves rank 0 at
    F + RECV_POST + SEND_POST: rank 0 posts its receive right before its send), returns from
    the wait (RECV_WAIT), computes F + B, posts its send (SEND_POST) and waits it at the end
    (SEND_WAIT). Rank 0 returns from its wait (RECV_WAIT), runs B0, waits its send. The compute
    a transfer takes from a rank (``transfer_compute_s``) comes with each of its posts."""
    spec = _llm_spec(2)

    def const(_placement, a, _mb):
        return ComputeCost(F if a.kind is Kind.F else B, 0.0, 0.0)

    cal = _host_calibration(
        send_post_s=SEND_POST,
        send_wait_s=SEND_WAIT,
        recv_post_s=RECV_POST,
        recv_wait_s=RECV_WAIT,
        **({"transfer_compute_s": transfer} if transfer else {}),
    )
    semu = Semu(spec, _cluster(2, free_comm=True), cal, compute_cost_fn=const)
    sched = one_f_one_b(Placement.baseline(2, spec.layers()), MicrobatchStructure(1))
    assert sched.has_comms
    res = semu.simulate_pipeline(sched, _uniform_mbs(1))
    send_post, recv_post = SEND_POST + transfer, RECV_POST + transfer
    grad_sent = 2 * F + B + recv_post + 2 * send_post + RECV_WAIT
    assert res.rank_end[1] == grad_sent + SEND_WAIT
    assert res.rank_end[0] == grad_sent + RECV_WAIT + B + SEND_WAIT
    assert res.makespan == 2 * F + 2 * B + recv_post + 2 * send_post + 2 * RECV_WAIT + SEND_WAIT
    # The posts are the timeline's host events, where the runtime's timers count them: rank 1
    # posts its receive at 0 and its send after F + B; rank 0 its receive and its send after F.
    hosts = sorted((e.rank, e.start, e.end, e.name) for e in res.events if e.category == "host")
    rank1_send = F + recv_post + send_post + RECV_WAIT + F + B
    assert hosts == [
        (0, F, F + recv_post, "recv-post"),
        (0, F + recv_post, F + recv_post + send_post, "send-post"),
        (1, 0.0, recv_post, "recv-post"),
        (1, rank1_send, rank1_send + send_post, "send-post"),
    ]
    # Without host terms: the plain 1F1B makespan.
    plain = Semu(spec, _cluster(2, free_comm=True), compute_cost_fn=const)
    assert plain.simulate_pipeline(sched, _uniform_mbs(1)).makespan == 2 * F + 2 * B


def _posts_by_the_runtime(actions) -> list[int]:
    """The receives the runtime's ``_post_receives(i)`` posts before action i, literally."""
    posted, out = 0, []
    for i in range(len(actions)):
        horizon = i + 1
        while horizon < len(actions) and not (
            isinstance(actions[horizon], Comm) and actions[horizon].is_send
        ):
            horizon += 1
        count = 0
        while posted < horizon:
            a = actions[posted]
            posted += 1
            count += isinstance(a, Comm) and not a.is_send
        out.append(count)
    return out


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 5), (4, 6)])
def test_receive_postings_follow_the_runtime_rule(p, m):
    spec = _llm_spec(p)
    sched = one_f_one_b(Placement.baseline(p, spec.layers()), MicrobatchStructure(m))
    for actions in sched.actions:
        assert receive_posts(actions) == _posts_by_the_runtime(actions)
        every = posted_receives(actions, at_step_start=True)
        assert every[0] == [
            i for i, a in enumerate(actions) if isinstance(a, Comm) and not a.is_send
        ]
        assert not any(every[1:])
        assert sum(receive_posts(actions)) == sum(
            isinstance(a, Comm) and not a.is_send for a in actions
        )


def test_receive_postings_delay_within_their_sum():
    """Interleaved encoders with subs: receive postings never shorten a rank's timeline, nor
    lengthen it by more than all of the pipeline's postings; compute time is unchanged."""
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2, "vision-num-layers": 4})
    pl = Placement.interleaved(2, spec.layers(), {"vision": 2})
    mbs = [
        MicrobatchMeta(
            (120, 30), 150, {"vision": (SubBatch((16, 16), 8), SubBatch((64,), 16))}, 1.0, 2
        ),
        MicrobatchMeta((90,), 90, {"vision": (SubBatch((32,), 8),)}, 1.0, 1),
    ]
    sched = dataflow(pl, structure_of(mbs, ["vision", "audio"]))
    check(sched)

    def const(_placement, a, _mb):
        return ComputeCost(1.0, 0.0, 0.0)

    base = Semu(spec, _cluster(2, free_comm=True), compute_cost_fn=const)
    cal = _host_calibration(recv_post_s=RECV_POST, recv_wait_s=0.0)
    posted = Semu(spec, _cluster(2, free_comm=True), cal, compute_cost_fn=const)
    a = base.simulate_pipeline(sched, mbs)
    b = posted.simulate_pipeline(sched, mbs)
    recvs = sum(isinstance(x, Comm) and not x.is_send for acts in sched.actions for x in acts)
    # Postings delay a rank by at most every posting of the pipeline (some hide in waits).
    for r in range(2):
        assert a.rank_end[r] <= b.rank_end[r] <= a.rank_end[r] + recvs * RECV_POST
    assert b.makespan > a.makespan and b.busy == a.busy


def test_runtime_action_and_sub_terms_add_exactly():
    """``runtime_forward_s`` / ``runtime_backward_s`` per compute, ``sub_join_s`` (F) and
    ``sub_join_backward_s`` (B) per encoder part at LLM chunk 0, ``sub_split_s`` per sub in
    the host time before the pipeline."""
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2})
    pl = Placement.interleaved(2, spec.layers(), {})
    mb = MicrobatchMeta(
        (120, 30),
        150,
        {"vision": (SubBatch((16, 16), 8), SubBatch((64,), 16)), "audio": (SubBatch((50,), 25),)},
        1.0,
        2,
    )
    terms = dict(
        runtime_forward_s=2.0**-3,
        runtime_backward_s=2.0**-5,
        sub_join_s=2.0**-7,
        sub_join_backward_s=2.0**-9,
        sub_split_s=2.0**-11,
    )
    base = Semu(spec, _cluster(2, device="cpu"), _host_calibration(), reuse=False)
    more = Semu(spec, _cluster(2, device="cpu"), _host_calibration(**terms), reuse=False)
    parts = 3
    for a, extra in [
        (Compute("vision", 0, Kind.F, 0, 1), terms["runtime_forward_s"]),
        (Compute("vision", 0, Kind.B, 0, 1), terms["runtime_backward_s"]),
        (Compute("llm", 0, Kind.F, 0), terms["runtime_forward_s"] + parts * terms["sub_join_s"]),
        (
            Compute("llm", 0, Kind.B, 0),
            terms["runtime_backward_s"] + parts * terms["sub_join_backward_s"],
        ),
        (
            Compute("llm", 0, Kind.B, 0, memory=Memory.RECOMPUTE),
            terms["runtime_backward_s"]
            + parts * (terms["sub_join_backward_s"] + terms["sub_join_s"]),
        ),
        (Compute("llm", 1, Kind.F, 0), terms["runtime_forward_s"]),
    ]:
        got = more.compute_cost(pl, a, mb).time_s - base.compute_cost(pl, a, mb).time_s
        assert got == pytest.approx(extra, rel=1e-9), a
    mbs = [mb, MicrobatchMeta((90,), 90, {"vision": (SubBatch((32,), 8),)}, 1.0, 1)]
    for r in range(2):
        assert more.host_time(mbs, r) - base.host_time(mbs, r) == pytest.approx(
            4 * terms["sub_split_s"], rel=1e-9
        )


# ------------------------------------------------------------------ the host probe

RECORDED = {"matmul_s": 0.1, "python_s": 0.02}


def _measured_calibration() -> Calibration:
    table = LayerTimeModel(
        const_s=1e-4,
        linear_s=2e-6,
        quadratic_s=1e-9,
        backward_ratio=2.5,
        act_bytes_per_token=640.0,
        layer_param_tensors=12,
    )
    return Calibration(
        device="cpu",
        modules={"llm": table},
        hardware={"peak_flops": 8e10, "hbm_bandwidth": 1e10},
        comm={"p2p_latency_s": 4e-4, "p2p_bandwidth": 2e9},
        host={"step_s": 0.01, "send_post_s": 1e-4, "shared_node_slowdown": 1.07},
        machine={"cpu": "Slow CPU", "cores": 2, "torch_threads": 1, "probe": dict(RECORDED)},
        path="cal.json",
    )


def test_probe_factor_scales_every_time_and_warns_once(monkeypatch):
    monkeypatch.setattr(host_probe, "_WARNED", set())
    cal = _measured_calibration()
    lines: list[str] = []
    # This host takes 4x the matmul probe's time and 1x the Python one: factor sqrt(4) = 2.
    fast = {"matmul_s": 0.4, "python_s": 0.02}
    out = host_probe.fit_to_host(cal, probe=lambda: fast, warn=lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning: cal.json") and "2.000" in lines[0]
    t = out.modules["llm"]
    assert (t.const_s, t.linear_s, t.quadratic_s) == (2e-4, 4e-6, 2e-9)
    assert (t.backward_ratio, t.act_bytes_per_token, t.layer_param_tensors) == (2.5, 640.0, 12)
    assert out.hardware == {"peak_flops": 4e10, "hbm_bandwidth": 5e9}
    assert out.comm == {"p2p_latency_s": 8e-4, "p2p_bandwidth": 1e9}
    assert out.host == {"step_s": 0.02, "send_post_s": 2e-4, "shared_node_slowdown": 1.07}
    assert out.machine["applied_factor"] == 2.0 and cal.machine.get("applied_factor") is None
    # Once scaled, never again; and the same file warns once per process.
    assert host_probe.fit_to_host(out, probe=lambda: fast, warn=lines.append) is out
    host_probe.fit_to_host(cal, probe=lambda: fast, warn=lines.append)
    assert len(lines) == 1


@pytest.mark.parametrize("ratio", [0.91, 1.0, 1.099])
def test_a_host_within_ten_percent_keeps_the_calibration(ratio):
    cal = _measured_calibration()
    probe = {k: v * ratio for k, v in RECORDED.items()}
    lines: list[str] = []
    assert host_probe.fit_to_host(cal, probe=lambda: probe, warn=lines.append) is cal
    assert host_probe.fit_to_host(cal, probe=lambda: probe, strict=True) is cal
    assert not lines


def test_strict_refuses_another_host_and_no_probe_keeps_it():
    cal = _measured_calibration()
    slow = {k: v * 1.25 for k, v in RECORDED.items()}
    with pytest.raises(host_probe.CalibrationHostError, match=r"cal\.json.*1\.25x"):
        host_probe.fit_to_host(cal, probe=lambda: slow, strict=True)
    # No probe here (disabled), or none recorded (older files): unchanged.
    assert host_probe.fit_to_host(cal, probe=lambda: None, strict=True) is cal
    old = dataclasses.replace(cal, machine={})
    assert host_probe.fit_to_host(old, probe=lambda: slow, strict=True) is old


def test_probe_runs_once_per_process_and_the_environment_disables_it(monkeypatch):
    calls = []
    monkeypatch.setattr(host_probe, "_PROBE", None)
    monkeypatch.setattr(host_probe, "run_probe", lambda: calls.append(1) or dict(RECORDED))
    monkeypatch.setenv(host_probe.PROBE_ENV, "0")
    assert host_probe.host_probe() is None and not calls
    monkeypatch.setenv(host_probe.PROBE_ENV, "1")
    assert host_probe.host_probe() == RECORDED and host_probe.host_probe() == RECORDED
    assert calls == [1]


def test_calibration_file_keeps_machine_and_old_files_load(tmp_path):
    cal = _measured_calibration()
    path = tmp_path / "c.json"
    cal.save(path)
    back = Calibration.load(path)
    assert back.machine == cal.machine and back.host == cal.host and back.path == str(path)
    obj = json.loads(path.read_text())
    del obj["machine"]
    path.write_text(json.dumps(obj))
    assert Calibration.load(path).machine == {}


def test_layers_measured_now_refresh_a_full_calibration_and_keep_the_rest():
    """``tools/calibrate.py --stages layers --base F``: the new layer tables, device peaks and
    probe replace F's; F's transfers and host figures stay where nothing new measured them."""
    base = _measured_calibration()
    base.model = {"llm": {"hidden_size": 64, "num_layers": 4}}
    vision = dataclasses.replace(base.modules["llm"], const_s=3e-4)
    base.modules = {**base.modules, "vision": vision}
    fresh_llm = dataclasses.replace(base.modules["llm"], const_s=6e-4, linear_s=2.5e-6)
    now = Calibration(
        device="cpu",
        modules={"llm": fresh_llm},
        model={"llm": {"hidden_size": 64, "num_layers": 4}},
        efficiency={"compute": 0.3},
        source="now",
        hardware={"peak_flops": 7e10, "hbm_bandwidth": 9e9},
        host={"step_s": 0.02},
        machine={"cpu": "Slow CPU", "probe": {"matmul_s": 0.3, "python_s": 0.02}},
    )
    got = now.over(base)
    assert got.modules == {"llm": fresh_llm, "vision": vision}
    assert got.hardware == now.hardware and got.efficiency == now.efficiency
    assert got.machine == now.machine
    assert got.comm == base.comm  # nothing new measured the transfers
    assert got.host == {**base.host, "step_s": 0.02}
    assert got.source.startswith("now; over cal.json")
    # A stage without layers leaves the base's tables, peaks and probe.
    host_only = Calibration(device="cpu", host={"send_post_s": 2e-4}).over(base)
    assert host_only.modules == base.modules and host_only.machine == base.machine
    assert host_only.hardware == base.hardware and host_only.host["send_post_s"] == 2e-4
    # Another model's tables are refused, naming the module.
    other = dataclasses.replace(now, model={"llm": {"hidden_size": 128, "num_layers": 4}})
    with pytest.raises(ValueError, match="module llm is .*another model"):
        other.over(base)


def test_semu_cli_strict_calibration(tmp_path, monkeypatch, capsys):
    from megatron.mllm.cli import semu as cli

    cal = _measured_calibration()
    loaded = Calibration.load("scripts/configs/calibration-cpu.json")
    cal = dataclasses.replace(loaded, machine=cal.machine)
    path = tmp_path / "cal.json"
    cal.save(path)
    monkeypatch.setattr(host_probe, "_WARNED", set())
    monkeypatch.setenv(host_probe.PROBE_ENV, "1")
    monkeypatch.setattr(host_probe, "_PROBE", {k: v * 2 for k, v in RECORDED.items()})
    argv = [
        "--model",
        "cpu-main",
        "--cluster",
        "cpu-2ranks",
        "--calibration",
        str(path),
        "--set",
        "pipeline-model-parallel-size=2",
        "--json",
    ]
    assert cli.main([*argv, "--strict-calibration"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "2.00x" in err[0]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(path) in warnings[0] and "2.000" in warnings[0]
    scaled = json.loads(captured.out)["step_time_s"]
    monkeypatch.setattr(host_probe, "_PROBE", dict(RECORDED))
    assert cli.main(argv) == 0
    same = json.loads(capsys.readouterr().out)["step_time_s"]
    # Every time doubled, rates halved: the whole prediction doubles.
    assert scaled == pytest.approx(2 * same, rel=1e-9)


def test_trainer_refuses_with_strict_calibration_and_rescales_without(tmp_path, monkeypatch):
    """The trainer's load (every rank adopts rank 0's probe): ``--strict-calibration`` is a
    ConfigError naming the flag; without it the calibration comes back scaled."""
    from megatron.mllm import distributed, training
    from megatron.mllm.arguments import ConfigError

    path = tmp_path / "cal.json"
    _measured_calibration().save(path)
    monkeypatch.setattr(host_probe, "_WARNED", set())
    monkeypatch.setenv(host_probe.PROBE_ENV, "1")
    monkeypatch.setattr(host_probe, "_PROBE", {k: v * 1.5 for k, v in RECORDED.items()})
    monkeypatch.setattr(distributed, "global_rank", lambda: 0)
    monkeypatch.setattr(distributed, "all_gather_objects", lambda obj: [obj, None])
    flags = {**CPU_FLAGS, "cost-calibration": str(path)}
    strict = run_from_flags(
        flag_argv(set_flags({**flags, "strict-calibration": True})), ONE_REPLICA
    ).run
    assert strict.balance.strict_calibration is True
    with pytest.raises(ConfigError, match=r"^--cost-calibration .*cal\.json.*1\.50x"):
        training._host_calibration(strict)
    lenient = run_from_flags(flag_argv(set_flags(flags)), ONE_REPLICA).run
    assert lenient.balance.strict_calibration is False
    cal = training._host_calibration(lenient)
    assert cal.machine["applied_factor"] == pytest.approx(1.5)
    assert cal.host["step_s"] == pytest.approx(0.015)


def test_runtime_stage_runs_the_executor_on_every_module():
    """The calibration's ``runtime`` stage drives the real executor (stand-ins for megatron-core's
    calls): every action of a one-rank schedule of the model's modules runs, in both kinds."""
    from megatron.mllm.calibration import DEFAULT_MODEL
    from megatron.mllm.calibration.harness import measurement_run
    from megatron.mllm.calibration.runtime import _actions, _join

    class Unit:
        """A reference pass of one second: the results stay in seconds."""

        def time(self) -> float:
            return 1.0

    mllm = measurement_run(DEFAULT_MODEL).model
    got = {**_actions(mllm, 1, Unit()), **_join(mllm, 1, Unit())}
    assert set(got) == {"runtime_forward_s", "runtime_backward_s", "sub_join_s",
                        "sub_join_backward_s"}  # fmt: skip
    assert got["runtime_forward_s"] > 0 and got["runtime_backward_s"] > 0
    assert all(v >= 0 for v in got.values())


def _ready_post_programs(sender_computes: float, send_after: float):
    """Rank 1 computes ``send_after`` seconds, sends tensor 0 to rank 0 and computes
    ``sender_computes`` more; rank 0 computes 1 s, posts its receive (RECV_POST), waits the
    tensor and computes 1 s. Free links."""
    from pipeweaver.semu.replay import COMPUTE, HOST, RECV, SEND

    def compute(seconds: float, pair: int) -> tuple:
        return (COMPUTE, None, seconds, 0.0, 0.0, True, pair, (), (), "c")

    send = (SEND, 0, (1, 0), 0.0, 0.0, 0.0)
    sender = [compute(send_after, 2), send] if send_after else [send]
    if sender_computes:
        sender.append(compute(sender_computes, 3))
    poster = [compute(1.0, 0), (HOST, RECV_POST, "recv-post", ((0, 1),)), (RECV, 0, 0.0)]
    poster.append(compute(1.0, 1))
    return [poster, sender]


@pytest.mark.parametrize(
    "sender_computes,send_after,extra_paid",
    [
        (10.0, 0.0, True),  # sent before the post, the sender computing at it: dearer
        (0.0, 0.0, False),  # sent before the post, the sender idle at it: a plain post
        (0.5, 0.0, False),  # the sender's compute ended before the post
        (10.0, 2.0, False),  # posted before the send: the send starts the transfer
    ],
)
def test_a_receive_posted_after_its_send_while_the_sender_computes_costs_more(
    sender_computes, send_after, extra_paid
):
    """A receive whose tensor was sent already starts the transfer at its post; while the
    sender computes (a full 2-core host) the post costs ``ready_extra`` more, and only then."""
    from types import SimpleNamespace

    from pipeweaver.semu.replay import replay

    graph = SimpleNamespace(num_edges=1, num_computes=4)
    extra = 2.0**-1
    programs = _ready_post_programs(sender_computes, send_after)
    got = replay(programs, [[], []], graph, [0.0, 0.0], False, ready_extra=extra)
    plain = replay(programs, [[], []], graph, [0.0, 0.0], False)
    arrival = max(1.0 + RECV_POST, send_after)
    assert plain.rank_end[0] == arrival + 1.0
    assert got.rank_end[0] == plain.rank_end[0] + (extra if extra_paid else 0.0)
    assert got.rank_end[1] == plain.rank_end[1] and got.busy == plain.busy


def test_ready_receive_posts_need_the_calibration_figure():
    """``recv_post_ready_s`` prices the ready posts over ``recv_post_s``; without it (a GPU
    calibration, an old file) SEMU's timeline is exactly the one before; on the dynamic order
    of interleaved chunks, where both ranks compute while their tensors wait, it is longer."""
    spec = model_spec({**CPU_FLAGS, "pipeline-model-parallel-size": 2, "vision-num-layers": 4})
    pl = Placement.interleaved(2, spec.layers(), {"vision": 2})
    mbs = [
        MicrobatchMeta((120, 30), 150, {"vision": (SubBatch((16, 16), 8),)}, 1.0, 2),
        MicrobatchMeta((90,), 90, {"vision": (SubBatch((32,), 8),)}, 1.0, 1),
        MicrobatchMeta((60, 60), 120, {"vision": (SubBatch((64,), 16),)}, 1.0, 2),
    ]
    from pipeweaver.interleave import greedy_dual_queue

    structure = structure_of(mbs, ["vision", "audio"])
    sched = greedy_dual_queue(pl, structure, lambda a: F if a.kind is Kind.F else B)
    check(sched)

    def const(_placement, a, _mb):
        return ComputeCost(F if a.kind is Kind.F else B, 0.0, 0.0)

    def run(**host):
        cal = _host_calibration(recv_post_s=RECV_POST, **host)
        semu = Semu(spec, _cluster(2, free_comm=True), cal, compute_cost_fn=const)
        return semu.simulate_pipeline(sched, mbs, record_events=True)

    base, same, ready = run(), run(recv_post_ready_s=RECV_POST), run(recv_post_ready_s=1.0)
    assert same.rank_end == base.rank_end and same.events == base.events
    # Every receive posted when the step starts (gloo's default): none waits for a core, and
    # each costs recv_post_s, or recv_post_start_s where the calibration has it.
    early = dataclasses.replace(
        spec, parallel=dataclasses.replace(spec.parallel, receive_posting="step")
    )
    recvs = [sum(isinstance(x, Comm) and not x.is_send for x in acts) for acts in sched.actions]
    for start in (None, TRANSFER):
        host = {"recv_post_ready_s": 1.0, **({"recv_post_start_s": start} if start else {})}
        cal = _host_calibration(recv_post_s=RECV_POST, **host)
        semu = Semu(early, _cluster(2, free_comm=True), cal, compute_cost_fn=const)
        at_start = semu.simulate_pipeline(sched, mbs, record_events=True)
        posts = [e for e in at_start.events if e.name == "recv-post"]
        each = start or RECV_POST
        assert sorted((e.rank, e.start, e.end) for e in posts) == [
            (r, 0.0, recvs[r] * each) for r in range(2)
        ]
    assert ready.makespan > base.makespan and ready.busy == base.busy
    posts = [e for e in ready.events if e.name == "recv-post"]
    # Every post costs its receives' RECV_POST, each ready one 1 s in all.
    extra = sum(e.end - e.start for e in posts) - sum(
        e.end - e.start for e in base.events if e.name == "recv-post"
    )
    ready_posts = extra / (1.0 - RECV_POST)
    assert ready_posts >= 1 and abs(ready_posts - round(ready_posts)) < 1e-9
