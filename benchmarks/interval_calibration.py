"""Are replaybench's intervals tight enough to act on, and honest? Repeated runs of a set of configs.

    python benchmarks/interval_calibration.py [--runs 5] [--subset noisy|default] [-w NAME ...]
                                              [--passes K] [--out results.json]
    python benchmarks/interval_calibration.py --summarize results.json [--as-passes K]

Each run is what a nightly does to its configs: a fresh pool of measuring processes (the default
run settings: processes, precision target, time budget), every config measured in turn. After
``--runs`` runs it prints, per config and overall:
- the relative half-width of each reported interval (speedup; eager and graph throughput; graph
  GPU time), the median over runs;
- coverage: the share of runs whose interval holds the median of all runs' point estimates;
- run-to-run spread of eager four ways: the reported figure (disturbed units set aside), all units
  counted, eager with the host's speed taken out (``eager_normalised``: eager at standard host
  speed, ``analysis.Units.at_standard_host``, as the file stored it or, with ``--recompute``, as
  this checkout computes it from the raw units; ``stats``' docstring says why the first), and
  eager at the run's typical host speed (the reported figure times the median over the run's configs
  of their undisturbed reference time, over this config's own: what the host's speed during this
  config's seconds added to it, taken out), and the median of each over the configs;
- wall time per config;
- the speedup's and eager's interval across nights (``history.across_nights``), each run's made
  with the other runs as its history (leave one out; five runs or more, as four earlier nights are
  the fewest whose noise estimate is worth a t quantile): its half-width, and the share of runs
  whose interval holds the median of all runs' point estimates.
With ``--passes K``, each run measures its configs K times over, each time with the budget divided
by K, and a config's figure is the geometric mean of its K passes with the t interval over them:
passes minutes apart witness host states that one config's seconds do not (the host's speed moves
for tens of seconds, on every core at once), which a single run's interval cannot hold. Runs with
raw units also print ``normalised_speedup``, the speedup with the host's speed taken out, as the
engine reports it (``analysis.host_normalised_speedup``), recomputed from those units.
``--as-passes K`` takes every K runs of a saved file as the passes of one run, for a first look;
``--passes-as-runs`` each pass of a saved file as a run of its own.
``--out`` keeps every run's figures (value and interval of each metric, per config) as JSON: the
night-to-night noise of ``benchmarks/regression_detector.py`` comes from such a file. This is a
benchmark, not a test: it prints figures and the targets, and never asserts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replaybench.analysis import Units, figures  # noqa: E402
from replaybench.health import host_facts  # noqa: E402
from replaybench.history import Point, across_nights  # noqa: E402
from replaybench.params import RunParameters  # noqa: E402
from replaybench.stats import typical, undisturbed_base  # noqa: E402
from replaybench.worker import MeasuringPool  # noqa: E402
from replaybench.workload import BenchConfig, load_registry  # noqa: E402

# The six configs with the widest speedup intervals in the previous engine's H200 run
# (benchmarks/data/h200-previous-engine-suite.db).
NOISY = [
    ("seed_mlp", {}),
    ("gpt_multi_step", {}),
    ("resnet_small", {}),
    ("rnn_unrolled", {"steps": 8}),
    ("recommender", {"tables": 4}),
    ("sdpa_attention", {"seq_len": 16}),
]
METRICS = ("speedup", "eager", "graph", "graph_gpu", "normalised_speedup")
ACROSS = ("speedup", "eager", "normalised_speedup")  # each gets an interval across nights (leave one out)
TARGETS = {"speedup": "median <= 8%, none above 20%", "graph": "<= 2%", "graph_gpu": "<= 2%"}


def selected_configs(args, parameters: RunParameters) -> list[BenchConfig]:
    registry = load_registry()
    default = parameters.configs(registry)
    if args.workload:
        return [c for c in default if c.workload in args.workload]
    if args.subset == "default":
        return default
    out = []
    for name, narrow in NOISY:
        out += [c for c in default if c.workload == name and all(c.params.get(k) == v for k, v in narrow.items())]
    return out


def result_figures(result) -> dict:
    """Every metric's [value, ci_low, ci_high] and the eager alternatives, from one ConfigResult."""
    out: dict = {"metrics": {}, "status": {m.mode: m.status for m in result.modes}}
    eager, graph = result.mode("eager"), result.mode("graph")
    for name, mode, series in (("eager", eager, "throughput"), ("graph", graph, "throughput"), ("graph_gpu", graph, "gpu"),
                               ("eager_gpu", eager, "gpu"), ("graph_latency", graph, "latency")):
        s = getattr(mode, series) if mode is not None and mode.status == "ok" else None
        if s is not None:
            out["metrics"][name] = [s.value, s.ci_low, s.ci_high]
    if graph is not None and graph.speedup is not None:
        out["metrics"]["speedup"] = [graph.speedup, graph.speedup_ci_low, graph.speedup_ci_high]
    if graph is not None and graph.normalised_speedup is not None:
        out["metrics"]["normalised_speedup"] = [graph.normalised_speedup, graph.normalised_speedup_ci_low,
                                                graph.normalised_speedup_ci_high]
    if eager is not None and eager.status == "ok":
        groups = eager.throughput.groups()
        out["eager_all_units"] = typical(groups).value
        if result.host is not None:
            out["eager_normalised"] = eager.host_normalised.value
            out["host_disturbed"] = result.host.share_disturbed
            out["host_base"] = result.host.base_s
        out["eager_per_process"] = eager.throughput.process_values
        # Raw units, so that any other estimator can be tried on the same runs: per process, each
        # unit's eager and graph block (s/iter) and the reference blocks before and after it (s).
        if graph is not None and graph.status == "ok" and result.host is not None:
            out["units"] = {"eager": groups, "graph": graph.throughput.groups(),
                            "ref_before": result.host.before, "ref_after": result.host.after}
    return out


