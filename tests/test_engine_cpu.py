"""The engine on the CPU: what CI can run. CUDA paths are in test_gpu.py."""

import numpy as np
import pytest
import torch

from replaybench.analysis import combine, derive
from replaybench.engine import compare, measure
from replaybench.results import ConfigResult, ModeResult, Series
from replaybench.stats import summarize
from replaybench.workload import BenchConfig, load_registry

SEED = BenchConfig("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128})


def test_seed_mlp_on_cpu_measures_eager_and_skips_graph(quick):
    result = measure(SEED, quick.model_copy(update={"force_cpu": True}), load_registry())
    eager, graph = result.mode("eager"), result.mode("graph")
    assert result.device == "cpu"
    assert eager.status == "ok"
    t = eager.throughput
    assert t.n == len(t.blocks) >= quick.min_blocks
    assert t.median == pytest.approx(float(np.median(t.blocks)))
    assert t.ci_low <= t.median <= t.ci_high
    assert 1e-7 < t.median < 1e-1
    assert eager.latency.median > 0 and eager.iters_per_block >= 1
    # GPU-only metrics are not applicable on the CPU: absent, never zero.
    assert eager.gpu is None and eager.host_enqueue is None and eager.launch_overhead_s is None
    assert graph.status == "skipped" and graph.reason == "no CUDA device"
    assert graph.throughput is None and graph.speedup is None
    assert result.host_calibration_s > 0


def test_build_error_fails_every_mode_with_the_reason(quick, fault_registry):
    result = measure(BenchConfig("fault_build_error", {"batch_size": 1, "dtype": "float32"}), quick, fault_registry)
    for m in result.modes:
        assert (m.status, m.phase) == ("failed", "build")
        assert "weights file missing" in m.reason


def test_forward_error_fails_every_mode_with_the_reason(quick, fault_registry):
    result = measure(BenchConfig("fault_forward_error", {"batch_size": 1, "dtype": "float32"}), quick, fault_registry)
    for m in result.modes:
        assert (m.status, m.phase) == ("failed", "forward")
        assert "eager forward failed: RuntimeError" in m.reason


def test_compare_detects_a_difference_and_accepts_equal_outputs():
    a = torch.ones(4)
    assert compare((a,), (a.clone(),)) == (None, 0.0)
    why, diff = compare((a,), (a + 1e-3,))
    assert why.startswith("output 0 differs from eager") and diff == pytest.approx(1e-3, rel=1e-3)
    assert compare((a,), (a, a))[0] == "2 outputs, expected 1"


def _series(blocks):
    s = summarize(blocks)
    return Series(**s.__dict__, precision_met=True, blocks=blocks)


def test_speedup_and_break_even_come_from_the_measured_medians():
    rng = np.random.default_rng(0)
    eager_blocks = list(40e-6 + 1e-6 * rng.standard_normal(30))
    graph_blocks = list(8e-6 + 0.1e-6 * rng.standard_normal(30))
    result = ConfigResult(
        workload="w", params={}, device="cuda",
        modes=[
            ModeResult(mode="eager", status="ok", throughput=_series(eager_blocks)),
            ModeResult(mode="graph", status="ok", throughput=_series(graph_blocks), capture_s=0.010, first_replay_s=0.002),
        ],
    )
    derive(result)
    graph = result.mode("graph")
    expected = np.median(eager_blocks) / np.median(graph_blocks)
    assert graph.speedup == pytest.approx(expected)
    assert graph.speedup_ci_low < expected < graph.speedup_ci_high
    saved = np.median(eager_blocks) - np.median(graph_blocks)
    assert graph.break_even_replays == pytest.approx(0.012 / saved)
    assert result.mode("eager").speedup is None


def test_a_mode_that_failed_gets_no_speedup_and_noise_is_flagged():
    noisy = [1e-5, 1e-5, 2e-5, 3e-5, 1e-5, 4e-5, 1e-5, 1e-5]
    result = ConfigResult(
        workload="w", params={}, device="cuda",
        health_before={"throttled": True, "throttle_reasons": ["hardware slowdown"]},
        modes=[
            ModeResult(mode="eager", status="ok", throughput=_series(noisy)),
            ModeResult(mode="graph", status="failed", reason="output 0 differs from eager"),
        ],
    )
    derive(result)
    assert result.mode("graph").speedup is None
    flags = " ".join(result.mode("eager").flags)
    assert "high spread" in flags and "GPU throttled before measuring: hardware slowdown" in flags


def test_host_synchronisation_is_found_before_capture(fault_registry):
    from replaybench.engine import find_host_sync

    registry = fault_registry
    with torch.inference_mode():
        sync = registry.get("fault_host_sync").build({"batch_size": 1}, torch.device("cpu"), torch.float32)
        assert ".item()" in find_host_sync(sync.fn, sync.inputs)
        seed = registry.get("seed_mlp").build({"batch_size": 1, "width": 128}, torch.device("cpu"), torch.float32)
        assert find_host_sync(seed.fn, seed.inputs) is None
        bool_use = find_host_sync(lambda x: x * 2 if bool(x.sum() > 0) else x, (torch.ones(3),))
        assert "aten::is_nonzero: a tensor used as a Python bool" == bool_use
        assert "boolean-mask" in find_host_sync(lambda x: x[x > 0], (torch.randn(8),))
