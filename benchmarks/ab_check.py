"""Does an A/B run tell a real difference from none? One `replaybench ab` run through the CLI.

    python benchmarks/ab_check.py [--out DIR] [--suite default|noisy|none] [--limit S]
    python benchmarks/ab_check.py --recompute ab.db     # every A/B run stored there, again

Variant A loads ``benchmarks/ab_probe`` beside the shipped workloads; B is the same with AB_PROBE=on,
which changes only the probe. One run measures, in this order:

1. **The probe's ``change=kernel``**: one more kernel per call in B. Graph time per call and GPU
   time should read slower.
2. **The probe's ``change=host``**: about 10% more host work per call in B. Eager should read
   slower, graph time per call and GPU time not.
3. **The default suite** (``--suite``), for which A and B are identical. Prints the share of configs
   read "no difference" on every metric, how many intervals hold no change, and the relative
   half-width of the B/A intervals per metric (targets: >= 95% of configs, every interval,
   <= 1% for graph time per call and GPU time, <= 5% for eager time per call).

Everything lands in ``--out`` (database, reports, the variants file, every row as JSON in
``ab_check.json``). ``--limit`` interrupts the run after S seconds (SIGINT, as Ctrl-C would): the
run is stored ``interrupted`` with the configs it finished. ``--recompute`` recomputes the
comparisons of every A/B run in a store from its stored units, with the current
``replaybench.ab.ratios`` (the H200 runs are kept in benchmarks/data: h200-ab.db, h200-ab-captures.db). A benchmark, not a test: it
prints figures and targets and never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "benchmarks" / "ab_probe"
NOISY = ["seed_mlp", "gpt_multi_step", "resnet_small", "rnn_unrolled", "recommender", "sdpa_attention"]

VARIANTS = f"""
[variants.probe]
workloads = "{PROBE}"
[variants.probe-on]
workloads = "{PROBE}"
env = {{ AB_PROBE = "on" }}
"""
EXPECTED = {"kernel": "graph time per call and GPU time slower", "host": "eager slower; graph time per call and GPU time not"}


def environment(out: Path) -> dict:
    return {**os.environ, "REPLAYBENCH_DB_URL": f"sqlite:///{out / 'ab.db'}", "REPLAYBENCH_REPORTS_DIR": str(out / "reports"),
            "REPLAYBENCH_VARIANTS": str(out / "variants.toml")}


def replaybench_args(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "replaybench.cli", *args]


def replaybench(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(replaybench_args(out, *args), cwd=REPO, env=environment(out), capture_output=True, text=True)


def ab_run(out: Path, extra: list[str], limit_s: float | None = None) -> dict:
    """The `replaybench ab` run; its rows read back from the store, also when ``limit_s`` cut it short."""
    started = time.monotonic()
    with open(out / "ab.log", "w") as log:
        process = subprocess.Popen(replaybench_args(out, "ab", "probe", "probe-on", *extra), cwd=REPO,
                                   env=environment(out), stdout=log, stderr=subprocess.STDOUT)
        try:
            status = f"exit {process.wait(timeout=limit_s)}"
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)  # as Ctrl-C: stored interrupted, with what it finished
            try:
                status = f"interrupted after {limit_s:.0f} s, exit {process.wait(timeout=30)}"
            except subprocess.TimeoutExpired:
                process.kill()
                status = f"killed: still running 30 s after SIGINT at {limit_s:.0f} s"
    wall = time.monotonic() - started
    runs = json.loads(replaybench(out, "runs", "--format", "json", "--limit", "1").stdout)
    rows = json.loads(replaybench(out, "compare", str(runs[0]["id"]), "--format", "json").stdout)["comparisons"] if runs else []
    configs = len({(r["workload"], json.dumps(r["params"])) for r in rows})
    print(f"\n== B=probe-on against A=probe, {configs} config(s), {wall:.0f} s, {status}")
    print_rows(rows)
    return {"rows": rows, "wall_s": wall, "status": status, "configs": configs}


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"  {r['workload']:<20} {json.dumps(r['params'], sort_keys=True)[:60]:<60} {r['mode']:<6} {r['metric']:<14} {r['text']}")


def summarize(rows: list[dict]) -> None:
    for change, expected in EXPECTED.items():
        print(f"\nprobe, change={change} (expected: {expected}):")
        print_rows([r for r in rows if r["workload"] == "ab_probe" and r["params"].get("change") == change])
    summarize_identical([r for r in rows if r["workload"] != "ab_probe"])


def halfwidth(r: dict) -> float | None:
    return (r["ci_high"] - r["ci_low"]) / 2 / r["ratio"] if r["ratio"] else None


def summarize_identical(rows: list[dict]) -> None:
    configs: dict[str, list[dict]] = {}
    for r in rows:
        configs.setdefault(r["workload"] + json.dumps(r["params"], sort_keys=True), []).append(r)
    same = sum(all(r["verdict"] == "no difference" for r in rs) for rs in configs.values())
    holding = [r for r in rows if r["ratio"] is not None and r["ci_low"] <= 1 <= r["ci_high"]]
    measured = [r for r in rows if r["ratio"] is not None]
    print(f"\nidentical: {same} of {len(configs)} configs 'no difference' on every metric ({same / max(len(configs), 1):.0%}; "
          f"target >= 95%); {len(holding)} of {len(measured)} intervals hold no change (target: all)")
    for mode, metric, target in (("eager", "time per call", "<= 5%"), ("graph", "time per call", "<= 1%"),
                                 ("graph", "GPU time", "<= 1%"), ("graph", "speedup", "none set")):
        widths = [halfwidth(r) for r in measured if r["mode"] == mode and r["metric"] == metric]
        widths = [w for w in widths if w is not None]
        if widths:
            print(f"  {mode} {metric}: B/A half-width median {statistics.median(widths):.2%}, max {max(widths):.2%} "
                  f"(target {target}); {sum(w <= float(target.strip('<= %')) / 100 for w in widths) if '%' in target else '-'}"
                  f" of {len(widths)} within")
    for r in measured:
        if not r["ci_low"] <= 1 <= r["ci_high"]:
            print(f"  excludes no change: {r['workload']} {json.dumps(r['params'], sort_keys=True)} {r['mode']} {r['metric']}: {r['text']}")


def stored_comparisons(path: str | os.PathLike) -> list[tuple[object, list[dict]]]:
    """Every A/B run in a SQLite file, oldest first, with its comparisons recomputed from its stored
    units by the current ``replaybench.ab``: [(run, rows as `compare --format json` gives its comparisons)].
    Read from a copy, brought to the current schema: the file itself is never changed."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.db"
        shutil.copyfile(path, copy)
        return _comparisons(f"sqlite:///{copy}")


