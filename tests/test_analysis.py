"""From timed units to reported figures: pairing, the estimand, the disturbance filter, failures
and flags, on known inputs."""

import numpy as np
import pytest

from replaybench.analysis import HOST_ELASTICITY, STANDARD_REFERENCE_S, Units, assemble, figures, host_normalised_speedup, interim
from replaybench.results import MeasureSettings, ModeResult
from replaybench.stats import typical
from replaybench.workload import BenchConfig

CONFIG = BenchConfig("w", {"batch_size": 1, "dtype": "float32"})
SETTINGS = MeasureSettings()
REF = 0.5e-3


def units(eager, graph, refs=None):
    """One process's units: eager and graph blocks (s/iter) and per unit a reference time (both
    references around it)."""
    u = Units()
    refs = [REF] * len(eager) if refs is None else refs
    for e, g, r in zip(eager, graph, refs):
        u.add({"ref": [r, r], "eager": [e], "graph": [g]})
    return u


def report(**modes):
    ok = {m: ModeResult(mode=m, status="ok", iters_per_block=100) for m in ("eager", "graph")}
    ok["graph"].capture_s, ok["graph"].first_replay_s = 0.010, 0.002
    return {"modes": {**ok, **modes}, "timed": ["eager", "graph"], "failed": False, "device": "cuda",
            "cpu_core": 1, "process_unusable": False}


def finish(eager_gpu=7e-6, graph_gpu=6e-6):
    return {"modes": {}, "latency": None, "gpu": {"eager": ([eager_gpu] * 4, [40e-6] * 4), "graph": ([graph_gpu] * 4, [4e-6] * 4)},
            "kernels": 3.0, "health_after": None}


def test_the_speedup_is_paired_unit_by_unit_so_drift_common_to_both_blocks_cancels():
    # The host's speed drifts 1.5x over the units; each unit's eager and graph feel it alike.
    drift = np.linspace(1.0, 1.5, 40)
    u = units(40e-6 * drift, 5e-6 * drift)
    f = figures([u], ["eager", "graph"])
    assert f.speedup["graph"].value == pytest.approx(8.0)
    assert f.speedup["graph"].rel_halfwidth < 1e-9  # every unit says 8.0
    # Unpaired, the ratio of the two medians' intervals would not know that.
    assert f.throughput["eager"].rel_halfwidth > 0.05


def test_the_figure_is_the_geometric_mean_of_the_processes_own_figures():
    procs = [units([e * 1e-6] * 12, [6.5e-6] * 12) for e in (40, 44, 50)]
    f = figures(procs, ["eager", "graph"])
    assert f.throughput["eager"].value == pytest.approx(np.exp(np.mean(np.log([40e-6, 44e-6, 50e-6]))))
    assert f.speedup["graph"].value == pytest.approx(np.exp(np.mean(np.log([40 / 6.5, 44 / 6.5, 50 / 6.5]))))
    expected = typical([[40 / 6.5], [44 / 6.5], [50 / 6.5]])
    assert (f.speedup["graph"].ci_low, f.speedup["graph"].ci_high) == pytest.approx((expected.ci_low, expected.ci_high))


def test_the_host_normalised_speedup_stays_put_when_the_whole_host_runs_slower_and_the_speedup_does_not():
    # Two runs of one config: in the second the whole host runs slower for the config's seconds, the
    # reference 1.6x and eager, as measured on the H100 and H200 VMs, by that to the power
    # HOST_ELASTICITY (every unit: the filter sees nothing disturbed); graph replay, paced by the GPU,
    # as before.
    rng = np.random.default_rng(2)

    def run(host):
        eager = 40e-6 * host ** HOST_ELASTICITY
        return [units(eager * (1 + 0.01 * rng.standard_normal(12)), [5e-6] * 12, [REF * host] * 12) for _ in range(4)]

    fast, slow = figures(run(1.0), ["eager", "graph"]), figures(run(1.6), ["eager", "graph"])
    assert slow.speedup["graph"].value / fast.speedup["graph"].value == pytest.approx(1.6 ** HOST_ELASTICITY, rel=0.02)
    assert not slow.speedup["graph"].ci_low <= fast.speedup["graph"].value <= slow.speedup["graph"].ci_high
    a, b = fast.normalised_speedup["graph"], slow.normalised_speedup["graph"]
    assert b.value == pytest.approx(a.value, rel=0.02) and b.ci_low <= a.value <= b.ci_high
    # its scale: the speedup on a host whose reference block takes STANDARD_REFERENCE_S
    assert a.value == pytest.approx(8.0 * (STANDARD_REFERENCE_S / REF) ** HOST_ELASTICITY, rel=0.02)


