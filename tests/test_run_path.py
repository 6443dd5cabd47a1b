"""The profile-solve-run path: a profile must hold the solved model's layers, declared device types
survive --profile (emulated ones run at their slowdown), and `gpuplan run` reports the plan's own
predictions next to the measured ones with the machine's contention."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from click.testing import CliRunner

from gpuplan import api
from gpuplan.errors import InputError
from gpuplan.models import poseidon as P
from gpuplan.models.profile import (EmulatedType, LayerCost, LayerTable, MeasuredDeviceType, Profile, ProfileNode,
                                    load_profile, parse_emulation)
from gpuplan.models.workload import TransformerConfig
from gpuplan.runtime import contention

TINY = TransformerConfig(name="tiny", num_layers=4, hidden=64, heads=4, ffn_hidden=128, vocab=256, gated_mlp=False)
OTHER = TransformerConfig(name="other", num_layers=4, hidden=96, heads=4, ffn_hidden=192, vocab=256, gated_mlp=False)


def cpu_profile(model: TransformerConfig = TINY, *, ranks: int = 2, emulate: tuple[EmulatedType, ...] = (),
                layer_s: float = 0.004, calls: str = "after-wait") -> Profile:
    """A CPU profile like `gpuplan profile --device cpu` writes, with a layer table of `model` (its calls
    timed after waits, as the profiler times them on CPU; "back-to-back" as older profiles did)."""
    costs = [LayerCost(device_type="cpu", part=part, micro_batch=mb, seq_len=16, forward_s=f * mb,
                       backward_s=2 * f * mb, activation_bytes=1e5)
             for mb in (1, 2, 4) for part, f in (("layer", layer_s), ("embedding", 1e-5), ("head", 0.001))]
    return Profile(quick=True, host="h",
                   device_types=[MeasuredDeviceType(name="cpu", backend="cpu", count=ranks, memory_bytes=8 * 2**30,
                                                    matmul_tflops={"fp32": 0.05}, threads=1)],
                   nodes=[ProfileNode(name="h", devices={"cpu": ranks})],
                   layers=[LayerTable(model=model.name, config=model.model_dump(mode="json"), costs=costs,
                                      clock="cpu", calls=calls)],
                   emulated=list(emulate))


def two_types(model: TransformerConfig = TINY, counts: tuple[int, int] = (1, 1)) -> P.PoseidonProblem:
    doc = {"kind": "poseidon", "cluster": {
        "device_types": {"cpu": {"name": "cpu", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                                 "peak_tflops": {"fp32": 0.05}, "intra_node_GBps": 2},
                         "cpu-slow2x": {"name": "cpu-slow2x", "memory_bytes": "4 GiB", "memory_bandwidth_GBps": 10,
                                        "peak_tflops": {"fp32": 0.025}, "intra_node_GBps": 2}},
        "nodes": [{"name": "cpu0", "gpus": {"cpu": counts[0], "cpu-slow2x": counts[1]}}]},
        "model": model.model_dump(), "global_batch": 8, "seq_len": 16, "dtype": "fp32",
        "optimizer_state_bytes_per_param": 0, "max_tp": 1}
    return P.PoseidonProblem.model_validate(doc)


SLOW2X = (EmulatedType(name="cpu-slow2x", base="cpu", slowdown=2.0),)


# ---- 1. the layer table must be the solved model's ------------------------------------------------

def test_a_profile_of_another_model_is_refused_with_the_command_that_profiles_the_right_one(tmp_path) -> None:
    from gpuplan.commands.profile import layer_target

    path = cpu_profile(OTHER, emulate=SLOW2X).save(tmp_path / "p.json")
    with pytest.raises(InputError) as err:
        P.with_profile(two_types(TINY), load_profile(path))
    message = str(err.value)
    assert str(path) in message and "the layer table holds other (4 layers, hidden 96" in message
    assert "the problem solves tiny (4 layers, hidden 64" in message
    command = message.split("\n  ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["gpuplan", "profile"] and "--emulate" in argv and "cpu-slow2x=cpu*2" in argv
    assert argv[argv.index("--cpu-ranks") + 1] == "2" and argv[argv.index("--seq-len") + 1] == "16"
    # the command's model is exactly the solved one
    target = layer_target(argv[argv.index("--model") + 1], None, 16, argv[argv.index("--micro-batches") + 1])
    assert target.config is not None and target.config.model_dump() == TINY.model_dump()
    assert target.seq_lens == (16,) and target.micro_batches == (1, 2, 4, 8)


def test_a_profile_of_the_solved_model_is_used_unscaled() -> None:
    prob = P.with_profile(two_types(TINY), cpu_profile(TINY, emulate=SLOW2X))
    assert prob.layer_costs is not None and prob.layer_costs.model == "tiny"
    assert P.CostModel(prob).layer("cpu", 1, 2)[0] == pytest.approx(0.008, rel=1e-9)  # the measured figure itself


def test_profile_options_describe_one_model(tmp_path) -> None:
    from gpuplan.commands.profile import layer_target

    problem = tmp_path / "prob.yaml"
    problem.write_text(yaml.safe_dump(two_types(TINY).document()))
    target = layer_target(None, str(problem), None, None)
    assert target.config is not None and target.config.hidden == 64 and target.seq_lens == (16,)
    assert target.micro_batches == (1, 2, 4, 8) and target.devices_per_node == 2
    assert layer_target(None, None, None, None).catalog == "llama3-8b"
    with pytest.raises(InputError, match="--seq-len"):
        layer_target("llama2-7b", None, 64, None)
    with pytest.raises(InputError, match="--model"):
        layer_target("{hidden: 3", None, None, None)
    with pytest.raises(InputError, match="--micro-batches"):
        layer_target(json.dumps(TINY.model_dump()), None, None, "1,x")
    with pytest.raises(InputError, match="--model"):
        layer_target("tiny", str(problem), None, None)


# ---- 2. declared device types are kept -----------------------------------------------------------

def test_declared_types_are_kept_and_emulated_types_run_slower() -> None:
    from gpuplan.runtime.poseidon import stage_slowdowns

    prob = P.with_profile(two_types(TINY), cpu_profile(TINY, emulate=SLOW2X))
    assert set(prob.cluster.capacity()) == {"cpu", "cpu-slow2x"}
    assert [n.name for n in prob.cluster.nodes] == ["cpu0"]
    cm = P.CostModel(prob)
    fast, slow = cm.layer("cpu", 1, 2), cm.layer("cpu-slow2x", 1, 2)
    assert slow[0] == pytest.approx(2 * fast[0]) and slow[1] == pytest.approx(2 * fast[1])
    assert prob.layer_costs.slowdowns == {"cpu": 1.0, "cpu-slow2x": 2.0} and prob.layer_costs.threads == 1
    assert prob.cluster.type_of("cpu-slow2x").peak("fp32") == pytest.approx(prob.cluster.type_of("cpu").peak("fp32") / 2)
    plan = api.solve(prob, num_stages=2)
    assert plan.ok and api.check(prob, plan) == []
    by_type = {s.device_type: s for s in plan.stages}
    assert set(by_type) == {"cpu", "cpu-slow2x"}
    per_layer = {t: (s.forward_s + s.backward_s) / s.num_layers for t, s in by_type.items()}
    assert per_layer["cpu-slow2x"] > 1.5 * per_layer["cpu"]  # head/embedding aside, twice the time per layer
    assert stage_slowdowns(prob, plan) == [2.0 if s.device_type == "cpu-slow2x" else 1.0 for s in plan.stages]


def test_emulated_types_keep_their_factor_without_the_base_type_declared() -> None:
    from gpuplan.runtime.poseidon import stage_slowdowns

    doc = two_types(TINY).document()
    doc["cluster"]["device_types"]["cpu-slow3x"] = {**doc["cluster"]["device_types"]["cpu-slow2x"], "name": "cpu-slow3x"}
    doc["cluster"]["nodes"][0]["gpus"] = {"cpu-slow2x": 1, "cpu-slow3x": 1}
    emulate = SLOW2X + (EmulatedType(name="cpu-slow3x", base="cpu", slowdown=3.0),)
    prob = P.with_profile(P.PoseidonProblem.model_validate(doc), cpu_profile(TINY, emulate=emulate))
    plan = api.solve(prob, num_stages=2)
    # the runner slows each stage relative to the real CPU, not relative to the fastest declared type
    assert sorted(stage_slowdowns(prob, plan)) == [2.0, 3.0]


def test_a_type_the_profile_does_not_measure_or_emulate_is_refused(tmp_path) -> None:
    path = cpu_profile(TINY).save(tmp_path / "p.json")
    with pytest.raises(InputError, match=r"p.json: the problem declares device type 'cpu-slow2x', which the profile "
                                         r"neither measured \(measured: cpu\) nor emulates.*--emulate cpu-slow2x=cpu\*2"):
        P.with_profile(two_types(TINY), load_profile(path))


def test_more_declared_devices_than_profiled_is_refused() -> None:
    with pytest.raises(InputError, match="node 'cpu0' of the problem holds 3 devices backed by measured type 'cpu'; "
                                         "the profile's nodes hold at most 2; profile with --cpu-ranks 3"):
        P.with_profile(two_types(TINY, (2, 1)), cpu_profile(TINY, emulate=SLOW2X))


def test_emulation_parsing() -> None:
    assert parse_emulation("cpu-slow2x=cpu*2") == EmulatedType(name="cpu-slow2x", base="cpu", slowdown=2.0)
    for bad in ("cpu-slow2x", "cpu-slow2x=cpu", "x=cpu*0.5", "=cpu*2", "x=cpu*two"):
        with pytest.raises(InputError, match="NAME=BASE\\*FACTOR"):
            parse_emulation(bad)
    from gpuplan.profiling.profile import check_emulation

    with pytest.raises(ValueError, match="the base must be a measured device type"):
        check_emulation((EmulatedType(name="x", base="gpu", slowdown=2),), ["cpu"])
    with pytest.raises(ValueError, match="already a measured type"):
        check_emulation((EmulatedType(name="cpu", base="cpu", slowdown=2),), ["cpu"])


# ---- 3. what run reports ---------------------------------------------------------------------------

def test_contention_report_says_when_the_machine_was_contended() -> None:
    quiet = contention.Window(0.5, 0.01, [], [0.3])
    busy = contention.Window(2.0, 0.6, [("python[1]", 1.2)], [2.5, 3.1])
    out = contention.report(quiet, busy, [1.0, 1.05, 1.5])
    assert out["contended"] and out["load_before"] == 0.3 and out["load_during_max"] == 3.1
    assert out["others_cpu_share_during"] == 0.6 and out["busiest_others"] == "python[1] 120%"
    assert out["verdict"].startswith("CONTENDED: other processes used 60% of the")
    assert out["step_spread"] == pytest.approx((1.41 - 1.01) / 1.05)
    calm = contention.report(quiet, contention.Window(2.0, 0.02, [], [0.4]), [1.0, 1.01, 1.02])
    assert not calm["contended"] and not calm["unsteady"] and calm["verdict"].startswith("quiet: ")
    unknown = contention.report(contention.Window(), contention.Window(), [1.0])
    assert not unknown["contended"] and "unknown" in unknown["verdict"]


def test_other_processes_cpu_share_sees_a_busy_child_as_ours_and_others_as_others() -> None:
    before = {1: (0, "init", 1.0), 10: (1, "other", 5.0), 20: (99, "ours", 1.0)}
    after = {1: (0, "init", 1.0), 10: (1, "other", 6.0), 20: (99, "ours", 3.0), 30: (1, "new", 0.5)}
    share, busiest = contention.others_usage(before, after, 1.0, {99, 20})
    assert share == pytest.approx(1.5 / contention.cores())
    assert busiest == [("other[10]", 1.0), ("new[30]", 0.5)]
    assert contention.cpu_times() is None or 1 in contention.cpu_times() or len(contention.cpu_times()) > 0


def _fake_run(prob: P.PoseidonProblem, plan: P.PoseidonPlan, measured_scale: float, *, cpu_scale: float = 1.0,
              others: float = 0.0) -> dict:
    out = {"world_size": len(plan.stages), "cores": 2, "steps": 3, "scaling": "none",
           "measured_iteration_s": plan.iteration_time_s * measured_scale,
           "measured_fastest_iteration_s": plan.iteration_time_s * measured_scale * 0.95,
           "predicted_cpu_iteration_s": plan.iteration_time_s * 1.02,
           "predicted_idle_cpu_iteration_s": plan.iteration_time_s}
    for k, s in enumerate(plan.stages):
        out |= {f"stage{k}_slowdown": 1.0, f"stage{k}_forward_measured_s": s.forward_s * measured_scale,
                f"stage{k}_backward_measured_s": s.backward_s * measured_scale,
                f"stage{k}_forward_predicted_cpu_s": s.forward_s, f"stage{k}_backward_predicted_cpu_s": s.backward_s,
                f"stage{k}_forward_cpu_measured_s": s.forward_s * cpu_scale,
                f"stage{k}_backward_cpu_measured_s": s.backward_s * cpu_scale}
    window = contention.Window(0.5, others, [], [0.2])
    return out | contention.report(window, window, [1.0, 1.0, 1.0])


def test_run_report_puts_predicted_next_to_measured_and_warns_past_15_percent() -> None:
    from gpuplan.render import table_text
    from gpuplan.runtime.poseidon import _report

    prob = P.with_profile(two_types(TINY), cpu_profile(TINY, emulate=SLOW2X))
    plan = api.solve(prob, num_stages=2)
    tables, warnings = _report(prob, plan, _fake_run(prob, plan, 1.05))
    text = "\n".join(table_text(t) for t in tables)
    assert warnings == []
    assert "plan (DAG; devices share nothing)" in text and "fwd measured" in text and "bwd plan" in text
    assert "load average (1 min) before" in text and "other processes' CPU during" in text and "contended" in text
    assert f"{plan.iteration_time_s:.4g}" in text
    tables, warnings = _report(prob, plan, _fake_run(prob, plan, 1.3))
    assert len(warnings) == 2 and "more than 15% off" in warnings[0] and "per-stage" in warnings[1]
    # contended: the ops' own CPU time tells the machine's share from the model's
    _, warnings = _report(prob, plan, _fake_run(prob, plan, 2.0, cpu_scale=1.05, others=0.5))
    assert "CONTENDED" in warnings[-1] and "the difference is the machine's" in warnings[-1]
    _, warnings = _report(prob, plan, _fake_run(prob, plan, 2.0, cpu_scale=1.5, others=0.5))
    assert any("the cost model, not only the machine, is off" in w for w in warnings)
    assert "the difference is the machine's" not in warnings[-1]
    # a plan whose costs are declared peaks, not measured, says so
    unmeasured = two_types(TINY)
    plan2 = api.solve(unmeasured, num_stages=2)
    _, warnings = _report(unmeasured, plan2, _fake_run(unmeasured, plan2, 1.0))
    assert any("not measured layers" in w for w in warnings)
    # a CPU profile whose layer calls were timed back to back (older profiles) says to profile again
    old = P.with_profile(two_types(TINY), cpu_profile(TINY, emulate=SLOW2X, calls="back-to-back"))
    plan3 = api.solve(old, num_stages=2)
    _, warnings = _report(old, plan3, _fake_run(old, plan3, 1.05))
    assert len(warnings) == 1 and "timed its calls back to back" in warnings[0] and "profile again" in warnings[0]


def test_core_sharing_replay_records_each_op() -> None:
    from gpuplan.runtime.poseidon import contended_iteration_s

    record: list = []
    t = contended_iteration_s([1.0, 2.0], [2.0, 4.0], [0.0], [0.0, 0.0], 2, "1f1b", [1.0, 2.0], [1.0, 1.0], record)
    assert len(record) == 8 and max(e for *_, e in record) == pytest.approx(t)
    # a stage emulated 2x slower: each op lasts its full (slowed) duration on an idle machine
    assert {round(e - s, 9) for st, kind, s, e in record if st == 1 and kind == "F"} == {2.0}


def test_tessel_run_report_shows_the_plans_makespan() -> None:
    from gpuplan.render import table_text
    from gpuplan.runtime.tessel import _report

    prob = api.load_problem("examples/tessel/hand-2.yaml")
    plan = api.solve(prob, solver="tessel")
    quiet = contention.Window(0.5, 0.0, [], [0.2])
    out = {"steps": 3, "measured_step_s": 1.0, "plan_makespan_s": plan.makespan_s, "retimed_step_s": 0.98,
           "block_durations_s": {b.name: b.duration_s * 2.5 for b in prob.blocks}} | contention.report(quiet, quiet, [1.0])
    tables, warnings = _report(prob, out)
    text = table_text(tables[0])
    assert "the plan's makespan" in text and f"{plan.makespan_s:.4g}" in text
    assert len(warnings) == 1 and f"makespan {plan.makespan_s:.4g} s differs" in warnings[0]
    assert "F0" in warnings[0]


# ---- end to end (multi-process, slow) ---------------------------------------------------------------

@pytest.mark.slow
def test_cli_run_of_a_profiled_plan_prints_predicted_measured_and_the_machine(tmp_path) -> None:
    from gpuplan.cli import main

    prob_file = tmp_path / "prob.yaml"
    prob_file.write_text(yaml.safe_dump(two_types(TINY).document()))
    from gpuplan.profiling.profile import ProfileOptions, run_profile

    profile = run_profile(ProfileOptions(device="cpu", quick=True, cpu_ranks=2, collectives=False, config=TINY,
                                         seq_lens=(16,), micro_batches=(1, 2, 4), emulate=SLOW2X))
    assert profile.emulated == list(SLOW2X) and profile.layers[0].model == "tiny"
    assert profile.layers[0].scaled_from is None
    profile.save(tmp_path / "p.json")
    runner = CliRunner()
    solved = runner.invoke(main, ["solve", "poseidon", str(prob_file), "--profile", str(tmp_path / "p.json"),
                                  "--option", "num_stages=2", "-q", "-o", str(tmp_path / "plan.json")])
    assert solved.exit_code == 0, solved.output
    assert "cpu-slow2x" in solved.output
    ran = runner.invoke(main, ["run", str(tmp_path / "plan.json")])
    assert ran.exit_code == 0, ran.output
    for needle in ("iteration: predicted vs measured", "plan (DAG; devices share nothing)", "fwd plan",
                   "fwd measured", "bwd measured", "load average (1 min) before", "other processes' CPU during",
                   "step times spread", "machine: "):
        assert needle in ran.output, needle
    plan = api.load_plan(tmp_path / "plan.json")
    assert f"{plan.iteration_time_s:.4g}" in ran.output


@pytest.mark.slow
def test_tessel_run_reports_the_plans_makespan() -> None:
    prob = api.load_problem({"kind": "tessel", "microbatches": 2,
                             "shape": {"name": "1f1b", "devices": 2, "forward_s": 0.01, "backward_s": 0.02}})
    plan = api.solve(prob, solver="tessel")
    out = api.run(plan, prob, steps=1, hidden=64, seq=32, microbatch_size=2, timeout_s=120)
    assert out["plan_makespan_s"] == plan.makespan_s == out["predicted_step_s"]
    assert out["error"] == pytest.approx((plan.makespan_s - out["measured_step_s"]) / out["measured_step_s"])
    assert out["retimed_step_s"] > 0 and "contended" in out and "load_before" in out


def test_profile_cli_refuses_bad_options_before_measuring(tmp_path) -> None:
    from gpuplan.cli import main

    out = tmp_path / "p.json"
    bad = CliRunner().invoke(main, ["profile", "--quick", "--emulate", "cpu-slow2x=cpu", "-o", str(out)])
    assert bad.exit_code == 2 and "NAME=BASE*FACTOR" in bad.output and not out.exists()
    bad = CliRunner().invoke(main, ["profile", "--quick", "--model", "{hidden: 3", "-o", str(out)])
    assert bad.exit_code == 2 and "--model" in bad.output and not out.exists()


def test_a_one_node_gpu_profile_serves_a_declared_multi_node_cluster() -> None:
    from gpuplan.models.profile import ProfileLink

    cfg = TransformerConfig(name="g", num_layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=4096)
    costs = [LayerCost(device_type="A100-80GB", part=part, micro_batch=1, seq_len=256, forward_s=f, backward_s=2 * f,
                       activation_bytes=1e6) for part, f in (("layer", 1e-3), ("embedding", 1e-5), ("head", 5e-4))]
    prof = Profile(device_types=[MeasuredDeviceType(name="A100-80GB", catalog_name="A100-80GB", count=8,
                                                    memory_bytes=80 * 2**30, matmul_tflops={"bf16": 250.0})],
                   nodes=[ProfileNode(name="gpu-host", devices={"A100-80GB": 8})],
                   links=[ProfileLink(a="gpu-host", b="gpu-host", bandwidth_GBps=150.0, latency_s=5e-6)],
                   layers=[LayerTable(model="g", config=cfg.model_dump(mode="json"), costs=costs, dtype="bf16")])
    doc = {"kind": "poseidon", "cluster": {"gpus": {"A100-80GB": 16}, "gpus_per_node": 8,
                                           "inter_node": {"bandwidth_GBps": 25, "latency_s": 1e-5}},
           "model": cfg.model_dump(), "global_batch": 16, "seq_len": 256}
    prob = P.with_profile(P.PoseidonProblem.model_validate(doc), prof)
    assert [n.name for n in prob.cluster.nodes] == ["A100-80GB-0", "A100-80GB-1"]
    assert prob.cluster.capacity() == {"A100-80GB": 16}
    assert prob.cluster.intra_link("A100-80GB-1").bandwidth_GBps == 150.0  # the profiled node's link
    assert prob.cluster.inter_node.bandwidth_GBps == 25  # as declared: the profile measured no inter-node link
    assert prob.cluster.type_of("A100-80GB").peak("bf16") == 250.0 and prob.layer_costs.slowdowns == {"A100-80GB": 1.0}


# ---- 4. the pipeline runtime's per-call overhead, measured by the profiler -----------------------

def _with_stage_calls(profile: Profile, forward_s: float, backward_s: float) -> Profile:
    tables = [t.model_copy(update={"stage_call_forward_s": forward_s, "stage_call_backward_s": backward_s})
              for t in profile.layers]
    return profile.model_copy(update={"layers": tables})


@pytest.mark.parametrize("interleave", [1, 2])
def test_the_stage_call_overhead_is_added_once_per_forward_and_backward_call(interleave: int) -> None:
    deep = TINY.model_copy(update={"num_layers": 8})
    plain = P.with_profile(two_types(deep), cpu_profile(deep, emulate=SLOW2X))
    over = P.with_profile(two_types(deep), _with_stage_calls(cpu_profile(deep, emulate=SLOW2X), 0.001, 0.003))
    assert over.layer_costs.stage_call_forward_s == 0.001 and over.layer_costs.stage_call_backward_s == 0.003
    shapes = [P.StageShape("cpu", 1, 1, (0,), ("cpu0",)), P.StageShape("cpu-slow2x", 1, 1, (1,), ("cpu0",))]
    for layers in ([6, 2], [2, 6], [4, 4]):  # the same per stage whatever its layer count
        a = P.evaluate(P.CostModel(plain), shapes, layers, 2, interleave=interleave)
        b = P.evaluate(P.CostModel(over), shapes, layers, 2, interleave=interleave)
        for s, factor in enumerate((1.0, 2.0)):  # an emulated type sleeps in proportion to the whole call
            assert b.stages[s].forward_s - a.stages[s].forward_s == pytest.approx(0.001 * factor, rel=1e-9)
            assert b.stages[s].backward_s - a.stages[s].backward_s == pytest.approx(0.003 * factor, rel=1e-9)
        # each chunk of an interleaved stage is a call of its own: v calls, each with the overhead once
        fa, ga = P.chunk_lists(P.CostModel(plain), shapes, layers, a.stages, [1, 1], interleave)
        fb, gb = P.chunk_lists(P.CostModel(over), shapes, layers, b.stages, [1, 1], interleave)
        for k in range(2 * interleave):
            factor = 1.0 if k % 2 == 0 else 2.0
            assert fb[k] - fa[k] == pytest.approx(0.001 * factor, rel=1e-9)
            assert gb[k] - ga[k] == pytest.approx(0.003 * factor, rel=1e-9)
        assert b.iteration_time_s > a.iteration_time_s


def test_a_plan_solved_with_the_overhead_states_it_and_check_recomputes_it() -> None:
    prob = P.with_profile(two_types(TINY), _with_stage_calls(cpu_profile(TINY, emulate=SLOW2X), 0.002, 0.004))
    plan = api.solve(prob, num_stages=2)
    assert plan.ok and api.check(prob, plan) == []
    plain = P.with_profile(two_types(TINY), cpu_profile(TINY, emulate=SLOW2X))
    assert api.check(plain, plan) != []  # the same plan's figures do not hold without the overhead
    # the plan round-trips through JSON with the overhead in its embedded problem's layer table
    again = P.PoseidonProblem.model_validate(json.loads(json.dumps(prob.document())))
    assert again.layer_costs.stage_call_backward_s == 0.004 and api.check(again, plan) == []


def test_cold_op_cost_is_measured_only_when_workers_outnumber_the_cores() -> None:
    from gpuplan.runtime.poseidon import measure_cold_op_s, runnable_config

    cfg, seq, _ = runnable_config(two_types(TINY))
    assert measure_cold_op_s(cfg, seq_len=seq, micro_batch=1, processes=2, cores=2) == (0.0, 0.0)  # nothing spawned
    fwd, bwd = measure_cold_op_s(cfg, seq_len=seq, micro_batch=1, processes=3, cores=1, window_s=0.2)
    # seconds of CPU time per call (a tiny block's call is well under 10 ms), never negative
    assert 0.0 <= fwd < 0.01 and 0.0 <= bwd < 0.01


def test_wake_delay_is_charged_only_to_a_stage_waiting_idle_for_its_input() -> None:
    from gpuplan.runtime.poseidon import contended_iteration_s, measure_wake_s, runnable_config

    args = ([1.0, 1.0], [2.0, 2.0], [0.0], [0.0, 0.0], 1, "1f1b", [1.0, 1.0], [1.0, 1.0])
    # one micro-batch: stage 1 waits for F0 (woken late), stage 0 waits for B1 (woken late)
    assert contended_iteration_s(*args) == pytest.approx(6.0)
    assert contended_iteration_s(*args, wake_s=0.25) == pytest.approx(6.5)
    # two micro-batches, stage 1 slow: stage 1's second forward input arrives while it is busy
    two = ([1.0, 3.0], [1.0, 3.0], [0.0], [0.0, 0.0], 2, "gpipe", [1.0, 1.0], [1.0, 1.0])
    record: list = []
    contended_iteration_s(*two, record=record, wake_s=0.25)
    starts = sorted(s for st, kind, s, e in record if st == 1 and kind == "F")
    assert starts == pytest.approx([1.25, 4.25])  # the first waited idle (+0.25), the second did not
    cfg, seq, _ = runnable_config(two_types(TINY))
    assert measure_wake_s(cfg, seq_len=seq, micro_batch=1, processes=2, cores=2) == 0.0  # nothing spawned


def test_late_sleep_is_charged_to_each_op_of_a_slowed_stage_only() -> None:
    """An emulated stage's sleep ends `sleep_s` late after every op; a stage at factor 1 never sleeps
    (times by hand); the overshoot measured on this process's core is small and not negative."""
    from gpuplan.runtime.poseidon import contended_iteration_s, sleep_overshoot_s

    # one micro-batch, stage 0 twice slower: F0 1 s CPU + 1 s sleep, F1 1 s, B1 2 s, B0 1 s CPU + 1 s sleep
    args = ([2.0, 1.0], [2.0, 2.0], [0.0], [0.0, 0.0], 1, "1f1b", [2.0, 1.0], [1.0, 1.0])
    assert contended_iteration_s(*args) == pytest.approx(7.0)
    assert contended_iteration_s(*args, sleep_s=0.1) == pytest.approx(7.2)
    plain = ([1.0, 1.0], [2.0, 2.0], [0.0], [0.0, 0.0], 1, "1f1b", [1.0, 1.0], [1.0, 1.0])
    assert contended_iteration_s(*plain, sleep_s=0.1) == pytest.approx(6.0)
    assert 0.0 <= sleep_overshoot_s(1e-4, naps=5) < 0.05
