"""How wide are one run's intervals? The figures the README gives for a run of the default suite.

    python benchmarks/suite_intervals.py replaybench.db [--run N] [--recompute]

For each config of the run (the newest, or ``--run N``) with a graph result: the relative half-width
of the speedup's interval, of graph time per call's, of graph GPU time's and of the speedup with the
host's speed taken out (``normalised``; opening the copy computes it from the stored units for rows
stored before the engine stored it), and how many measuring processes each rests on; then, over the
configs, the median and largest half-width of each and how many are within the target (speedup:
median <= 8%, none above 20%; graph time per call and GPU time: <= 2%). ``--recompute`` computes the
speedup, time per call and the host-normalised speedup again from the run's stored units with this
checkout's statistics (``replaybench.analysis.figures``); GPU time is as stored.
The database is read from a copy: opening a store upgrades its schema in place. A benchmark, not a
test: it prints figures and targets and never asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replaybench.analysis import figures, stored_units  # noqa: E402
from replaybench.storage import Store  # noqa: E402

TARGETS = {"speedup": (0.08, 0.20), "graph": (None, 0.02), "graph GPU": (None, 0.02), "normalised": (0.08, 0.20)}
METRICS = ("speedup", "graph", "graph GPU", "normalised")


def halfwidth(value, low, high) -> float | None:
    return (high - low) / 2 / value if value and low is not None and high is not None else None


def config_widths(modes: dict, recompute: bool) -> dict[str, tuple[float | None, int]]:
    """metric -> (relative half-width, processes it rests on) for one config's stored rows."""
    graph = modes["graph"]
    out = {"graph GPU": (halfwidth(graph.gpu_s, graph.gpu_ci_low, graph.gpu_ci_high), graph.processes[1])}
    if recompute:
        units = stored_units(modes)
        f = figures(units, list(modes))
        out["speedup"] = (f.speedup["graph"].rel_halfwidth, len(f.used))
        out["graph"] = (f.throughput["graph"].rel_halfwidth, len(f.counted("graph")[1]))
        normalised = f.normalised_speedup.get("graph")
        out["normalised"] = (normalised.rel_halfwidth if normalised else None, sum(1 for u in units if len(u)))
    else:
        out["speedup"] = (halfwidth(graph.speedup, graph.speedup_ci_low, graph.speedup_ci_high), modes["eager"].processes[0])
        out["graph"] = (halfwidth(graph.throughput_s, graph.throughput_ci_low, graph.throughput_ci_high), graph.processes[0])
        out["normalised"] = (halfwidth(graph.normalised_speedup, graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high),
                             graph.processes[1])
    return out


def configs(run) -> dict[tuple[str, str], dict]:
    """(workload, params key) -> mode -> stored row, for each config a run measured."""
    rows: dict = defaultdict(dict)
    for r in run.results:
        if not r.repeat:  # a same-night confirmation is a second measurement, not another config
            rows[(r.workload, r.params_key)][r.mode] = r
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="a SQLite file written by replaybench run")
    parser.add_argument("--run", type=int, help="the run's id (default: the newest)")
    parser.add_argument("--recompute", action="store_true", help="recompute speedup and time per call from the stored units")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "copy.db")
        shutil.copyfile(args.db, copy)
        run = Store(f"sqlite:///{copy}").run(args.run)
        rows = configs(run)
        widths: dict[str, list[float]] = defaultdict(list)
        print(f"run {run.id} ({run.status}), {'recomputed from stored units' if args.recompute else 'as stored'}")
        print(f"{'config':<60} {'speedup':>14} {'graph':>14} {'graph GPU':>14} {'normalised':>14}")
        for (workload, key), modes in sorted(rows.items()):
            if "graph" not in modes or "eager" not in modes or modes["graph"].throughput_s is None:
                continue
            found = config_widths(modes, args.recompute)
            cells = []
            for metric in METRICS:
                w, processes = found[metric]
                if w is not None:
                    widths[metric].append(w)
                cells.append(f"{w:>7.1%} ({processes}p)" if w is not None else f"{'n/a':>14}")
            print(f"{(workload + ' ' + key)[:60]:<60} {' '.join(cells)}")
    print()
    for metric, (median_target, max_target) in TARGETS.items():
        w = widths[metric]
        if not w:
            continue
        within = sum(x <= max_target for x in w)
        target = (f"median <= {median_target:.0%}, " if median_target else "") + f"none above {max_target:.0%}"
        print(f"{metric:<10} {len(w)} configs: median {statistics.median(w):.1%}, largest {max(w):.1%}, "
              f"{within} of {len(w)} within {max_target:.0%}   target: {target}")


if __name__ == "__main__":
    main()