def test_the_host_normalised_speedup_is_the_typical_process_median_of_eager_over_its_references_over_graph():
    # Per process: the median over every unit (disturbed ones too) of eager scaled to the standard
    # host by the geometric mean of the references around it, over the process's median graph block;
    # then ``typical``.
    procs = []
    for e, g in ((40e-6, 5e-6), (44e-6, 5.5e-6), (50e-6, 5e-6)):
        u = Units()
        u.add({"ref": [REF, 2 * REF, REF, REF], "eager": [e, 1.5 * e, e], "graph": [g, g, 1.01 * g]})
        procs.append(u)
    by_hand = []
    for u in procs:
        refs = np.sqrt(np.multiply(u.ref_before, u.ref_after))
        at_standard = np.asarray(u.blocks["eager"]) * (STANDARD_REFERENCE_S / refs) ** HOST_ELASTICITY
        by_hand.append(at_standard / np.median(u.blocks["graph"]))
    expected, got = typical(by_hand), host_normalised_speedup(procs, "graph")
    assert (got.value, got.ci_low, got.ci_high) == pytest.approx((expected.value, expected.ci_low, expected.ci_high))
    assert figures(procs, ["eager", "graph"]).normalised_speedup["graph"] == got
    assert host_normalised_speedup([Units()], "graph") is None


def test_a_mode_the_core_paces_gets_no_host_normalised_speedup():
    # compile blocks, and graph blocks that a slow core slowed, move with the host as eager does:
    # over the reference, their speedup would still carry the host's speed.
    procs = [units([40e-6, 40e-6, 40e-6, 60e-6], [5e-6, 5e-6, 5e-6, 7e-6], [REF, REF, REF, 2 * REF]) for _ in range(3)]
    for u in procs:
        u.blocks["compile"] = list(np.asarray(u.blocks["eager"]) / 2)
    f = figures(procs, ["eager", "graph", "compile"])
    assert set(f.speedup) == {"graph", "compile"} and f.normalised_speedup == {}
    steady = [units(list(u.blocks["eager"]), [5e-6] * 4, u.ref_before) for u in procs]
    assert set(figures(steady, ["eager", "graph"]).normalised_speedup) == {"graph"}


def test_units_timed_while_the_core_ran_slow_are_set_aside():
    rng = np.random.default_rng(0)
    n = 30
    slow = rng.random(n) < 0.4
    refs = np.where(slow, 2 * REF, REF) * (1 + 0.02 * rng.standard_normal(n))
    eager = np.where(slow, 60e-6, 40e-6)
    f = figures([units(eager, [5e-6] * n, refs)], ["eager", "graph"])
    assert f.masks[0].tolist() == (~slow).tolist()
    assert f.throughput["eager"].value == pytest.approx(40e-6)
    assert f.speedup["graph"].value == pytest.approx(8.0)


def test_a_process_disturbed_throughout_is_left_out_without_a_flag():
    clean = [units([40e-6] * 10, [5e-6] * 10) for _ in range(3)]
    stuck = units([60e-6] * 10, [5e-6] * 10, [2 * REF] * 10)
    result = assemble(CONFIG, SETTINGS, [report()] * 4, [*clean, stuck], [finish()] * 4, cpu_cores=[15, 14, 13, 12])
    eager = result.mode("eager")
    assert eager.throughput.value == pytest.approx(40e-6)
    assert len(eager.throughput.process_values) == 3
    assert eager.flags == []  # its interval rests on three witnesses, and says so by its width
    assert result.host.share_disturbed == pytest.approx(0.25)


def test_graph_replay_counts_every_process_where_eager_leaves_a_disturbed_one_out():
    # A process whose core ran slow throughout: eager and the speedup rest on the other three, graph
    # replay (paced by the GPU, its blocks unmoved) on all four.
    clean = [units([40e-6] * 10, [g] * 10) for g in (5.0e-6, 5.1e-6, 5.2e-6)]
    stuck = units([60e-6] * 10, [5.3e-6] * 10, [2 * REF] * 10)
    result = assemble(CONFIG, SETTINGS, [report()] * 4, [*clean, stuck], [finish()] * 4, cpu_cores=[15, 14, 13, 12])
    eager, graph = result.mode("eager"), result.mode("graph")
    assert len(eager.throughput.process_values) == 3 and len(graph.speedup_per_process) == 3
    assert graph.throughput.process_values == pytest.approx([5.0e-6, 5.1e-6, 5.2e-6, 5.3e-6])
    assert graph.throughput.value == pytest.approx(typical([[5.0e-6], [5.1e-6], [5.2e-6], [5.3e-6]]).value)
    assert all(graph.throughput.kept) and not all(eager.throughput.kept)


def test_a_graph_that_a_slow_core_slows_sets_its_disturbed_units_aside_as_eager_does():
    # Launches that outlast the kernels: the core's speed shows in graph replay too.
    procs = [units([40e-6, 40e-6, 40e-6, 60e-6], [5e-6, 5e-6, 5e-6, 7e-6], [REF, REF, REF, 2 * REF]) for _ in range(3)]
    procs.append(units([60e-6] * 4, [7e-6] * 4, [2 * REF] * 4))
    f = figures(procs, ["eager", "graph"])
    assert f.counted("graph") == (f.masks, f.used) and len(f.used) == 3
    assert f.throughput["graph"].value == pytest.approx(5e-6)
    # The same blocks, replay unmoved by the slow core: every unit of all four processes counts.
    steady = [units(list(np.asarray(u.blocks["eager"])), [5e-6] * 4, u.ref_before) for u in procs]
    assert len(figures(steady, ["eager", "graph"]).counted("graph")[1]) == 4


