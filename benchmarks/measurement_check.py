"""Checks replaybench's own measurement against independent references, on a CUDA machine.

    python benchmarks/measurement_check.py [--flow-runs 3] [--db sqlite:///check.db]

Prints, for seed_mlp:
1. the engine's eager throughput against a bare eager loop timed right after, in the same pinned
   process (target: within 5%): the engine's throughput series (eager and graph blocks interleaved,
   as in a run), then the bare loop, nine times over; the median of the nine differences, and
   their range. Also both timed block for block, interleaved;
2. the engine's GPU time per iteration against triton.testing.do_bench_cudagraph in the same
   process (target: within 10%);
3. how long each mode was timed, and whether its interval met the precision target;
4. with --flow-runs N: N full flow runs through the CLI, and the run-to-run spread of graph replay
   time (target: within 3%) and whether the speedup intervals overlap.
This is a benchmark, not a test: it prints figures and the targets, and never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from replaybench import health
from replaybench.engine import Session, measure, time_block
from replaybench.results import MeasureSettings
from replaybench.workload import BenchConfig, load_registry


def bare_eager_loop(model, x, blocks: int = 20, iters: int = 200) -> float:
    """The seed tutorial's method, fixed: median over blocks of back-to-back calls, seconds/iter."""
    times = []
    with torch.inference_mode():
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
        for _ in range(blocks):
            start = time.perf_counter()
            for _ in range(iters):
                model(x)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def engine_series_then_bare(config, settings, registry, pairs: int = 9) -> list[tuple[float, float]]:
    """(engine's eager median, bare loop's) for ``pairs`` pairs: the engine's timed units as in a
    run (eager and graph blocks in turn, for the time budget), then a bare eager loop right after."""
    session = Session(config, settings, registry)
    session.prepare()
    model, (x,) = session.prepared.built.fn, session.prepared.built.inputs
    out = []
    for _ in range(pairs):
        blocks, start = [], time.perf_counter()
        while time.perf_counter() - start < settings.time_budget_s:
            blocks += session.round(2, ["eager", "graph"])["units"]["eager"]
        out.append((statistics.median(blocks), bare_eager_loop(model, x)))
    return out


def engine_vs_bare_interleaved(config, settings, registry, blocks: int = 40, iters: int = 200):
    session = Session(config, settings, registry)
    session.prepare()
    p = session.prepared
    model, (x,) = p.built.fn, p.built.inputs
    engine, bare = [], []
    with torch.inference_mode():
        for _ in range(blocks):
            engine.append(time_block(p.calls["eager"], iters, p.sync, False))
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                model(x)
            torch.cuda.synchronize()
            bare.append((time.perf_counter() - start) / iters)
    return statistics.median(engine), statistics.median(bare)