def run_once(configs, parameters: RunParameters, passes: int = 1) -> list[dict]:
    """One run: with ``passes`` > 1, the config list is measured that many times over, each
    measurement with the budget divided by ``passes``, and each config's passes combined
    (``combine_passes``)."""
    settings = parameters.measure_settings()
    if passes > 1:
        settings = settings.model_copy(update={"time_budget_s": settings.time_budget_s / passes})
    rows = []
    began = time.monotonic()
    with MeasuringPool(parameters.processes, parameters.timeout_s) as pool:
        for p in range(passes):
            for config in configs:
                start = time.monotonic()
                result = pool.measure(config, settings)
                rows.append({"workload": config.workload, "params": config.params, "wall_s": time.monotonic() - start,
                             "pass": p, "at_s": start - began, **result_figures(result)})
                m = rows[-1]["metrics"]
                sp = m.get("speedup")
                print(f"  {config.label}{f' (pass {p + 1})' if passes > 1 else ''}: {rows[-1]['wall_s']:.1f} s, "
                      + (f"speedup {sp[0]:.2f} [{sp[1]:.2f}, {sp[2]:.2f}], " if sp else "")
                      + f"eager {m['eager'][0] * 1e6:.1f} us, disturbed {rows[-1].get('host_disturbed', 0):.0%}", flush=True)
    return rows


def unpassed(run: list[dict]) -> list[dict]:
    """A saved run's rows as measured: each pass its own row."""
    return [p for row in run for p in row.get("passes", [row])]


def passes_as_runs(runs: list[list[dict]]) -> list[list[dict]]:
    """Each pass of each run taken as a run of its own: what one pass's share of the budget gives,
    read across host states minutes apart."""
    out = []
    for run in runs:
        rows = unpassed(run)
        for p in sorted({r.get("pass", 0) for r in rows}):
            out.append([{**r, "pass": 0} for r in rows if r.get("pass", 0) == p])
    return out