def test_when_every_unit_is_disturbed_every_unit_counts_and_the_flag_says_so():
    # Half the units of every process disturbed, leaving each fewer than three undisturbed ones.
    procs = [units([40e-6, 40e-6, 60e-6, 60e-6], [5e-6] * 4, [REF, REF, 2 * REF, 2 * REF]) for _ in range(4)]
    f = figures(procs, ["eager", "graph"])
    assert f.all_disturbed and f.masks[0].all()
    result = assemble(CONFIG, SETTINGS, [report()] * 4, procs, [finish()] * 4, cpu_cores=[1, 2, 3, 4])
    assert any("host disturbed throughout" in fl for fl in result.mode("eager").flags)
    assert result.host.share_disturbed == pytest.approx(0.5)


def test_assemble_reports_every_figure_and_the_break_even_point():
    rng = np.random.default_rng(1)
    procs = [units(40e-6 * (1 + 0.01 * rng.standard_normal(20)), 5e-6 * (1 + 0.001 * rng.standard_normal(20)))
             for _ in range(3)]
    result = assemble(CONFIG, SETTINGS, [report()] * 3, procs, [finish()] * 3, cpu_cores=[15, 14, 13], measuring_s=4.2)
    eager, graph = result.mode("eager"), result.mode("graph")
    assert result.cpu_cores == [15, 14, 13] and result.measuring_s == 4.2
    assert eager.throughput.per_process == [20, 20, 20] and len(eager.throughput.blocks) == 60
    assert graph.gpu.value == pytest.approx(6e-6) and eager.kernels_per_iter == 3.0
    assert graph.speedup == pytest.approx(figures(procs, ["eager", "graph"]).speedup["graph"].value)
    assert len(graph.speedup_per_process) == 3 and eager.host_normalised is not None
    # eager at standard host speed: on a host whose reference takes REF throughout, eager times
    # (STANDARD_REFERENCE_S / REF) to the power HOST_ELASTICITY
    scale = (STANDARD_REFERENCE_S / REF) ** HOST_ELASTICITY
    assert eager.host_normalised.value == pytest.approx(eager.throughput.value * scale, rel=1e-6)
    normalised = figures(procs, ["eager", "graph"]).normalised_speedup["graph"]
    assert (graph.normalised_speedup, graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high) == \
        pytest.approx((normalised.value, normalised.ci_low, normalised.ci_high))
    assert eager.normalised_speedup is None
    saved = eager.throughput.value - graph.throughput.value
    assert graph.break_even_replays == pytest.approx(0.012 / saved)
    assert graph.capture_s == 0.010


def test_a_failure_in_any_process_is_the_result_and_gets_no_speedup():
    failed = ModeResult(mode="graph", status="failed", phase="check", reason="output 0 differs from eager")
    second = report(graph=failed)
    second["failed"], second["timed"] = True, ["eager"]
    eager_only = [units([40e-6] * 10, [5e-6] * 10), units([41e-6] * 10, [5e-6] * 10)]
    for u in eager_only:
        del u.blocks["graph"]
    result = assemble(CONFIG, SETTINGS, [report(), second], eager_only, [finish(), finish()], cpu_cores=[1, 0])
    graph = result.mode("graph")
    assert graph.status == "failed" and graph.speedup is None and "differs" in graph.reason
    assert result.mode("eager").throughput.per_process == [10, 10]


def test_flags_say_what_the_intervals_do_not():
    rng = np.random.default_rng(2)
    procs = [units(lv * 1e-6 * (1 + 0.01 * rng.standard_normal(12)), [5e-6] * 12) for lv in (40, 52, 47)]
    first = report()
    first["health_before"] = {"throttled": True, "throttle_reasons": ["hardware slowdown"]}
    result = assemble(CONFIG, SETTINGS, [first, report(), report()], procs, [finish()] * 3, cpu_cores=[1, 2, 3])
    eager = result.mode("eager")
    assert "GPU throttled before measuring: hardware slowdown" in " ".join(eager.flags)
    # A wide interval says so itself: recorded, not flagged.
    assert not eager.throughput.precision_met and result.mode("graph").throughput.precision_met
    assert not [fl for fl in eager.flags + result.mode("graph").flags if "throttled" not in fl]


def test_interim_waits_for_every_process_and_counts_undisturbed_units():
    a, b = units([40e-6] * 8, [5e-6] * 8), Units()
    assert interim([a, b], ["eager", "graph"]) == ([], [])
    b = units([40e-6] * 6, [5e-6] * 6, [REF] * 4 + [2 * REF] * 2)
    estimates, kept = interim([a, b], ["eager", "graph"])
    assert kept == [8, 4] and len(estimates) == 3  # eager, graph and the speedup
