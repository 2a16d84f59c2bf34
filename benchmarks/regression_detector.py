"""How well the nightly verdicts find real steps in the noise real H200 runs have.

    python benchmarks/regression_detector.py [--histories 300] [--nights 40] [--seed 0]

The night-to-night noise comes from repeated H200 runs of the six noisiest default configs
(``benchmarks/data/h200-calibration-*.json``: 7 runs on two VMs, see its README): for each config
and judged figure (eager with the host's speed taken out as those files stored it, then eager over the
host reference: its run-to-run noise is larger than that of eager at standard host speed, which the
verdicts judge now; graph replay throughput, graph GPU time), the
deviations of its runs' log figures from their mean. A synthetic history picks a config and draws
each night's deviation from that config's own deviations (a smoothed bootstrap: one of them, plus
Gaussian jitter of Silverman's bandwidth, scaled to keep their spread), so each history has the
noise of a real config. A step multiplies the figure by 1.10 (10% slower) from a night drawn in
15..nights-3 on. Same-night confirmation is simulated as the flow does it: a night the detector
finds off (a step, tonight alone off its level, or a possible recent step) is measured
``CONFIRMATIONS`` more times, each an independent draw, and judged on them all. That a re-measure minutes later is a fresh draw of the host's state is what the
data say: runs minutes apart on one VM spread as much as runs on two VMs (printed first).

Printed, against the targets of the issue that asked for this:
- 10% steps in graph throughput or GPU time reported on their first night (target >= 95%);
- 10% eager steps reported by their third night (target >= 90%);
- false alarms (FASTER or SLOWER) per 100 step-free nights (target <= 1), and how many step-free
  nights a config was measured again (the cost of confirming);
- a torch change with no real change: SLOWER within three nights of it (should be no more than the
  false alarms); with a real 10% step on the same night: found by the third night, and the share of
  those whose verdict names the torch change.
This is a benchmark, not a test: it prints figures and targets, and never asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replaybench.history import Point, Verdict, judge  # noqa: E402
from replaybench.verdicts import CONFIRMATIONS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
FIGURES = ("eager", "graph", "graph_gpu")
LABELS = {"eager": "eager, host's speed taken out", "graph": "graph replay throughput", "graph_gpu": "graph GPU time"}
STEP = 0.10
ENV = (("torch", "2.11.0"),)
NEW_ENV = (("torch", "2.12.0.dev20261203"),)


def real_noise() -> dict[str, dict[str, np.ndarray]]:
    """figure -> config -> deviations of its runs' log figures from their mean; and prints the
    within-VM and between-VM spread that the same-night confirmation relies on."""
    by_vm: dict[str, dict[str, list[list[float]]]] = {f: {} for f in FIGURES}
    for vm in (1, 2):
        saved = json.loads((DATA / f"h200-calibration-{vm}.json").read_text())
        for run in saved["runs"]:
            for row in run:
                key = f"{row['workload']} {json.dumps(row['params'], sort_keys=True)}"
                values = {"eager": row.get("eager_normalised"), "graph": row["metrics"]["graph"][0],
                          "graph_gpu": row["metrics"]["graph_gpu"][0]}
                for f in FIGURES:
                    if values[f]:
                        by_vm[f].setdefault(key, [[], []])[vm - 1].append(math.log(values[f]))
    out = {}
    print("night-to-night noise from the H200 runs (sd of log figures):")
    for f in FIGURES:
        out[f] = {}
        within, between = [], []
        for key, (a, b) in by_vm[f].items():
            both = np.array(a + b)
            out[f][key] = both - both.mean()
            within += [np.std(a, ddof=1), np.std(b, ddof=1)]
            between.append(abs(np.mean(a) - np.mean(b)) / math.sqrt(2))
        sds = [np.std(v, ddof=1) for v in out[f].values()]
        print(f"  {LABELS[f]:<30} per config {min(sds):.2%} to {max(sds):.2%}; runs on one VM {np.median(within):.2%} "
              f"(median over configs and VMs), between the two VMs' means {np.median(between):.2%}")
    return out


SILVERMAN = 1.06 * 7 ** -0.2  # kernel bandwidth over the spread, for seven runs


def draw(rng, deviations: np.ndarray) -> float:
    """A smoothed bootstrap draw: one of the config's deviations plus Gaussian jitter of Silverman's
    bandwidth, scaled back so that the draws keep the deviations' spread."""
    sd = deviations.std(ddof=1)
    return float((rng.choice(deviations) + rng.normal(0, SILVERMAN * sd)) / math.sqrt(1 + SILVERMAN**2))


