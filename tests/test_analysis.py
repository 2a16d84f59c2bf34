"""Combining measuring processes and deriving speedups: known inputs, known answers."""

import numpy as np
import pytest

from replaybench.analysis import combine, derive
from replaybench.results import ConfigResult, ModeResult
from replaybench.stats import speedup_ci, summarize_groups

from .helpers import series


def process_result(eager_us, graph_us, core, rng, graph_status="ok"):
    eager = list(eager_us * 1e-6 * (1 + 0.01 * rng.standard_normal(40)))
    graph = list(graph_us * 1e-6 * (1 + 0.002 * rng.standard_normal(40)))
    modes = [ModeResult(mode="eager", status="ok", throughput=series(eager))]
    if graph_status == "ok":
        modes.append(ModeResult(mode="graph", status="ok", throughput=series(graph), capture_s=0.01, first_replay_s=0.001))
    else:
        modes.append(ModeResult(mode="graph", status="failed", phase="check", reason="output 0 differs from eager"))
    return ConfigResult(workload="w", params={}, device="cuda", modes=modes, cpu_core=core, measuring_s=1.0)


def test_hierarchical_interval_carries_process_to_process_variation():
    rng = np.random.default_rng(0)
    eager = [60 + rng.standard_normal(50), 72 + rng.standard_normal(50), 91 + rng.standard_normal(50)]
    graph = [6.8 + 0.01 * rng.standard_normal(50) for _ in range(3)]
    flat_point, flat_lo, flat_hi = speedup_ci(np.concatenate(eager), np.concatenate(graph))
    point, lo, hi = speedup_ci(eager, graph)
    per_process = [np.median(e) / np.median(g) for e, g in zip(eager, graph)]
    assert point == pytest.approx(np.median(per_process)) and flat_lo <= flat_point <= flat_hi
    # The flat interval pretends all blocks came from one process: far too narrow.
    assert flat_hi - flat_lo < 0.5 * (max(per_process) - min(per_process))
    assert lo <= min(per_process) * 1.05 and hi >= max(per_process) * 0.95
    s = summarize_groups(eager)
    assert s.ci_low < 65 and s.ci_high > 85 and s.n == 150


def test_combine_pools_blocks_and_derive_flags_host_noise():
    rng = np.random.default_rng(1)
    parts = [process_result(e, 6.8, core, rng) for e, core in ((60, 15), (72, 14), (91, 13))]
    result = derive(combine(parts, precision=0.01))
    eager, graph = result.mode("eager"), result.mode("graph")
    assert eager.throughput.per_process == [40, 40, 40]
    assert eager.throughput.blocks == [b for p in parts for b in p.mode("eager").throughput.blocks]
    assert result.cpu_cores == [15, 14, 13] and result.measuring_s == 3.0
    assert graph.speedup == pytest.approx(np.median([np.median(e) / np.median(g) for e, g in
                                                     zip(eager.throughput.groups(), graph.throughput.groups())]))
    assert eager.throughput.median == pytest.approx(np.median([np.median(g) for g in eager.throughput.groups()]))
    assert graph.speedup_ci_low < 60 / 6.8 * 1.05 and graph.speedup_ci_high > 91 / 6.8 * 0.95
    assert any("medians differ by" in f and "3 measuring processes" in f for f in eager.flags)
    assert not any("medians differ" in f for f in graph.flags)
    assert graph.break_even_replays == pytest.approx(0.011 / (eager.throughput.median - graph.throughput.median))


def test_a_failure_in_any_process_is_the_result():
    rng = np.random.default_rng(2)
    parts = [process_result(60, 6.8, 1, rng), process_result(61, 6.8, 0, rng, graph_status="failed")]
    result = derive(combine(parts, precision=0.01))
    graph = result.mode("graph")
    assert graph.status == "failed" and graph.speedup is None and "differs" in graph.reason
    assert result.mode("eager").throughput.per_process == [40, 40]


def test_one_process_is_left_as_measured():
    rng = np.random.default_rng(3)
    part = process_result(45, 6.5, 7, rng)
    result = derive(combine([part], precision=0.01))
    assert result.cpu_cores == [7]
    assert result.mode("graph").speedup == pytest.approx(
        np.median(part.mode("eager").throughput.blocks) / np.median(part.mode("graph").throughput.blocks)
    )


def test_few_processes_get_the_student_t_interval_of_their_own_figures():
    # Three processes, each precise on its own, disagreeing: the interval of the speedup is the t
    # interval (2 degrees of freedom) of the three per-process speedups on log scale, which a
    # bootstrap over three processes cannot reach.
    rng = np.random.default_rng(3)
    eager = [e + 0.01 * rng.standard_normal(60) for e in (36.0, 41.0, 55.0)]
    graph = [g + 0.001 * rng.standard_normal(60) for g in (7.0, 6.9, 7.2)]
    per_process = np.log([np.median(e) / np.median(g) for e, g in zip(eager, graph)])
    half = 4.302653 * per_process.std(ddof=1) / np.sqrt(3)
    _, lo, hi = speedup_ci(eager, graph)
    assert lo == pytest.approx(np.exp(per_process.mean() - half), rel=1e-4)
    assert hi == pytest.approx(np.exp(per_process.mean() + half), rel=1e-4)
    assert lo < 36 / 7.0 * 0.9 and hi > 55 / 7.2 * 1.1  # beyond the range of the processes
    s = summarize_groups(eager)
    medians = np.log([np.median(e) for e in eager])
    assert s.ci_high == pytest.approx(np.exp(medians.mean() + 4.302653 * medians.std(ddof=1) / np.sqrt(3)), rel=1e-4)



def test_each_process_weighs_alike_whatever_its_block_count():
    # The stopping rule ends a precise process early: block counts of 10, 200 and 20. Pooling the
    # blocks would let the 200 blocks of the slow process decide; each process is one witness.
    rng = np.random.default_rng(5)
    graph = [6.5 + 0.001 * rng.standard_normal(10), 6.9 + 0.001 * rng.standard_normal(200),
             6.6 + 0.001 * rng.standard_normal(20)]
    eager = [40 + 0.01 * rng.standard_normal(k) for k in (10, 200, 20)]
    s = summarize_groups(graph)
    assert s.median == pytest.approx(6.6, abs=0.01) and s.n == 230
    assert np.median(np.concatenate(graph)) == pytest.approx(6.9, abs=0.01)  # what pooling would say
    point, lo, hi = speedup_ci(eager, graph)
    assert point == pytest.approx(40 / 6.6, rel=1e-3) and lo <= 40 / 6.9 and hi >= 40 / 6.5


def test_an_imprecise_process_is_named_in_the_flag():
    rng = np.random.default_rng(6)
    parts = [process_result(40, 6.8, core, rng) for core in (15, 14, 13)]
    noisy = list(40e-6 * (1 + 0.3 * rng.standard_normal(12)))
    parts[1].modes[0] = ModeResult(mode="eager", status="ok", throughput=series(noisy, met=False))
    eager = derive(combine(parts, precision=0.01)).mode("eager")
    expected = summarize_groups(noisy).rel_halfwidth
    assert f"precision target not met in one of 3 measuring processes: median +/- {expected:.1%} after 12 blocks" in eager.flags
