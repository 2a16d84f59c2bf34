"""How long does the report of tonight's run take with a year of history, and how big is the store?

    python benchmarks/report_history.py [--nights 365] [--results 200] [--db PATH]

Builds a SQLite store of ``nights`` nightly runs of ``results`` results each (synthetic figures with
2% run-to-run noise), finishes the last run as the nightly flow does (``Store.finish_run``, then
``verdicts.store_verdicts``, which judges its results against the history once and stores the
verdicts), then times rendering its report, with those verdicts, its open regressions and its
plots, and prints the database size per nightly run. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
from sqlalchemy import insert

from replaybench.report import write_report
from replaybench.storage import Result, Run, Store
from replaybench.verdicts import store_verdicts


def build(store: Store, nights: int, results: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    configs = [(f"workload_{i // 10}", {"batch_size": 2 ** (i % 10), "dtype": "float32"}) for i in range(results // 2)]
    start = datetime(2025, 12, 2, 2, 0, tzinfo=timezone.utc)
    env = dict(gpu_name="NVIDIA H200", gpu_driver="580.159.04", cuda_version="13.0", torch_version="2.11.0")
    with store.engine.begin() as c:
        for night in range(nights):
            when = start + timedelta(days=night)
            run_id = c.execute(insert(Run).values(
                started_at=when, ended_at=when + timedelta(minutes=20), trigger="nightly", status="completed",
                environment={}, parameters={}, **env,
            )).inserted_primary_key[0]
            rows = []
            for k, (workload, params) in enumerate(configs):
                noise = np.exp(rng.normal(0, 0.02, 2))
                eager, graph = 40e-6 * (1 + k % 7) * noise[0], 6e-6 * (1 + k % 7) * noise[1]
                eager, graph = float(eager), float(graph)
                blocks = [float(b) for b in rng.normal(eager, eager * 0.01, 30)]
                common = dict(run_id=run_id, measured_at=when, workload=workload, params=params,
                              params_key=json.dumps(params, sort_keys=True, separators=(",", ":")), status="ok",
                              attempts=1, flags=[], health={}, throughput_blocks=30)
                kernels = 3.0 * (1 + k % 7)
                for mode, time_s, speedup in (("eager", eager, None), ("graph", graph, eager / graph)):
                    gpu = time_s * 0.2 if mode == "eager" else time_s * 0.98
                    rows.append({**common, "mode": mode, "throughput_s": time_s, "throughput_ci_low": time_s * 0.99,
                                 "throughput_ci_high": time_s * 1.01, "gpu_s": gpu, "gpu_ci_low": gpu * 0.995,
                                 "gpu_ci_high": gpu * 1.005, "speedup": speedup,
                                 "speedup_ci_low": speedup and speedup * 0.98, "speedup_ci_high": speedup and speedup * 1.02,
                                 # the speedup with the host's speed taken out: its own trend plot
                                 "normalised_speedup": speedup and speedup * 1.25,
                                 "normalised_speedup_ci_low": speedup and speedup * 1.25 * 0.97,
                                 "normalised_speedup_ci_high": speedup and speedup * 1.25 * 1.03,
                                 "kernels_per_iter": kernels, "samples": {"throughput": blocks}})
            c.execute(insert(Result.__table__), rows)
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--results", type=int, default=200)
    parser.add_argument("--db", default=os.path.join(tempfile.mkdtemp(), "history.db"))
    args = parser.parse_args()
    store = Store(f"sqlite:///{args.db}")
    started = time.perf_counter()
    last = build(store, args.nights, args.results)
    print(f"built {args.nights} nights x {args.results} results in {time.perf_counter() - started:.1f} s")
    size = Path(args.db).stat().st_size + sum(p.stat().st_size for p in Path(args.db).parent.glob("*.db-wal"))
    print(f"database: {size / 2**20:.1f} MiB, {size / args.nights / 2**10:.0f} KiB per nightly run")
    started = time.perf_counter()
    store.finish_run(last)
    store_verdicts(store, last)
    print(f"finishing the last run and judging its results against the history: {time.perf_counter() - started:.2f} s")
    out = Path(args.db).parent / "reports"
    for attempt in range(2):
        started = time.perf_counter()
        path, text = write_report(store, last, out)
        print(f"report of the last run with verdicts and plots: {time.perf_counter() - started:.2f} s ({path})")
    print(f"verdicts in that report: {text.count('SAME')} SAME, {text.count('SLOWER')} SLOWER, {text.count('FASTER')} FASTER")


if __name__ == "__main__":
    main()