def night_verdicts(rng, deviations, nights: int, step_at: int | None, env_at: int | None = None) -> list:
    """Judge each night as the flow does, confirming the nights that look off (their judgements
    carry weight > 1 in ``confirmed``)."""
    history, verdicts = [], []
    for i in range(nights):
        level = math.log1p(STEP) if step_at is not None and i >= step_at else 0.0
        env = NEW_ENV if env_at is not None and i >= env_at else ENV
        tonight = Point(i, math.exp(level + draw(rng, deviations)), env=env)
        j = judge(history, tonight, higher_is_better=False)
        if j.verdict in (Verdict.SLOWER, Verdict.FASTER) or (j.verdict is Verdict.UNCERTAIN and j.since is not None):
            logs = [math.log(tonight.value)] + [level + draw(rng, deviations) for _ in range(CONFIRMATIONS)]
            tonight = Point(i, math.exp(sum(logs) / len(logs)), env=env, weight=len(logs))
            j = judge(history, tonight, higher_is_better=False)
        history.append(tonight)
        verdicts.append(j)
    night_verdicts.confirmed = [p.weight > 1 for p in history]
    return verdicts


def figures_for(noise: dict[str, np.ndarray], histories: int, nights: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    configs = sorted(noise)
    first = by_third = 0
    alarms = judged = confirmed = 0
    for _ in range(histories):
        dev = noise[configs[rng.integers(len(configs))]]
        at = int(rng.integers(15, nights - 2))
        v = night_verdicts(rng, dev, nights, at)
        hit = next((k for k in range(at, nights) if v[k].verdict is Verdict.SLOWER), None)
        first += hit == at
        by_third += hit is not None and hit - at < 3
        alarms += sum(x.verdict in (Verdict.SLOWER, Verdict.FASTER) for x in v[6:at])
        judged += max(0, at - 6)
        dev = noise[configs[rng.integers(len(configs))]]
        v = night_verdicts(rng, dev, nights, None)
        alarms += sum(x.verdict in (Verdict.SLOWER, Verdict.FASTER) for x in v[6:])
        confirmed += sum(night_verdicts.confirmed[6:])
        judged += nights - 6
    return {"first": first / histories, "third": by_third / histories, "alarms": 100 * alarms / judged,
            "confirmations": 100 * confirmed / (histories * (nights - 6))}


def torch_change(noise: dict[str, np.ndarray], histories: int, nights: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    configs = sorted(noise)
    alarm = found = named = 0
    for _ in range(histories):
        at = int(rng.integers(15, nights - 3))
        v = night_verdicts(rng, noise[configs[rng.integers(len(configs))]], nights, None, env_at=at)
        alarm += any(x.verdict is Verdict.SLOWER for x in v[at:at + 3])
        v = night_verdicts(rng, noise[configs[rng.integers(len(configs))]], nights, at, env_at=at)
        hit = next((v[k] for k in range(at, min(at + 3, nights)) if v[k].verdict is Verdict.SLOWER), None)
        found += hit is not None
        named += hit is not None and "torch 2.11.0 -> 2.12.0.dev20261203" in hit.reason
    return {"alarm": alarm / histories, "found": found / histories, "named": named / max(found, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, default=300, help="per figure, with a step and without")
    parser.add_argument("--nights", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.monotonic()
    noise = real_noise()
    print(f"\n{args.histories} histories of {args.nights} nights per figure, 10% steps (seed {args.seed}):")
    results = {}
    for k, f in enumerate(FIGURES):
        r = results[f] = figures_for(noise[f], args.histories, args.nights, args.seed + k)
        target = "first night >= 95%" if f != "eager" else "by the third night >= 90%"
        print(f"  {LABELS[f]:<30} found on the first night {r['first']:6.1%}, by the third {r['third']:6.1%}; "
              f"false alarms {r['alarms']:.2f} per 100 nights   (target: {target}, <= 1 false alarm); "
              f"step-free nights confirmed: {r['confirmations']:.1f} per 100")
    t = torch_change(noise["eager"], args.histories, args.nights, args.seed + 10)
    print(f"  torch change, no real change (eager): SLOWER within three nights in {t['alarm']:.1%} of histories")
    print(f"  torch change with a real 10% eager step: found by the third night {t['found']:.1%}, "
          f"the verdict naming the torch change {t['named']:.1%}")
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