def combine_passes(rows: list[dict]) -> list[dict]:
    """Rows of one run, one per config: a config measured in several passes gets, per metric, the
    geometric mean of its passes' figures and the Student-t interval over them (passes - 1 degrees
    of freedom: each pass is one witness of the host's state at its time); its wall time is the
    passes' sum and the pass rows are kept under ``passes``. Rows without passes are returned as
    they are."""
    if not rows or "pass" not in rows[0] or max(r["pass"] for r in rows) == 0:
        return rows
    by_config: dict = {}
    for r in rows:
        by_config.setdefault((r["workload"], json.dumps(r["params"], sort_keys=True)), []).append(r)
    out = []
    for group in by_config.values():
        metrics = {}
        for name in group[0]["metrics"]:
            values = [r["metrics"][name][0] for r in group if name in r["metrics"]]
            if len(values) == len(group):
                e = typical([[v] for v in values])
                metrics[name] = [e.value, e.ci_low, e.ci_high]
        row = {"workload": group[0]["workload"], "params": group[0]["params"], "wall_s": sum(r["wall_s"] for r in group),
               "metrics": metrics, "passes": group}
        for key, read in (("eager_all_units", None), ("eager_normalised", None), ("host_base", host_base)):
            values = [read(r) if read else r.get(key) for r in group]
            if all(values):
                row[key] = float(np.exp(np.mean(np.log(values))))
        row["host_disturbed"] = float(np.mean([r.get("host_disturbed", 0) for r in group]))
        out.append(row)
    return out


def recompute(runs: list[list[dict]]) -> list[list[dict]]:
    """The runs' figures computed again from their raw units with this checkout's statistics, each
    pass its own row (``as_run`` combines them)."""
    out = []
    for run in runs:
        rows = []
        for row in unpassed(run):
            u = row.get("units")
            if not u:
                rows.append(row)
                continue
            processes = row_units(row)
            f = figures(processes, ["eager", "graph"])
            metrics = dict(row["metrics"])
            for name, e in (("speedup", f.speedup["graph"]), ("eager", f.throughput["eager"]), ("graph", f.throughput["graph"])):
                metrics[name] = [e.value, e.ci_low, e.ci_high]
            rows.append({**row, "metrics": metrics, "eager_normalised": f.normalised.value,
                         "host_disturbed": 1 - sum(int(m.sum()) for m in f.masks) / sum(len(m) for m in f.masks)})
        out.append(rows)
    return out


def row_units(row: dict) -> list[Units]:
    """Each measuring process's raw units of one measurement, as the engine holds them. A file that
    kept one reference per unit (the slower of the two) uses it on both sides."""
    u = row["units"]
    before, after = u.get("ref_before") or u["ref"], u.get("ref_after") or u["ref"]
    return [Units(ref_before=list(b), ref_after=list(a), blocks={"eager": list(e), "graph": list(g)})
            for e, g, b, a in zip(u["eager"], u["graph"], before, after)]


def normalised_speedup(row: dict) -> list[float] | None:
    """The engine's host-normalised speedup (``analysis.figures``) from one measurement's raw units:
    [value, low, high]."""
    e = figures(row_units(row), ["eager", "graph"]).normalised_speedup.get("graph") if row.get("units") else None
    return [e.value, e.ci_low, e.ci_high] if e is not None else None


def as_run(rows: list[dict]) -> list[dict]:
    """One run's rows as summarized: each measurement with ``normalised_speedup`` from its raw units
    (files made before the engine stored it hold the units only), then each config's passes combined
    (``combine_passes``)."""
    rows = [{**r, "metrics": {**r["metrics"], "normalised_speedup": figure}} if (figure := normalised_speedup(r)) else r
            for r in rows]
    return combine_passes(rows)


def as_passes(runs: list[list[dict]], k: int) -> list[list[dict]]:
    """Every choice of ``k`` of the runs, each taken as the passes of one run (``combine_passes``):
    what measuring each config in ``k`` passes spread over minutes would give, from runs already
    made. The choices share runs, so they are not independent repetitions: a first look only."""
    out = []
    for chosen in itertools.combinations(runs, k):
        rows = [{**row, "pass": p} for p, run in enumerate(chosen) for row in run]
        out.append(combine_passes(rows))
    return out


