"""What an A/B run reads when A and B are identical, on real H200 noise, without a GPU.

    python benchmarks/ab_noise.py [benchmarks/data/h200-calibration-2.json]

An A/B run (``replaybench.ab``) times A's and B's unit j of a pair right after one another on one
core, and compares them unit by unit. The units kept in the calibration file (18 configs of the
six noisiest default workloads, six measuring processes each, one core each, rounds of one unit per
process) are arranged here as A/B runs of two identical variants, in two ways:

- **one core**: each process is a pair; its units 2j and 2j+1 are A's and B's unit j, A first in
  even rounds and B first in odd ones (A B, B A, ...), as an A/B run orders them. They are six units
  apart in time (the other processes timed theirs in between), where an A/B run's are adjacent: if
  anything, this reads more host drift than an A/B run meets.
- **two cores**: processes 0, 2, 4 are A and 1, 3, 5 are B, paired in that order, unit j with unit j:
  adjacent in time, but on different cores.

For each it prints how many B/A intervals hold no change, how many read "no difference" (within
+/-5%), the relative half-width per metric, the eager half-width from pairing units against
comparing each process's median, and how often a change planted in B's blocks is found. ``tests/test_ab.py`` holds the statistics to these figures. GPU time is not
in the file per process, so it is not here. A benchmark, not a test: it prints and never asserts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from replaybench.ab import judge, ratio, ratios  # noqa: E402
from replaybench.analysis import Units  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "h200-calibration-2.json"
MODES = ["eager", "graph"]
MIN_EFFECT = 0.05
PLANTED = [("eager", 1.10), ("eager", 1.05), ("graph", 1.03), ("graph", 1.01)]


def _unit(units: dict, p: int, js: list[int]) -> Units:
    """Process p's units js, each with the reference blocks around it."""
    before = units.get("ref_before") or units["ref"]
    after = units.get("ref_after") or units["ref"]
    return Units([before[p][j] for j in js], [after[p][j] for j in js], {m: [units[m][p][j] for j in js] for m in MODES})


def on_one_core(units: dict) -> tuple[list[Units], list[Units]]:
    a, b = [], []
    for p in range(len(units["eager"])):
        rounds = range(len(units["eager"][p]) // 2)
        a.append(_unit(units, p, [2 * j + (j % 2) for j in rounds]))
        b.append(_unit(units, p, [2 * j + 1 - (j % 2) for j in rounds]))
    return a, b


def on_two_cores(units: dict) -> tuple[list[Units], list[Units]]:
    processes = len(units["eager"]) // 2 * 2
    whole = [_unit(units, p, list(range(len(units["eager"][p])))) for p in range(processes)]
    return whole[0::2], whole[1::2]


ARRANGEMENTS = {"one core": on_one_core, "two cores": on_two_cores}


def configs(path: Path = DATA) -> list[tuple[str, dict]]:
    """(workload, stored units) of each config of each calibration run with raw units."""
    saved = json.loads(path.read_text())
    return [(row["workload"], row["units"]) for run in saved["runs"] for row in run if "units" in row]


def scaled(units: list[Units], mode: str, factor: float) -> list[Units]:
    """The same units with one mode's blocks ``factor`` times longer: a planted change."""
    return [Units(u.ref_before, u.ref_after, {m: [x * (factor if m == mode else 1) for x in blocks]
                                               for m, blocks in u.blocks.items()}) for u in units]


def process_medians(a: list[Units], b: list[Units], mode: str):
    """B/A from each process's own median, as comparing two separate runs' processes would."""
    return ratio(*[[float(np.median(u.blocks[mode])) for u in side] for side in (a, b)])


def summarize(name: str, pairs: list[tuple[list[Units], list[Units]]]) -> None:
    widths: dict[tuple[str, str], list[float]] = {}
    hold = total = quiet = 0
    for a, b in pairs:
        verdicts = []
        for key, e in ratios(a, b, MODES).items():
            widths.setdefault(key, []).append(e.rel_halfwidth)
            hold += e.ci_low <= 1 <= e.ci_high
            total += 1
            verdicts.append(judge(key[1], e, MIN_EFFECT)[0])
        quiet += all(v == "no difference" for v in verdicts)
    print(f"\n== {name}: {len(pairs)} configs, {len(a)} pairs each")
    print(f"  intervals holding no change: {hold} of {total}; configs 'no difference' on every metric: {quiet} of {len(pairs)}")
    for (mode, metric), w in widths.items():
        print(f"  {mode} {metric}: B/A half-width median {np.median(w):.2%}, max {max(w):.2%}")
    medians = [process_medians(a, b, "eager").rel_halfwidth for a, b in pairs]
    print(f"  eager, each process's median compared instead of units: half-width median {np.median(medians):.2%}")
    for mode, factor in PLANTED:
        found = sum(judge("time per call", ratios(a, scaled(b, mode, factor), MODES)[(mode, "time per call")],
                          MIN_EFFECT)[0] == "slower" for a, b in pairs)
        print(f"  B's {mode} time per call {factor - 1:+.0%} planted: read slower in {found} of {len(pairs)}")


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    found = configs(path)
    for name, arrange in ARRANGEMENTS.items():
        summarize(name, [arrange(u) for _, u in found])


if __name__ == "__main__":
    main()