def unrolled_graph_gpu_time(model, x, calls: int = 100, replays: int = 20) -> float:
    """GPU time per call of ``calls`` calls captured into one graph: kernels back to back with no
    per-launch GPU cost, which is what do_bench_cudagraph measures. The engine's GPU time of one
    replay (or one eager call) per launch exceeds it by the GPU-side cost of each launch."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                model(x)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def row(name, ours, reference, target):
    diff = ours / reference - 1
    verdict = "meets" if abs(diff) <= target else "MISSES"
    print(f"{name:<44} {ours * 1e6:10.2f} us {reference * 1e6:10.2f} us {diff:+8.1%}  {verdict} target {target:.0%}")


def in_process_checks(settings: MeasureSettings) -> dict:
    core = health.pin_to_core(None)
    registry = load_registry()
    config = BenchConfig("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128})
    result = measure(config, settings, registry)
    eager, graph = result.mode("eager"), result.mode("graph")
    for m in result.modes:
        if m.status != "ok":
            print(f"{m.mode}: {m.status}: {m.reason}")
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, measuring core {core}")
    print(f"{'':<44} {'replaybench':>13} {'reference':>13} {'diff':>8}")

    built = registry.get("seed_mlp").build(config.params, torch.device("cuda"), torch.float32)
    model, (x,) = built.fn, built.inputs
    pairs = engine_series_then_bare(config, settings, registry)
    diffs = sorted(ours / bare - 1 for ours, bare in pairs)
    ours, bare = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    median_diff = statistics.median(diffs)
    print(f"{'eager throughput vs bare loop right after':<44} {ours * 1e6:10.2f} us {bare * 1e6:10.2f} us {median_diff:+8.1%}  "
          f"{'meets' if abs(median_diff) <= 0.05 else 'MISSES'} target 5% (median of {len(pairs)} pairs; "
          f"pairs from {diffs[0]:+.1%} to {diffs[-1]:+.1%})")
    # Host speed drifts over seconds on a VM: compare the engine's own timed block with the bare
    # loop interleaved, block for block, so that drift hits both.
    ours, theirs = engine_vs_bare_interleaved(config, settings, registry)
    row("engine's timed block vs bare loop, interleaved", ours, theirs, 0.05)

    try:
        from triton.testing import do_bench_cudagraph

        with torch.inference_mode():
            ref_ms = do_bench_cudagraph(lambda: model(x), rep=200, return_mode="median")
        ref = ref_ms / 1e3
        unrolled = unrolled_graph_gpu_time(model, x)
        row("unrolled graph (kernels only) vs do_bench_cudagraph", unrolled, ref, 0.10)
        if eager.gpu:
            row("eager GPU time vs do_bench_cudagraph", eager.gpu.value, ref, 0.10)
        if graph.gpu:
            row("graph GPU time vs do_bench_cudagraph", graph.gpu.value, ref, 0.10)
    except Exception as exc:  # triton missing or failing: say so, keep going
        print(f"do_bench_cudagraph unavailable: {type(exc).__name__}: {exc}")

    print()
    print(f"{'mode':<8} {'throughput us':>14} {'+/-':>7} {'blocks':>7} {'met':>5} {'latency us':>11} {'GPU us':>8} {'enqueue us':>11} {'kernels':>8} {'speedup':>22}")
    for m in result.modes:
        if m.status != "ok":
            continue
        t = m.throughput
        sp = f"{m.speedup:.2f} [{m.speedup_ci_low:.2f}, {m.speedup_ci_high:.2f}]" if m.speedup else ""
        print(
            f"{m.mode:<8} {t.value * 1e6:14.2f} {t.rel_halfwidth:7.2%} {t.n:7d} {str(t.precision_met):>5} "
            f"{m.latency.value * 1e6:11.2f} {(m.gpu.value * 1e6 if m.gpu else float('nan')):8.2f} "
            f"{(m.host_enqueue.value * 1e6 if m.host_enqueue else float('nan')):11.2f} {m.kernels_per_iter or 0:8.1f} {sp:>22}"
        )
    if graph.status == "ok":
        print(
            f"graph costs: capture {graph.capture_s * 1e3:.2f} ms, first replay {graph.first_replay_s * 1e3:.3f} ms, "
            f"pool {graph.graph_pool_bytes / 2**20:.1f} MiB, break-even after {graph.break_even_replays:.0f} replays"
        )
    # Time to the precision target: blocks x iterations x time per iteration, per mode.
    for m in result.modes:
        if m.status == "ok":
            spent = len(m.throughput.blocks) * m.iters_per_block * m.throughput.value
            print(f"{m.mode}: {len(m.throughput.blocks)} blocks, {spent:.2f} s of throughput measuring; target met: {m.throughput.precision_met}")
    print(f"whole config, all metrics: {result.measuring_s:.2f} s; flags: {[f for m in result.modes for f in m.flags]}")
    return json.loads(result.model_dump_json())


def flow_runs(n: int, db: str) -> None:
    from replaybench.storage import Store

    ids = []
    for i in range(n):
        out = subprocess.run(
            [sys.executable, "-m", "replaybench.cli", "run", "-w", "seed_mlp", "--db", db],
            capture_output=True, text=True,
        )
        print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:])
        store = Store(db)
        ids.append(store.run().id)
    store = Store(db)
    graph, speedups = [], []
    for run_id in ids:
        rows = {r.mode: r for r in store.run(run_id).results}
        g = rows["graph"]
        graph.append(g.throughput_s)
        speedups.append((g.speedup, g.speedup_ci_low, g.speedup_ci_high))
        e = rows["eager"]
        print(f"run {run_id}: eager {e.throughput_s * 1e6:.2f} us [{e.throughput_ci_low * 1e6:.2f}, {e.throughput_ci_high * 1e6:.2f}], "
              f"graph {g.throughput_s * 1e6:.3f} us, speedup {g.speedup:.2f} [{g.speedup_ci_low:.2f}, {g.speedup_ci_high:.2f}], "
              f"cores {e.health.get('cpu_cores')}, flags {e.flags}")
    spread = (max(graph) - min(graph)) / statistics.median(graph)
    overlap = max(lo for _, lo, _ in speedups) <= min(hi for _, _, hi in speedups)
    print(f"graph replay run-to-run spread {spread:.2%} (target <= 3%); speedup intervals overlap: {overlap}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flow-runs", type=int, default=0)
    parser.add_argument("--db", default="sqlite:///measurement_check.db")
    parser.add_argument("--json", help="write the in-process result here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("measurement_check needs a CUDA device")
    result = in_process_checks(MeasureSettings())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if args.flow_runs:
        # The flow's measuring process pins itself too; let it have the core this one used.
        os.sched_setaffinity(0, set(range(os.cpu_count())))
        flow_runs(args.flow_runs, args.db)


if __name__ == "__main__":
    main()