def _comparisons(url: str) -> list[tuple[object, list[dict]]]:
    sys.path.insert(0, str(REPO))
    from replaybench.ab import comparisons, ratios
    from replaybench.analysis import stored_units
    from replaybench.storage import Store

    store = Store(url)
    found = []
    for run in reversed([r for r in store.runs(1000) if r.trigger == "ab"]):
        run = store.run(run.id)
        params = run.parameters or {}
        rows: dict[tuple, dict] = {}
        for r in run.results:
            if r.status == "ok":
                rows.setdefault((r.workload, r.params_key, r.variant), {})[r.mode] = r
        out = []
        for (workload, key, variant), a in rows.items():
            b = rows.get((workload, key, "B"))
            if variant != "A" or not b or set(a) != set(b):
                continue
            timed = [m for m in ("eager", "graph", "compile", "compile_cudagraphs") if m in a]
            pairs = len(stored_units(a))
            gpu = [{m: _groups(x, "gpu") for m, x in side.items() if x.samples.get("gpu")} for side in (a, b)]
            finishes = tuple([{"gpu": {m: (g[i], []) for m, g in groups.items()}} for i in range(pairs)] for groups in gpu)
            found_here = comparisons(ratios(stored_units(a), stored_units(b), timed, finishes), params.get("min_effect", 0.05), pairs)
            out += [{"workload": workload, "params": json.loads(key), **c.model_dump()} for c in found_here]
        found.append((run, out))
    store.engine.dispose()
    return found


def recompute(path: str) -> None:
    for run, rows in stored_comparisons(path):
        params = run.parameters or {}
        print(f"\n== run {run.id}: {params.get('b')} against {params.get('a')}, {len(rows)} comparison(s)")
        print_rows(rows)
        if (params.get("a"), params.get("b")) == ("probe", "probe-on"):
            summarize(rows)


def _groups(row, metric: str) -> list[list[float]]:
    sizes = row.samples["per_process"][metric]
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [row.samples[metric][x:y] for x, y in zip(bounds, bounds[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="ab-check", help="directory for the database, reports and JSON")
    parser.add_argument("--suite", choices=("default", "noisy", "none"), default="default")
    parser.add_argument("--time-budget", type=float, default=None, help="per config, both variants (default: ab's)")
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--limit", type=float, default=None, metavar="S", help="interrupt the run after S seconds")
    parser.add_argument("--recompute", metavar="DB", help="recompute the A/B runs stored in this SQLite file, and stop")
    args = parser.parse_args()
    if args.recompute:
        return recompute(args.recompute)
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.toml").write_text(VARIANTS)
    sys.path.insert(0, str(REPO))
    from replaybench.workload import load_registry

    suite = {"default": load_registry().names(), "noisy": NOISY, "none": []}[args.suite]
    extra = [*(["--time-budget", str(args.time_budget)] if args.time_budget else []),
             *(["--processes", str(args.processes)] if args.processes else []),
             *(w for name in ["ab_probe", *suite] for w in ("-w", name))]
    run = ab_run(out, extra, args.limit)
    summarize(run["rows"])
    (out / "ab_check.json").write_text(json.dumps(run, indent=1))
    print(f"\nwall time: {run['wall_s']:.0f} s for {run['configs']} config(s)")


if __name__ == "__main__":
    main()
