"""Is graph replay's process effect a property of the process or of one capture? (CUDA only.)

    python benchmarks/graph_process_effect.py [--out FILE] [--processes 6] [--captures 6]

In an A/B run on the H200 (benchmarks/data/h200-ab.db), graph time per call of one config differed
between measuring processes by up to ~4% (pointwise_chain: processes in two states ~4% apart),
far more than within a process; it bounds how narrow a B/A interval over a few pairs can be. Here
``--processes`` processes, pinned one per core and alive together as in a run, each build and
capture every config ``--captures`` times (a fresh model, inputs and graph pool each time), then
take turns (a shared lock, as a run's rounds do) timing every capture's replay in rounds.

It prints, per config, the spread of capture medians within a process and of process medians
(each the median over its captures) across processes. If captures within one process spread as
widely as processes do, the state belongs to a capture, and a process that times several captures
of a config averages it away; if captures within a process agree, the process carries it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = [("pointwise_chain", {"batch_size": 1, "dtype": "float32", "blocks": 4}),
           ("deep_mlp", {"batch_size": 1, "dtype": "float32", "depth": 2}),
           ("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128}),
           ("rnn_unrolled", {"batch_size": 1, "dtype": "float32", "cell": "gru", "steps": 8})]
ROUNDS = 12
BLOCK_S = 0.01


def measure(index: int, core: int, captures: int, lock, ready, queue) -> None:
    os.sched_setaffinity(0, {core})
    sys.path.insert(0, str(REPO))
    import torch

    from replaybench.engine import iterations_per_block, time_block
    from replaybench.workload import load_registry

    registry = load_registry()
    graphs: dict[str, list] = {}
    keep = []
    with torch.inference_mode():
        for name, params in CONFIGS:
            workload = registry.get(name)
            graphs[name] = []
            for _ in range(captures):
                built = workload.build(params, torch.device("cuda"), getattr(torch, params["dtype"]))
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(3):
                        built.fn(*built.inputs)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    out = built.fn(*built.inputs)
                torch.cuda.synchronize()
                keep.append((built, out))
                graphs[name].append(graph)
    ready.wait()
    times: dict[str, list[list[float]]] = {name: [[] for _ in range(captures)] for name in graphs}
    sync = torch.cuda.synchronize
    for _ in range(ROUNDS):
        with lock:
            for name, gs in graphs.items():
                for k, graph in enumerate(gs):
                    n = iterations_per_block(graph.replay, sync, BLOCK_S, False)
                    times[name][k].append(time_block(graph.replay, n, sync, False))
    queue.put({"process": index, "core": core, "times": times})


def spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return 100 * (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="graph_process_effect.json")
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--captures", type=int, default=6)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    lock, ready, queue = ctx.Lock(), ctx.Barrier(args.processes), ctx.Queue()
    cores = sorted(os.sched_getaffinity(0))[1:args.processes + 1]
    procs = [ctx.Process(target=measure, args=(i, core, args.captures, lock, ready, queue)) for i, core in enumerate(cores)]
    started = time.monotonic()
    for p in procs:
        p.start()
    results = sorted((queue.get() for _ in procs), key=lambda r: r["process"])
    for p in procs:
        p.join()
    Path(args.out).write_text(json.dumps(results))
    print(f"{len(procs)} processes x {args.captures} captures, {ROUNDS} rounds, {time.monotonic() - started:.0f} s")
    for name, _ in CONFIGS:
        medians = [[statistics.median(t) for t in r["times"][name]] for r in results]
        overall = statistics.median(m for ms in medians for m in ms)
        print(f"\n{name}: capture medians, % from the median of all ({overall * 1e6:.2f} us)")
        for r, ms in zip(results, medians):
            print(f"  process {r['process']} core {r['core']:>2}: " + " ".join(f"{100 * (m / overall - 1):+5.1f}" for m in ms)
                  + f"   spread within {spread(ms):.1f}%")
        per_process = [statistics.median(ms) for ms in medians]
        print(f"  spread of process medians (over captures): {spread(per_process):.1f}%; "
              f"of first captures alone: {spread([ms[0] for ms in medians]):.1f}%; "
              f"median spread within a process: {statistics.median(spread(ms) for ms in medians):.1f}%")


if __name__ == "__main__":
    main()
