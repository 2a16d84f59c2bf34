"""Where eager timing noise comes from on a GPU host: time, core, or process.

Three experiments, each writing JSON lines (one record per timed block) to ``--out``:

1. ``hop``: one measuring process times eager and graph blocks of ``seed_mlp`` and a fixed CPU
   reference block, moving its CPU affinity across ``--hop-cores`` every ``--hop-s`` seconds, while
   light probe processes on ``--probe-cores`` time the same CPU reference block every 20 ms. If the
   eager level follows the core, the noise is a core effect; if slow episodes appear on every core
   at once, it is the host's speed over time.
2. ``trace``: for each config, ``--processes`` measuring processes on their own cores, each with
   the config built and its graph captured once, are asked in turn for short rounds (reference,
   eager, graph, eager, graph), for ``--trace-s`` seconds per config: the raw material to simulate
   stopping rules and interval methods offline.

Nothing of replaybench's timing path is used beyond building and capturing, so the records are
the bare facts. ``benchmarks/data/`` keeps the records of H200 runs with the command that made them;
``--summarize FILE`` prints what they say (per-core eager, and whether slow episodes of one core
coincide with those of others) without measuring anything.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REF_ADDS = 500


def reference_block(torch_mod, a, b) -> float:
    """Seconds for REF_ADDS in-place additions of one-element CPU tensors: the dispatcher path an
    eager launch also takes, without the GPU."""
    start = time.perf_counter()
    for _ in range(REF_ADDS):
        a.add_(b)
    return time.perf_counter() - start


def probe(core: int, seconds: float, queue) -> None:
    os.sched_setaffinity(0, {core})
    import torch

    torch.set_num_threads(1)
    a, b = torch.zeros(1), torch.ones(1)
    for _ in range(50):
        reference_block(torch, a, b)
    rows, end = [], time.time() + seconds
    while time.time() < end:
        t = time.time()
        rows.append({"exp": "probe", "core": core, "t": t, "ref": reference_block(torch, a, b)})
        time.sleep(0.02)
    queue.put(rows)


def prepared(workload: str, params: dict):
    """A replaybench Measurement with the config built, warmed up and its graph captured and checked."""
    import torch

    from replaybench.engine import Measurement
    from replaybench.results import MeasureSettings
    from replaybench.workload import BenchConfig, load_registry

    m = Measurement(BenchConfig(workload, params), MeasureSettings(), load_registry())
    m.built = m.workload.build(dict(params), m.device, m.dtype)
    with torch.inference_mode():
        m.prepare_eager()
        m.prepare_graph()
    if not m.cuda:  # a dry run on a machine without a GPU: eager stands in for the graph
        m.calls["graph"] = m.calls["eager"]
    elif m.results["graph"].status != "ok":
        raise RuntimeError(f"{workload}: graph not prepared: {m.results['graph']}")
    return m


def block_iters(m, call, target_s=0.005) -> int:
    import torch

    with torch.inference_mode():
        return m.iterations_per_block(call, target_s, per_call_sync=False)


def hop(cores: list[int], hop_s: float, seconds: float, queue) -> None:
    os.sched_setaffinity(0, {cores[0]})
    import torch

    torch.set_num_threads(1)
    m = prepared("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128})
    ne, ng = block_iters(m, m.calls["eager"]), block_iters(m, m.calls["graph"])
    a, b = torch.zeros(1), torch.ones(1)
    rows, start = [], time.time()
    with torch.inference_mode():
        while time.time() - start < seconds:
            core = cores[int((time.time() - start) / hop_s) % len(cores)]
            if os.sched_getaffinity(0) != {core}:
                os.sched_setaffinity(0, {core})
            t = time.time()
            ref = reference_block(torch, a, b)
            eager = m.time_block(m.calls["eager"], ne, False)
            graph = m.time_block(m.calls["graph"], ng, False)
            rows.append({"exp": "hop", "core": core, "t": t, "ref": ref, "eager": eager, "graph": graph})
    queue.put(rows)


def trace_worker(core: int, conn) -> None:
    os.sched_setaffinity(0, {core})
    import torch

    torch.set_num_threads(1)
    a, b = torch.zeros(1), torch.ones(1)
    m = None
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "prepare":
            m = None
            torch.cuda.empty_cache()
            m = prepared(msg[1], msg[2])
            ne, ng = block_iters(m, m.calls["eager"]), block_iters(m, m.calls["graph"])
            conn.send(("ready", ne, ng))
            continue
        out = {"t": time.time(), "ref": reference_block(torch, a, b), "eager": [], "graph": []}
        with torch.inference_mode():
            for _ in range(2):
                out["eager"].append(m.time_block(m.calls["eager"], ne, False))
                out["graph"].append(m.time_block(m.calls["graph"], ng, False))
        conn.send(out)


TRACE_CONFIGS = [
    ("seed_mlp", {"batch_size": 1, "dtype": "float32", "width": 128}),
    ("gpt_multi_step", {"batch_size": 1, "cache_len": 128, "dtype": "float32", "layers": 2, "steps": 4}),
    ("resnet_small", {"batch_size": 1, "dtype": "float32", "image": 32}),
    ("rnn_unrolled", {"batch_size": 1, "cell": "gru", "dtype": "float32", "steps": 8}),
    ("recommender", {"batch_size": 1, "dtype": "float32", "tables": 4}),
    ("sdpa_attention", {"batch_size": 1, "dtype": "float32", "seq_len": 16}),
    ("deep_mlp", {"batch_size": 1, "depth": 8, "dtype": "float32"}),
    ("mobile_block", {"batch_size": 1, "dtype": "float32", "image": 32}),
]


def summarize(path: str) -> None:
    import gzip
    from collections import defaultdict

    import numpy as np

    opener = gzip.open if path.endswith(".gz") else open
    rows = [json.loads(line) for line in opener(path, "rt")]
    hop = [r for r in rows if r["exp"] == "hop"]
    base = np.percentile([r["ref"] for r in hop], 10)
    print(f"hop: {len(hop)} blocks; the reference block {base * 1e3:.3f} ms undisturbed (10th percentile)")
    for core in sorted({r["core"] for r in hop}):
        mine = [r for r in hop if r["core"] == core]
        calm = [r["eager"] for r in mine if r["ref"] < 1.5 * base]
        slow = [r for r in mine if r["ref"] >= 1.5 * base]
        print(f"  core {core}: eager median {np.median([r['eager'] for r in mine]) * 1e6:.1f} us, undisturbed "
              f"{np.median(calm) * 1e6:.1f} us; disturbed {len(slow) / len(mine):.0%} of blocks, eager there "
              f"{np.median([r['eager'] for r in slow]) * 1e6 if slow else float('nan'):.1f} us, reference "
              f"{np.median([r['ref'] for r in slow]) / base if slow else float('nan'):.2f}x")
    # Slow episodes, 0.5 s at a time: does a slow hop core coincide with slow probe cores?
    t0 = hop[0]["t"]
    bins: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["exp"] in ("hop", "probe") and r["t"] >= t0:
            bins[int((r["t"] - t0) / 0.5)][(r["exp"], r["core"] if r["exp"] == "probe" else 0)].append(r["ref"])
    probes = sorted({r["core"] for r in rows if r["exp"] == "probe"})
    probe_base = {c: np.percentile([r["ref"] for r in rows if r["exp"] == "probe" and r["core"] == c], 10) for c in probes}
    hop_slow = {b: np.median(v[("hop", 0)]) >= 1.5 * base for b, v in bins.items() if v.get(("hop", 0))}
    for c in probes:
        slow = {b: np.median(v[("probe", c)]) >= 1.5 * probe_base[c] for b, v in bins.items() if v.get(("probe", c))}
        both = [b for b in hop_slow if b in slow]
        when_hop_slow = np.mean([slow[b] for b in both if hop_slow[b]]) if any(hop_slow[b] for b in both) else float("nan")
        print(f"  probe core {c}: slow in {np.mean([slow[b] for b in both]):.0%} of half-seconds, "
              f"in {when_hop_slow:.0%} of those when the measuring core was slow")
    traces = defaultdict(list)
    for r in rows:
        if r["exp"] == "trace":
            traces[r["workload"]].append(r)
    for workload, rounds in traces.items():
        ref = np.array([r["ref"] for r in rounds])
        eager = np.array([np.median(r["eager"]) for r in rounds])
        share = np.mean(ref >= 1.5 * np.percentile(ref, 10))
        print(f"trace {workload}: {len(rounds)} rounds, disturbed {share:.0%}, "
              f"corr(log reference, log eager) {np.corrcoef(np.log(ref), np.log(eager))[0, 1]:.2f}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hop-cores", default="15,14,13,12")
    ap.add_argument("--probe-cores", default="11,10,3,2")
    ap.add_argument("--hop-s", type=float, default=1.5)
    ap.add_argument("--hop-total-s", type=float, default=36)
    ap.add_argument("--trace-cores", default="15,14,13,12")
    ap.add_argument("--trace-s", type=float, default=16)
    ap.add_argument("--only", default="", help="comma-separated workloads of the trace (default: all)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = open(args.out, "w")

    def write(rows):
        for r in rows:
            out.write(json.dumps(r) + "\n")
        out.flush()

    # 1. hop + probes
    queue = ctx.Queue()
    hop_cores = [int(c) for c in args.hop_cores.split(",")]
    procs = [ctx.Process(target=hop, args=(hop_cores, args.hop_s, args.hop_total_s, queue))]
    procs += [ctx.Process(target=probe, args=(int(c), args.hop_total_s + 20, queue)) for c in args.probe_cores.split(",") if c]
    for p in procs:
        p.start()
    for _ in procs:
        rows = queue.get()
        write(rows)
        print(f"{rows[0]['exp']} core {rows[0]['core']}: {len(rows)} records", flush=True)
    for p in procs:
        p.join()

    # 2. traces
    cores = [int(c) for c in args.trace_cores.split(",")]
    pipes, workers = [], []
    for c in cores:
        parent, child = ctx.Pipe()
        w = ctx.Process(target=trace_worker, args=(c, child), daemon=True)
        w.start()
        pipes.append(parent)
        workers.append(w)
    only = set(filter(None, args.only.split(",")))
    for workload, params in TRACE_CONFIGS:
        if only and workload not in only:
            continue
        ready = []
        for p in pipes:  # one at a time: preparing uses the GPU
            p.send(("prepare", workload, params))
            ready.append(p.recv())
        rows, start, i = [], time.time(), 0
        while time.time() - start < args.trace_s:
            k = i % len(pipes)
            pipes[k].send(("round",))
            r = pipes[k].recv()
            rows.append({"exp": "trace", "workload": workload, "params": params, "proc": k, "core": cores[k], "round": i,
                         "iters": ready[k][1:], **r})
            i += 1
        write(rows)
        e = sorted(x for r in rows for x in r["eager"])
        g = sorted(x for r in rows for x in r["graph"])
        print(f"trace {workload}: {i} rounds, eager median {e[len(e) // 2] * 1e6:.1f} us, graph median {g[len(g) // 2] * 1e6:.2f} us", flush=True)
    for p in pipes:
        p.send(None)
    for w in workers:
        w.join(10)
    out.close()


if __name__ == "__main__":
    main()
