"""How well replaybench.history tells a step from noise, on synthetic nightly histories.

    python benchmarks/regression_detector.py [--histories 1000] [--nights 60] [--seed 0] [--quick]

Each synthetic history is ``--nights`` nightly medians with lognormal run-to-run noise (sigma on
log scale) and, in the step histories, one multiplicative step (x(1+step) or x(1-step)) at a night
drawn uniformly from 15..nights-3, so that three nights after it remain. Every run also gets a 95%
interval of its median (within-run standard error 0.5%, narrower than the run-to-run noise, as in
real runs). Four step kinds: a time metric (lower is better) going up (SLOWER) or down (FASTER), a
speedup metric (higher is better) going up (FASTER) or down (SLOWER).

Figures (each night judged by judge_series, i.e. given only the nights before it):
- found within 4 nights: share of steps with a verdict of the right direction on one of the first
  four nights at the new level (target >= 95% for 5% steps in 2% noise; the target sets no delay,
  and a step near the end of a history has only three or four nights to be found in); also within
  3 nights, a stricter goal of ours (>= 95%; the bounds below show what is reachable);
- nights to detection: on which night at the new level the first right verdict came (1 = the
  first night), median over the steps found at all;
- false alarms per 100 nights on step-free histories: FASTER/SLOWER verdicts per 100 nights that
  had at least min_history nights before them (target <= 1);
- for context: false alarms in the step histories away from the step (nights with no step in the
  last three; a first right verdict after the third night is a late detection, not an alarm), the
  share of UNCERTAIN on step-free nights, the frontier of the confirmation level alpha, and two
  bounds: a window-of-3 test that knows the old level and the noise exactly, and one that knows the
  noise but estimates the old level from all the nights before (per night tested);
- 1% noise with 3% steps, for context;
- robustness: step-free histories where 2% of nights are one bad night (+25%).
This is a benchmark, not a test: it prints figures and targets, and never asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replaybench import history  # noqa: E402
from replaybench.history import Point, Verdict, judge_series  # noqa: E402

WITHIN_RUN_SE = 0.005
KINDS = (  # (name, higher_is_better, step sign, expected verdict)
    ("time up", False, +1, Verdict.SLOWER),
    ("time down", False, -1, Verdict.FASTER),
    ("speedup up", True, +1, Verdict.FASTER),
    ("speedup down", True, -1, Verdict.SLOWER),
)


def synthetic(rng, nights: int, noise: float, step: float = 0.0, at: int | None = None, base: float = 1e-4,
              bad_rate: float = 0.0, bad: float = 0.25) -> list[Point]:
    level = np.full(nights, np.log(base))
    if at is not None:
        level[at:] += np.log1p(step)
    x = level + rng.normal(0.0, noise, nights)
    if bad_rate:
        x += np.where(rng.random(nights) < bad_rate, np.log1p(bad), 0.0)
    v = np.exp(x)
    half = np.exp(1.959964 * WITHIN_RUN_SE * np.exp(rng.normal(0, 0.2, nights)))
    return [Point(i, float(v[i]), float(v[i] / half[i]), float(v[i] * half[i]), ("H200", "560", "12.8", "2.11")) for i in range(nights)]


def step_figures(n: int, nights: int, noise: float, step: float, seed: int, **kw) -> dict:
    rng = np.random.default_rng(seed)
    found, found4, wrong, delays, late, fa, fa_nights = 0, 0, 0, [], 0, 0, 0
    min_history = kw.get("min_history", history.MIN_HISTORY)
    for i in range(n):
        name, hib, sign, expected = KINDS[i % len(KINDS)]
        at = int(rng.integers(15, nights - 2))
        base = 2.0 if hib else 1e-4 * float(np.exp(rng.normal(0, 1)))
        pts = synthetic(rng, nights, noise, sign * step, at, base=base)
        verdicts = [j.verdict for j in judge_series(pts, hib, **kw)]
        first = next((k for k in range(at, nights) if verdicts[k] == expected), None)
        if first is not None and first - at < 3:
            found += 1
        if first is not None and first - at < 4:
            found4 += 1
        if first is not None:
            delays.append(first - at + 1)
        wrong += any(verdicts[k] not in (expected, Verdict.SAME, Verdict.UNCERTAIN) for k in range(at, min(at + 3, nights)))
        for k in range(min_history, nights):
            if at <= k < at + 3:
                continue
            fa_nights += 1
            # Away from the step; the first right verdict after the third night is a late detection.
            fa += verdicts[k] in (Verdict.FASTER, Verdict.SLOWER) and k != first
        late += first is not None and first - at >= 3
    return {
        "detected": found / n,
        "detected_4": found4 / n,
        "wrong_direction": wrong / n,
        "median_nights": statistics.median(delays) if delays else float("nan"),
        "detected_later": late / n,
        "fa_per_100_away": 100 * fa / fa_nights,
    }


def null_figures(n: int, nights: int, noise: float, seed: int, bad_rate: float = 0.0, **kw) -> dict:
    rng = np.random.default_rng(seed)
    alarms = uncertain = same = total = 0
    min_history = kw.get("min_history", history.MIN_HISTORY)
    for i in range(n):
        hib = bool(i % 2)
        base = 2.0 if hib else 1e-4 * float(np.exp(rng.normal(0, 1)))
        pts = synthetic(rng, nights, noise, base=base, bad_rate=bad_rate)
        verdicts = [j.verdict for j in judge_series(pts, hib, **kw)][min_history:]
        total += len(verdicts)
        alarms += sum(v in (Verdict.FASTER, Verdict.SLOWER) for v in verdicts)
        uncertain += sum(v is Verdict.UNCERTAIN for v in verdicts)
        same += sum(v is Verdict.SAME for v in verdicts)
    return {"fa_per_100": 100 * alarms / total, "uncertain": uncertain / total, "same": same / total, "nights": total}


def report(label: str, n: int, nights: int, noise: float, step: float, seed: int, targets: bool, **kw) -> dict:
    t0 = time.perf_counter()
    s = step_figures(n, nights, noise, step, seed, **kw)
    z = null_figures(n, nights, noise, seed + 1, **kw)
    dt = time.perf_counter() - t0
    print(f"\n{label}: {noise:.0%} run-to-run noise, {step:.0%} steps; {n} step histories + {n} step-free, {nights} nights each ({dt:.0f} s)")
    if targets:
        t3 = f"   stricter goal >= 95%: {'met' if s['detected'] >= 0.95 else 'NOT MET'}"
        t4 = f"   target >= 95%: {'met' if s['detected_4'] >= 0.95 else 'NOT MET'}"
        t1 = f"   target <= 1: {'met' if z['fa_per_100'] <= 1 else 'NOT MET'}"
    else:
        t3 = t4 = t1 = ""
    print(f"  steps found within 3 nights:       {s['detected']:6.1%}{t3}")
    print(f"  false alarms per 100 nights:       {z['fa_per_100']:6.2f}{t1}   ({z['nights']} step-free nights judged)")
    print(f"  median nights to detection:        {s['median_nights']:6.0f}   (1 = the first night at the new level)")
    print(f"  steps found within 4 nights:       {s['detected_4']:6.1%}{t4}")
    print(f"  wrong-direction verdicts at steps: {s['wrong_direction']:6.1%}")
    print(f"  false alarms per 100 nights away from the step, in the step histories: {s['fa_per_100_away']:.2f}")
    print(f"  step-free nights: SAME {z['same']:.1%}, UNCERTAIN {z['uncertain']:.1%}")
    return {**s, **z}


def oracle(noise: float, step: float, fa_per_100: float = 1.0, n: int = 400_000, seed: int = 7) -> float:
    """Detection within 3 nights of a window-of-3 test that knows the old level and the noise
    exactly, at a per-night false-alarm rate of fa_per_100 (two-sided), with the 3% minimum effect:
    an upper bound for any detector that must estimate both from the nights before."""
    from scipy.stats import norm

    rng = np.random.default_rng(seed)
    c = norm.ppf(1 - fa_per_100 / 100 / 2)
    found = []
    for sign in (+1, -1):
        shift = np.log1p(sign * step)
        x = rng.normal(0, noise, (n, 5)) + np.array([0, 0, shift, shift, shift])
        means = np.stack([x[:, i : i + 3].mean(1) for i in range(3)], 1)
        hit = (sign * means / (noise / np.sqrt(3)) > c) & (np.abs(np.expm1(means)) >= history.MIN_EFFECT)
        found.append(hit.any(1).mean())
    return float(np.mean(found))


def oracle_level_estimated(noise: float, step: float, fa_per_100: float = 1.0, nights: int = 60, n: int = 20_000,
                           seed: int = 7) -> float:
    """As oracle, but the old level is estimated, as any detector must, from all the nights before
    the window (the noise is still known exactly): the histories of step_figures (steps at night
    15..nights-3, either direction), the threshold set so that fa_per_100 of the step-free nights
    tested (from the 8th on) are alarms. A bound per night tested: a detector that reports a step
    once, not on each night of it, counts fewer alarms than nights over the threshold."""
    rng = np.random.default_rng(seed)

    def z_and_gate(x):
        cs = np.pad(np.cumsum(x, 1), ((0, 0), (1, 0)))
        k = np.arange(7, nights)  # tonight; window k-2..k, level from nights 0..k-3
        nb = k - 2
        mean_b = cs[:, k - 2] / nb
        d = (cs[:, k + 1] - cs[:, k - 2]) / 3 - mean_b
        return d / (noise * np.sqrt(1 / 3 + 1 / nb)), np.abs(np.expm1(d)) >= history.MIN_EFFECT

    z0, g0 = z_and_gate(rng.normal(0, noise, (n, nights)))
    c = float(np.quantile(np.where(g0, np.abs(z0), 0.0), 1 - fa_per_100 / 100))
    at = rng.integers(15, nights - 2, n)
    sign = np.where(np.arange(n) % 2, -1.0, 1.0)
    x = rng.normal(0, noise, (n, nights)) + np.where(np.arange(nights) >= at[:, None], np.log1p(sign * step)[:, None], 0.0)
    z, g = z_and_gate(x)
    cols = at[:, None] - 7 + np.arange(3)  # tonight = at, at+1, at+2
    hit = (sign[:, None] * np.take_along_axis(z, cols, 1) > c) & np.take_along_axis(g, cols, 1)
    return float(hit.any(1).mean())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", type=int, default=1000)
    ap.add_argument("--nights", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="skip the threshold frontier")
    args = ap.parse_args(argv)
    print("Method (replaybench/history.py):")
    print(history.__doc__)
    n, nights = args.histories, args.nights
    report(f"Target, default thresholds (alpha={history.ALPHA})", n, nights, 0.02, 0.05, args.seed, True)

    print("\nUpper bound: a detector that knows the old level and the noise exactly (window of 3, 3% minimum effect)")
    for fa in (0.5, 1.0):
        print(f"  at {fa} false alarms per 100 nights it finds {oracle(0.02, 0.05, fa):.1%} of 5% steps in 2% noise within 3 nights")
    print("Tighter: one that knows the noise exactly but estimates the old level from all the nights before the window")
    for fa in (0.5, 1.0):
        print(f"  at {fa} nights over the threshold per 100 step-free nights it finds {oracle_level_estimated(0.02, 0.05, fa, nights):.1%}")

    if not args.quick:
        print("\nThreshold frontier, same histories (alpha: two-sided level of the confirmation test):")
        print("  alpha    found<=3  found<=4  false alarms/100  UNCERTAIN")
        for alpha in (0.01, 0.015, 0.02, 0.025, 0.03, 0.04):
            s = step_figures(n, nights, 0.02, 0.05, args.seed, alpha=alpha)
            z = null_figures(n, nights, 0.02, args.seed + 1, alpha=alpha)
            print(f"  {alpha:<7}  {s['detected']:7.1%}  {s['detected_4']:8.1%}  {z['fa_per_100']:16.2f}  {z['uncertain']:9.1%}")

    report("Context (a 3% step is the minimum effect: about half its estimates fall below it)", n, nights, 0.01, 0.03, args.seed + 10, False)
    z = null_figures(n, nights, 0.02, args.seed + 20, bad_rate=0.02)
    print(f"\nRobustness: 2% noise, step-free, 2% of nights one bad night (+25%); {n} histories")
    print(f"  false alarms per 100 nights:       {z['fa_per_100']:6.2f}")
    print(f"  step-free nights: SAME {z['same']:.1%}, UNCERTAIN {z['uncertain']:.1%}")


if __name__ == "__main__":
    main()
