"""The engine on the CPU: what CI can run. CUDA paths are in test_gpu.py."""

import numpy as np
import pytest
import torch

from replaybench.analysis import HOST_ELASTICITY, STANDARD_REFERENCE_S
from replaybench.engine import measure
from replaybench.prepare import compare
from replaybench.workload import BenchConfig, load_registry

SEED = BenchConfig("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128})


def test_seed_mlp_on_cpu_measures_eager_and_skips_graph(quick):
    result = measure(SEED, quick.model_copy(update={"force_cpu": True}), load_registry())
    eager, graph = result.mode("eager"), result.mode("graph")
    assert result.device == "cpu"
    assert eager.status == "ok"
    t = eager.throughput
    # One process: the figure is the median of its undisturbed blocks, bracketed by its interval
    # (from half the budget on, rounds may stop before min_units: stats.StoppingRule).
    kept = np.asarray(t.blocks)[np.asarray(t.kept)]
    assert t.n == kept.size >= 1 and len(t.blocks) == len(t.kept) == t.per_process[0]
    assert t.value == pytest.approx(float(np.median(kept)))
    assert t.ci_low <= t.value <= t.ci_high
    assert 1e-7 < t.value < 1e-1
    assert eager.latency.value > 0 and eager.iters_per_block >= 1
    # The host reference was timed around every unit.
    assert len(result.host.before[0]) == len(result.host.after[0]) == len(t.blocks) and result.host.base_s > 0
    scale = (STANDARD_REFERENCE_S / result.host.base_s) ** HOST_ELASTICITY  # eager at standard host speed
    assert eager.host_normalised.value == pytest.approx(t.value * scale, rel=0.5)
    # GPU-only metrics are not applicable on the CPU: absent, never zero.
    assert eager.gpu is None and eager.host_enqueue is None and eager.launch_overhead_s is None
    assert graph.status == "skipped" and graph.reason == "no CUDA device"
    assert graph.throughput is None and graph.speedup is None


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


def test_host_synchronisation_is_found_before_capture(fault_registry):
    from replaybench.prepare import find_host_sync

    registry = fault_registry
    with torch.inference_mode():
        sync = registry.get("fault_host_sync").build({"batch_size": 1}, torch.device("cpu"), torch.float32)
        assert ".item()" in find_host_sync(sync.fn, sync.inputs)
        seed = registry.get("seed_mlp").build({"batch_size": 1, "width": 128}, torch.device("cpu"), torch.float32)
        assert find_host_sync(seed.fn, seed.inputs) is None
        bool_use = find_host_sync(lambda x: x * 2 if bool(x.sum() > 0) else x, (torch.ones(3),))
        assert "aten::is_nonzero: a tensor used as a Python bool" == bool_use
        assert "boolean-mask" in find_host_sync(lambda x: x[x > 0], (torch.randn(8),))