def halfwidth(v) -> float:
    return (v[2] - v[1]) / 2 / v[0]


def spread(values) -> float:
    values = [v for v in values if v]
    return max(values) / min(values) - 1 if len(values) > 1 else float("nan")


def across(values: list[list[float]]) -> list[tuple[float, float] | None]:
    """Each run's interval across nights, the other runs (in order) as its history."""
    points = [Point(i, *v) for i, v in enumerate(values)]
    return [across_nights(points[:k] + points[k + 1:], points[k], min_history=4) for k in range(len(points))]


def host_base(row: dict) -> float | None:
    """The config's undisturbed reference time: as stored, or from its raw units."""
    if row.get("host_base"):
        return row["host_base"]
    u = row.get("units")
    if not u:
        return None
    return undisturbed_base([r for side in ("ref_before", "ref_after", "ref") for p in u.get(side) or [] for r in p])


def at_run_speed(run: list[dict]) -> list[float | None]:
    """Each config's eager figure at its run's typical host speed (the module's docstring)."""
    bases = [host_base(r) for r in run]
    known = [b for b in bases if b]
    typical_base = statistics.median(known) if known else None
    return [r["metrics"]["eager"][0] * typical_base / b if b and "eager" in r["metrics"] else None
            for r, b in zip(run, bases)]


