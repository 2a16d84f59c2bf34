"""The nightly suite as users run it, through a real Prefect server and process workers, timed.

    python benchmarks/through_workers.py [--gpus 0] [--shards N] [--time-budget S] [--processes N]
                                         [--precision P] [-w NAME ...] [--out DIR]

Starts `prefect server`, creates the pool, limits and queues (`replaybench setup`), registers the
deployments of prefect.yaml (`prefect deploy --all`), starts one `replaybench worker` per entry of
``--gpus`` and triggers the ``nightly`` deployment with ``--shards`` (default: one per worker).
Then prints, from the store and the Prefect API:
- wall time from the trigger to the final state, and the run's own wall time (start to finish);
- time spent measuring (each config's wall time in the measuring pool, summed over configs) and the
  orchestration overhead = wall time - measuring time, from the trigger and within the run (for
  one worker; target <= 10%), with the Prefect overhead per task (task run time - measuring time
  of its config);
- for several workers on one GPU (``--gpus 0,0``): whether the shards' measurements overlapped in
  time (they must not: the GPU's strict concurrency limit serialises them).
Run it twice, with ``--gpus 0`` and ``--gpus 0,1``, to get the wall-time ratio of two workers to one.
``--precision 0.001`` makes each measurement take its whole time budget, as the noisy eager figures
of a GPU host mostly do.
This is a benchmark, not a test: it prints figures and targets, and never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.prefect_server import background, prefect_server  # noqa: E402


def cli(args: list[str], env: dict, timeout: float = 300) -> str:
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="0", help="one worker per entry; repeat an index to share a GPU")
    parser.add_argument("--shards", type=int, help="default: one per worker")
    parser.add_argument("--time-budget", type=float, help="default: the flow's")
    parser.add_argument("--processes", type=int, help="default: the flow's")
    parser.add_argument("--precision", type=float, help="target relative half-width (default: the flow's)")
    parser.add_argument("-w", "--workload", action="append", default=[])
    parser.add_argument("--out", help="keep the database, report, logs and a JSON summary here")
    args = parser.parse_args()
    gpus = args.gpus.split(",")
    shards = args.shards or len(gpus)
    out = Path(args.out or tempfile.mkdtemp(prefix="through-workers-"))
    out.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{out / 'replaybench.db'}"

    with ExitStack() as stack:
        api = stack.enter_context(prefect_server(out))
        env = {
            **os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(out), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "REPLAYBENCH_HOME": str(REPO), "REPLAYBENCH_DB_URL": db, "REPLAYBENCH_REPORTS_DIR": str(out / "reports"),
        }
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "REPLAYBENCH_DB_URL")})
        cli([sys.executable, "-m", "replaybench.cli", "setup", "--pool", "gpu", "--gpus", ",".join(sorted(set(gpus)))], env)
        cli([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], env)
        for i, gpu in enumerate(gpus):
            stack.enter_context(background(
                [sys.executable, "-m", "replaybench.cli", "worker", "--pool", "gpu", "--gpu", gpu], env, out / f"worker{i}.log"))

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName
        from prefect.deployments import run_deployment

        parameters = {"time_budget_s": args.time_budget, "processes": args.processes, "workloads": args.workload}
        parameters = {k: v for k, v in parameters.items() if v is not None}
        if args.precision is not None:
            parameters["precision"] = args.precision
        print(f"{len(gpus)} worker(s) on GPU(s) {args.gpus}, {shards} shard(s), parameters {parameters}", flush=True)
        triggered = time.monotonic()
        parent = run_deployment("replaybench/nightly", parameters={"parameters": parameters, "shards": shards},
                                timeout=24 * 3600, poll_interval=2)
        end_to_end = time.monotonic() - triggered
        with get_client(sync_client=True) as client:
            flow_runs = [parent] + (client.read_flow_runs(flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(like_="shard-"))) if shards > 1 else [])
            task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[f.id for f in flow_runs])))

    from replaybench.storage import Store

    run = Store(db).run()
    configs = {}
    for r in run.results:  # one entry per config: its modes share the measuring clock
        configs[(r.workload, r.params_key)] = r
    measuring = {k: (r.health or {}).get("measuring_s") or 0.0 for k, r in configs.items()}
    run_wall = (run.ended_at - run.started_at).total_seconds()
    total_measuring = sum(measuring.values())
    print(f"parent flow run {parent.state.name}; run {run.id} {run.status}; {len(configs)} configs, "
          f"{sum(r.status == 'ok' for r in run.results)}/{len(run.results)} mode results ok")
    print(f"wall time, trigger to final state: {end_to_end:.1f} s; run start to finish: {run_wall:.1f} s")
    from replaybench.workload import BenchConfig

    measuring_by_label = {BenchConfig(r.workload, r.params).label: measuring[k] for k, r in configs.items()}
    per_task = [(t.end_time - t.start_time).total_seconds() - measuring_by_label[t.name]
                for t in task_runs if t.start_time and t.end_time and t.name in measuring_by_label]
    summary = {
        "workers": len(gpus), "gpus": args.gpus, "shards": shards, "configs": len(configs), "run_id": run.id,
        "run_status": run.status, "end_to_end_s": end_to_end, "run_wall_s": run_wall, "measuring_s": total_measuring,
        "results_ok": sum(r.status == "ok" for r in run.results), "results": len(run.results),
    }
    if len(set(gpus)) == len(gpus) == 1 or shards == 1:
        summary["overhead_share"] = (end_to_end - total_measuring) / end_to_end
        summary["overhead_share_in_run"] = (run_wall - total_measuring) / run_wall
        print(f"measuring {total_measuring:.1f} s; orchestration overhead (wall - measuring) "
              f"{end_to_end - total_measuring:.1f} s = {summary['overhead_share']:.1%} of the wall time from the trigger "
              f"(target <= 10%), {run_wall - total_measuring:.1f} s = {summary['overhead_share_in_run']:.1%} "
              "of the run's own wall time (without worker pick-up, flow start-up and the report)")
    if per_task:
        summary["prefect_per_task_s"] = statistics.median(per_task)
        print(f"Prefect overhead per task (task run time - measuring time), median over {len(per_task)} tasks: "
              f"{statistics.median(per_task) * 1e3:.0f} ms (max {max(per_task) * 1e3:.0f} ms)")
    if len(gpus) > len(set(gpus)):  # workers sharing a GPU: did their measurements overlap?
        spans = []
        for f in flow_runs[1:]:
            ts = [(t.start_time, t.end_time) for t in task_runs if t.flow_run_id == f.id and t.start_time and t.end_time]
            if ts:
                spans.append((min(a for a, _ in ts), max(b for _, b in ts), f.name, f.start_time))
        spans.sort()
        overlaps = sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
        summary["shard_overlaps"] = overlaps
        for start, end, name, began in spans:
            print(f"  {name}: flow run started {began:%H:%M:%S}, measuring from {start:%H:%M:%S.%f} to {end:%H:%M:%S.%f}")
        print(f"shards whose measurements overlapped in time on the shared GPU: {overlaps} (must be 0)")
    print("GPUs named in the results:", sorted({r.gpu or "-" for r in run.results}))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"database, report and logs in {out}")


if __name__ == "__main__":
    main()
