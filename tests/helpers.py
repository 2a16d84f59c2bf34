"""Results with known figures, for storage and report tests; the benchmarks' modules for the tests
that hold their real data to the product's statistics."""

import importlib.util
import os
import signal
import time
from pathlib import Path

import numpy as np

from flows.supervise import alive
from replaybench.results import ConfigResult, HostReference, ModeResult, Series
from replaybench.stats import typical


def series(blocks, met=True):
    """A one-process Series of these blocks, every one kept."""
    e = typical([blocks])
    q1, q3 = np.percentile(blocks, [25, 75])
    return Series(value=e.value, ci_low=e.ci_low, ci_high=e.ci_high, n=len(blocks), minimum=min(blocks),
                  maximum=max(blocks), iqr=float(q3 - q1), precision_met=met, blocks=list(blocks),
                  per_process=[len(blocks)], kept=[True] * len(blocks), process_values=[e.value])


def known_result(workload="seed_mlp", eager_us=45.0, graph_us=6.5, reason=None):
    eager = [eager_us * 1e-6 * f for f in (0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.0, 0.99, 1.01, 1.0)]
    graph = [graph_us * 1e-6 * f for f in (0.995, 1.0, 1.0, 1.005, 1.0, 1.0, 0.999, 1.001, 1.0, 1.0)]
    modes = [
        ModeResult(mode="eager", status="ok", throughput=series(eager), latency=series([x * 1.2 for x in eager]),
                   gpu=series([7.5e-6] * 10), host_enqueue=series([40e-6] * 10), kernels_per_iter=3.0, iters_per_block=200),
    ]
    if reason:
        modes.append(ModeResult(mode="graph", status="failed", phase="check", reason=reason))
    else:
        modes.append(ModeResult(mode="graph", status="ok", throughput=series(graph), latency=series([x * 2 for x in graph]),
                                gpu=series([6.4e-6] * 10), host_enqueue=series([4e-6] * 10), kernels_per_iter=3.0,
                                speedup=eager_us / graph_us, speedup_ci_low=eager_us / graph_us - 0.1,
                                speedup_ci_high=eager_us / graph_us + 0.1, normalised_speedup=7.5, normalised_speedup_ci_low=7.2,
                                normalised_speedup_ci_high=7.9, capture_s=0.0123, first_replay_s=0.0004,
                                graph_pool_bytes=3 * 2**20, break_even_replays=330.0, iters_per_block=1500))
    return ConfigResult(workload=workload, params={"batch_size": 1, "dtype": "float32", "width": 128}, device="NVIDIA H200",
                        modes=modes, cpu_core=3, host=HostReference(base_s=0.01, share_disturbed=0.25, slowest=2.0))


def two_runs_one_slowed(store, env: dict) -> tuple[int, int]:
    """Two finished nightly runs of seed_mlp and deep_mlp; the second's deep_mlp is a third slower,
    eager and graph alike, with its GPU time unchanged."""
    first = store.create_run("nightly", {}, env)
    for w in ("seed_mlp", "deep_mlp"):
        store.add_result(first, known_result(workload=w, eager_us=45.0, graph_us=6.5))
    store.finish_run(first)
    second = store.create_run("nightly", {}, env)
    store.add_result(second, known_result(workload="seed_mlp", eager_us=45.0, graph_us=6.5))
    store.add_result(second, known_result(workload="deep_mlp", eager_us=60.0, graph_us=9.0))
    store.finish_run(second)
    return first, second


# What compare_runs reads between those two runs.
SLOWED_VERDICTS = {("seed_mlp", "eager", "eager throughput"): "SAME", ("seed_mlp", "graph", "throughput"): "SAME",
                   ("seed_mlp", "graph", "GPU time"): "SAME", ("deep_mlp", "eager", "eager throughput"): "SLOWER",
                   ("deep_mlp", "graph", "throughput"): "SLOWER", ("deep_mlp", "graph", "GPU time"): "SAME"}


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark(name: str):
    """A module of benchmarks/, which keeps the real data its figures come from beside it."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def children(pid: int) -> set[int]:
    """Every live descendant of ``pid``, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid``, started in a session of its own, its process group, and every
    descendant that left the group: Prefect starts its temporary server in a session of its own,
    which a kill of the group alone would leave running after the test. The group is stopped first,
    so that the tree holds still while it is read."""
    try:
        os.killpg(pid, signal.SIGSTOP)
    except ProcessLookupError:  # the group is gone; its descendants may not be
        pass
    for child in children(pid):
        try:
            if os.getpgid(child) != pid:
                os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def outliving(pids: set[int], within_s: float) -> set[int]:
    """Those of ``pids`` still running after up to ``within_s`` seconds of waiting for them to end."""
    deadline = time.monotonic() + within_s
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_all(pids: set[int]) -> None:
    """SIGKILL each of ``pids`` still running (a failed test's leftovers)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