def summarize(runs: list[list[dict]]) -> None:
    keys = [(r["workload"], json.dumps(r["params"], sort_keys=True)) for r in runs[0]]
    scaled = [at_run_speed(run) for run in runs]
    eager_spreads: dict[str, list[float]] = {}
    print()
    print(f"{'config':<58} {'metric':<18} {'half-width':>10} {'max':>7} {'covered':>8}")
    overall: dict[str, list] = {m: [] for m in METRICS}
    covered: dict[str, list] = {m: [] for m in METRICS}
    across_widths: dict[str, list] = {m: [] for m in ACROSS}
    across_held: dict[str, list] = {m: [] for m in ACROSS}
    for i, (workload, params) in enumerate(keys):
        rows = [run[i] for run in runs]
        label = f"{workload} {params}"[:58]
        for metric in METRICS:
            values = [r["metrics"][metric] for r in rows if metric in r["metrics"]]
            if not values:
                continue
            center = statistics.median(v[0] for v in values)
            widths = [halfwidth(v) for v in values]
            hits = [v[1] <= center <= v[2] for v in values]
            overall[metric] += widths
            covered[metric] += hits
            print(f"{label:<58} {metric:<18} {statistics.median(widths):>10.1%} {max(widths):>7.1%} "
                  f"{sum(hits)}/{len(hits):<6}")
            label = ""
            found = [(v, a) for v, a in zip(values, across(values)) if a] if metric in ACROSS else []
            if found:
                held = [a[0] <= center <= a[1] for _, a in found]
                across_widths[metric] += [(a[1] - a[0]) / 2 / v[0] for v, a in found]
                across_held[metric] += held
                print(f"{'':<58} {'  nights':<18} {statistics.median([(a[1] - a[0]) / 2 / v[0] for v, a in found]):>10.1%} "
                      f"{max((a[1] - a[0]) / 2 / v[0] for v, a in found):>7.1%} {sum(held)}/{len(held):<6}")
        walls = [r["wall_s"] for r in rows]
        spreads = {"reported": spread([r["metrics"]["eager"][0] for r in rows]),
                   "all units": spread([r.get("eager_all_units") for r in rows]),
                   "host's speed taken out": spread([r.get("eager_normalised") for r in rows]),
                   "at the run's host speed": spread([run[i] for run in scaled])}
        for name, value in spreads.items():
            if np.isfinite(value):
                eager_spreads.setdefault(name, []).append(value)
        print(f"{'':<58} eager run-to-run spread: " + ", ".join(f"{k} {v:.1%}" for k, v in spreads.items())
              + f"; wall {statistics.median(walls):.1f} s per config (max {max(walls):.1f})")
    print()
    print("eager run-to-run spread, median over configs: "
          + ", ".join(f"{k} {statistics.median(v):.1%}" for k, v in eager_spreads.items()))
    for metric in METRICS:
        w = overall[metric]
        if w:
            print(f"overall {metric:<18}: median half-width {statistics.median(w):.1%}, max {max(w):.1%}, "
                  f"covered {sum(covered[metric])}/{len(covered[metric])} ({np.mean(covered[metric]):.0%})"
                  + (f"   target {TARGETS[metric]}" if metric in TARGETS else ""))
    for metric in ACROSS:
        w = across_widths[metric]
        if w:
            print(f"across nights {metric:<18}: median half-width {statistics.median(w):.1%}, max {max(w):.1%}, "
                  f"covered {sum(across_held[metric])}/{len(w)} ({np.mean(across_held[metric]):.0%}), "
                  "each run's with the others as its history")
    print("coverage target: each config's interval holds the median of the runs' points in >= 90% of runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--subset", choices=("noisy", "default"), default="noisy")
    parser.add_argument("-w", "--workload", action="append", default=[])
    parser.add_argument("--processes", type=int, help="measuring processes (default: the run default)")
    parser.add_argument("--passes", type=int, default=1,
                        help="measure the configs this many times over in each run, each time with the budget divided "
                             "by it, and combine each config's passes (t over passes)")
    parser.add_argument("--out", help="write every run's figures here (JSON)")
    parser.add_argument("--summarize", metavar="FILE", help="print the summary of a file written by --out; measure nothing")
    parser.add_argument("--as-passes", type=int, metavar="K",
                        help="with --summarize: take every K of the file's runs as the passes of one run (as_passes)")
    parser.add_argument("--passes-as-runs", action="store_true",
                        help="with --summarize: take each pass of the file's runs as a run of its own (passes_as_runs)")
    parser.add_argument("--recompute", action="store_true",
                        help="with --summarize: compute the figures again from the file's raw units with this checkout's statistics")
    args = parser.parse_args()
    if args.passes < 1 or args.runs < 1:
        parser.error("--runs and --passes must be at least 1")
    if (args.as_passes is not None or args.passes_as_runs) and not args.summarize:
        parser.error("--as-passes and --passes-as-runs go with --summarize")
    if args.as_passes is not None and args.passes_as_runs:
        parser.error("--as-passes and --passes-as-runs are two readings of a file: take one")
    if args.summarize:
        try:
            with open(args.summarize) as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            parser.error(f"--summarize {args.summarize}: {exc}")
        print(f"{saved['command']}: {len(saved['runs'])} run(s), settings {saved['settings']}")
        # Passes are combined again, as this checkout combines them.
        runs = recompute(saved["runs"]) if args.recompute else [unpassed(run) for run in saved["runs"]]
        if args.passes_as_runs:
            runs = passes_as_runs(runs)
            print(f"each pass taken as a run of its own: {len(runs)} runs")
        runs = [as_run(run) for run in runs]
        if args.as_passes is not None:
            if not 2 <= args.as_passes <= len(runs):
                parser.error(f"--as-passes takes 2 to {len(runs)} of this file's {len(runs)} runs")
            runs = as_passes(runs, args.as_passes)
            print(f"every {args.as_passes} of the runs taken as the passes of one run: {len(runs)} runs, not independent")
        summarize(runs)
        return
    parameters = RunParameters(**({"processes": args.processes} if args.processes else {}))
    configs = selected_configs(args, parameters)
    print(f"{len(configs)} config(s), {args.runs} run(s); processes {parameters.processes}, precision "
          f"{parameters.precision:.0%}, time budget {parameters.time_budget_s:g} s per config", flush=True)
    runs, started = [], time.time()
    for i in range(args.runs):
        print(f"run {i + 1}", flush=True)
        runs.append(as_run(run_once(configs, parameters, args.passes)))
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"command": " ".join(sys.argv), "started": started, "host": host_facts(),
                           "settings": parameters.model_dump(mode="json"), "runs": runs}, f)
    summarize(runs)


if __name__ == "__main__":
    main()
