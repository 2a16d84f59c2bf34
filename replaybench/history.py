"""Did a figure of one config change? A change-point fit over its history, refit every night.

The input is one config's figure (a time, or eager at standard host speed) on each earlier night,
oldest first, and tonight's: one :class:`Point` per run, weighted by the measurements it rests on
(same-night confirmations add to them). Everything is on log scale, so changes are relative.

Method. The run-to-run noise sigma is the root mean square of the differences between
consecutive earlier nights, without the largest tenth of them and corrected for that trimming: a
step or an outlier shows in one or two differences and does not count. The series is cut into constant
levels by the segmentation that minimises the weighted squared error plus ``PENALTY`` sigma^2 per
level (optimal partitioning, an exact dynamic programme); a level of one measurement inside the
history is an outlier night and is skipped, and a level of fewer than ``MIN_HISTORY``
measurements is no reference: the levels after it are judged against the last level that is. Two neighbouring levels differ when the later one is at
least ``min_effect`` away and a t-test on their means rejects equality at ``ALPHA``. Tonight is:
- NEW without any earlier night (the caller partitions the history by GPU model);
- UNCERTAIN with fewer than ``MIN_HISTORY`` earlier nights; or, with ``since`` set, when tonight
  alone, or a level of the last ``RECENT`` nights, is off at the looser level ``ALPHA_HINT``: worth
  a same-night re-measure (the flow makes ``verdicts.CONFIRMATIONS`` of them);
- SLOWER or FASTER on the night a level that differs from the one before it first stands, while it
  is recent; later nights of that level read SAME, naming the change, and :func:`open_changes`
  keeps it until the level moves back;
- SAME otherwise.
A change of environment (torch, driver, CUDA, Python, replaybench) is judged across, never a wall:
when it came on the first night of a new level (or a night either side), the verdict names it as
the likely cause. ``benchmarks/regression_detector.py`` gives the figures behind the constants, on
the night-to-night noise of real H200 runs.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps

MIN_EFFECT = 0.05  # smallest relative change reported as FASTER/SLOWER
MIN_HISTORY = 5  # earlier nights before anything but NEW or UNCERTAIN
ALPHA = 0.003  # two-sided level of the test between two levels
ALPHA_HINT = 0.3  # ... at which a night or a recent level that looks off is worth a same-night re-measure
PENALTY = 8.0  # cost of one more level, in sigma^2 of squared error
NOISE_FLOOR = 0.003  # sigma is never taken below this (log scale)
NOISE_EFFICIENCY = 0.8  # the trimmed RMS is worth this share of the differences' degrees of freedom
RECENT = 3  # a level is reported while it holds no more than this many points, tonight's included


class Verdict(str, enum.Enum):
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    SAME = "SAME"
    UNCERTAIN = "UNCERTAIN"
    NEW = "NEW"  # no earlier night on this GPU model
    ENV_CHANGED = "ENV_CHANGED"  # stored by earlier versions only: an environment change is now a cause


@dataclass(frozen=True)
class Point:
    """One run's figure. ``env`` holds (name, value) pairs of what may cause a change (torch 2.11.0,
    driver 580.159.04, ...); ``weight`` is the number of measurements the figure rests on."""

    run_id: int
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    env: tuple = ()
    weight: int = 1


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    change: float | None  # relative change of the figure against the level before (+0.05: 5% higher)
    baseline: float | None  # that level (geometric mean)
    reason: str
    cause: str | None = None  # environment change on the first night of the level, if any
    since: int | None = None  # run id of the first night of the level tonight belongs to


@dataclass(frozen=True)
class Level:
    indices: tuple  # the points it holds (outlier nights inside its span are in none)
    mean: float  # weighted mean of their logs
    weight: int  # measurements

    @property
    def start(self) -> int:
        return self.indices[0]


@dataclass(frozen=True)
class Change:
    """Two neighbouring levels that differ: the later one starts at run ``first_run``."""

    first_run: int
    index: int
    change: float
    t: float
    before: Level
    after: Level
    cause: str | None


def noise(points: Sequence[Point], within: Sequence[Level] | None = None, robust: bool = False) -> float:
    """Run-to-run sigma of one point's log value, from the differences between consecutive points
    (only those inside one of ``within``'s levels, if given): their root mean square without the
    largest tenth of them, corrected for that trimming under normal noise, so that a step or an
    outlier night, which shows in one or two differences, does not count, while noise that comes in
    clusters of similar nights (which fools a median) does. ``robust``: 1.4826 times their median
    instead, which a step among a few differences does not move."""
    y = np.log([p.value for p in points])
    w = np.array([p.weight for p in points], dtype=float)
    pairs = [(i, i + 1) for i in range(y.size - 1)]
    if within is not None:
        same = {i: k for k, lv in enumerate(within) for i in lv.indices}
        pairs = [(i, j) for i, j in pairs if i in same and same.get(j) == same[i]]
    if len(pairs) < 2:
        return NOISE_FLOOR
    i, j = np.array(pairs).T
    d = np.sort(np.abs((y[j] - y[i]) / np.sqrt(1 / w[i] + 1 / w[j])))
    if robust:
        return max(1.4826 * float(np.median(d)), NOISE_FLOOR)
    keep = int(math.ceil(0.9 * d.size))
    return max(math.sqrt(float(np.mean(d[:keep] ** 2))) * _trim_correction(keep / d.size), NOISE_FLOOR)


def _trim_correction(p: float) -> float:
    """sigma over the RMS of the smallest share ``p`` of |normal| draws (1 for p = 1, 1.267 for 0.9)."""
    if p >= 1:
        return 1.0
    z = sps.norm.ppf((1 + p) / 2)
    return math.sqrt(p / (p - 2 * z * sps.norm.pdf(z)))


def _spans(y: np.ndarray, w: np.ndarray, beta: float) -> list[tuple[int, int]]:
    """Optimal partitioning: the spans [i, j) minimising weighted squared error + beta per span."""
    n = y.size
    s0, s1, s2 = (np.concatenate([[0.0], np.cumsum(v)]) for v in (w, w * y, w * y * y))
    best = np.zeros(n + 1)
    last = np.zeros(n + 1, dtype=int)
    for j in range(1, n + 1):
        i = np.arange(j)
        total = best[i] + (s2[j] - s2[i]) - (s1[j] - s1[i]) ** 2 / (s0[j] - s0[i]) + beta
        last[j] = int(np.argmin(total))
        best[j] = total[last[j]]
    spans, j = [], n
    while j > 0:
        spans.append((int(last[j]), j))
        j = int(last[j])
    return spans[::-1]


def levels(points: Sequence[Point], sigma: float | None = None, min_effect: float = MIN_EFFECT) -> list[Level]:
    """The series' levels: the optimal partitioning with PENALTY * sigma^2 per level; a level of one
    measurement inside the history dropped as an outlier night; then neighbours merged, the least
    different pair first, until every two neighbours differ (at ALPHA and by ``min_effect``; a last
    level of one measurement, tonight alone, at ALPHA_HINT)."""
    if not points:
        return []
    y = np.log([p.value for p in points])
    w = np.array([p.weight for p in points], dtype=float)
    sigma = noise(points) if sigma is None else sigma
    spans = _spans(y, w, PENALTY * sigma**2)
    groups = [list(range(i, j)) for k, (i, j) in enumerate(spans)
              if not (w[i:j].sum() == 1 and 0 < k < len(spans) - 1)]

    def make(indices) -> Level:
        idx = np.array(indices)
        return Level(tuple(indices), float(np.average(y[idx], weights=w[idx])), int(w[idx].sum()))

    found = [make(g) for g in groups]
    crit, hint = critical(points), critical(points, ALPHA_HINT)
    while len(found) > 1:
        scores = []
        for k in range(len(found) - 1):
            a, b = found[k], found[k + 1]
            t = (b.mean - a.mean) / (sigma * math.sqrt(1 / a.weight + 1 / b.weight))
            needed = hint if k + 1 == len(found) - 1 and b.weight == 1 else crit
            differ = abs(t) >= needed and abs(math.expm1(b.mean - a.mean)) >= min_effect
            scores.append((differ, abs(t) / needed, k))
        differ, _, k = min(scores)
        if differ:
            break
        found[k:k + 2] = [make(found[k].indices + found[k + 1].indices)]
    return found


def changes(points: Sequence[Point], min_effect: float = MIN_EFFECT, sigma: float | None = None) -> list[Change]:
    """Every level that differs from the last level before it long enough to be a reference
    (MIN_HISTORY measurements), oldest first: its neighbour where that is long enough, else the
    last earlier level that is, if the level differs from that one too. The later level may be
    tonight alone."""
    return _changes(points, min_effect, sigma)[1]


def level_noise(points: Sequence[Point], min_effect: float = MIN_EFFECT) -> float:
    """Run-to-run sigma from the differences inside the levels that a first, robust fit finds: an
    earlier step of the series, which on a young history is too large a share of the differences
    for ``noise``'s trimming to drop, does not count as noise. Where the levels leave fewer than two
    such differences, ``noise`` of the whole series."""
    within = levels(points, noise(points, robust=True), min_effect)
    if sum(len(lv.indices) - 1 for lv in within) < 2:
        return noise(points)
    return noise(points, within=within)


def _changes(points, min_effect, sigma) -> tuple[list[Level], list[Change]]:
    if sigma is None:
        sigma = level_noise(points, min_effect)
    found = levels(points, sigma, min_effect)
    out, reference = [], None
    for k, (before, after) in enumerate(zip(found, found[1:])):
        if before.weight >= MIN_HISTORY:
            reference = before
        elif reference is None:
            continue
        d = after.mean - reference.mean
        t = d / (sigma * math.sqrt(1 / after.weight + 1 / reference.weight))
        if reference is not before:
            # A level too short to judge against lies between: the change must stand against the
            # last level that is long enough, as levels() asks of neighbours.
            needed = critical(points, ALPHA_HINT) if k + 2 == len(found) and after.weight == 1 else critical(points)
            if abs(t) < needed or abs(math.expm1(d)) < min_effect:
                continue
        out.append(Change(points[after.start].run_id, after.start, math.expm1(d), t, reference, after, cause(points, after.start)))
    return found, out


def critical(points: Sequence[Point], alpha: float | None = None) -> float:
    """Two-sided critical t at ``alpha`` (default ALPHA), with the degrees of freedom the noise
    estimate carries."""
    return _t_quantile(ALPHA if alpha is None else alpha, max(1.0, NOISE_EFFICIENCY * (len(points) - 2)))


@functools.lru_cache(maxsize=1024)
def _t_quantile(alpha: float, df: float) -> float:
    return float(sps.t.ppf(1 - alpha / 2, df))


def across_nights(history: Sequence[Point], tonight: Point, confidence: float = 0.95,
                  min_history: int = MIN_HISTORY) -> tuple[float, float] | None:
    """Where the config's typical figure lies, seen from tonight's: tonight's value times
    exp(+/- t sigma), sigma the run-to-run noise of the earlier nights (``noise``: the host's state
    from run to run and each run's own error together) and t with the degrees of freedom that
    estimate carries; never narrower than tonight's own interval. None with fewer than
    ``min_history`` earlier nights.

    A run's own interval says where that run's figure lies, for the host as it was during the run;
    on the H200 and H100 VMs the whole host's speed moved eager, and with it the speedup, by more
    than that from one run to the next (``benchmarks/interval_calibration.py``)."""
    if len(history) < min_history:
        return None
    half = critical(history, 1 - confidence) * noise(history)
    low, high = tonight.value * math.exp(-half), tonight.value * math.exp(half)
    return (min(low, tonight.ci_low) if tonight.ci_low is not None else low,
            max(high, tonight.ci_high) if tonight.ci_high is not None else high)


def cause(points: Sequence[Point], index: int) -> str | None:
    """'torch 2.11.0 -> 2.12.0': what of the environment changed on the night of point ``index``, or
    on the night before or after it (a level's first night is only known to a night or so)."""
    for at, when in ((index, ""), (index - 1, " the night before"), (index + 1, " the night after")):
        if 0 < at < len(points):
            before, after = dict(points[at - 1].env), dict(points[at].env)
            diff = [f"{k} {before.get(k)} -> {after.get(k)}" for k in after if before.get(k) != after.get(k)]
            if diff:
                return ", ".join(diff) + when
    return None


def _direction(change: float, higher_is_better: bool) -> Verdict:
    return Verdict.FASTER if (change > 0) == higher_is_better else Verdict.SLOWER


def judge(history: Sequence[Point], tonight: Point, higher_is_better: bool, *, min_effect: float = MIN_EFFECT) -> Judgement:
    """Verdict on ``tonight`` given the earlier nights ``history`` (oldest first, one GPU model)."""
    if not history:
        return Judgement(Verdict.NEW, None, None, "no earlier night on this GPU")
    points = [*history, tonight]
    n = len(points)
    if len(history) < MIN_HISTORY:
        mu = float(np.mean(np.log([p.value for p in history])))
        return Judgement(Verdict.UNCERTAIN, math.expm1(math.log(tonight.value) - mu), math.exp(mu),
                         f"history too short: {len(history)} earlier night(s), {MIN_HISTORY} needed")
    sigma = noise(history)  # of the nights before: tonight is what is under test
    noise_text = f"run-to-run noise {sigma:.1%}"
    fitted, found = _changes(points, min_effect, sigma)
    last = found[-1] if found and n - 1 in found[-1].after.indices else None
    if last is not None:
        stats = f"t={last.t:+.1f}, {noise_text}"
        cause_text = f"; {last.cause}" if last.cause else ""
        if last.after.weight < 2:
            return Judgement(Verdict.UNCERTAIN, last.change, math.exp(last.before.mean),
                             f"tonight alone is {last.change:+.1%} off the level before ({stats}); "
                             "a re-measure or the next night decides", last.cause, last.first_run)
        verdict = _direction(last.change, higher_is_better)
        # Reported on the first night the level stands, and only while it is recent; later nights
        # read SAME, naming the change (open_changes keeps it until the level moves back).
        before = changes(history, min_effect, noise(history[:-1]))  # as judged last night
        already = any(abs(c.index - last.index) <= 1 and c.after.weight >= 2 and (c.change > 0) == (last.change > 0)
                      for c in before)
        if already or last.index < n - RECENT:
            return Judgement(Verdict.SAME, last.change, math.exp(last.before.mean),
                             f"same level since run {last.first_run}, {last.change:+.1%} against the level before "
                             f"({verdict.value}{cause_text})", last.cause, last.first_run)
        reason = (f"level {last.change:+.1%} since run {last.first_run} against the {last.before.weight} "
                  f"measurement(s) before ({stats}){cause_text}")
        return Judgement(verdict, last.change, math.exp(last.before.mean), reason, last.cause, last.first_run)
    # No change to report: are the last nights off their level, enough for a re-measure?
    current = fitted[-1]
    y = np.log([p.value for p in points])
    w = np.array([p.weight for p in points], dtype=float)
    hint = critical(points, ALPHA_HINT)
    best = None
    for k in range(1, RECENT + 1):
        window = [i for i in current.indices if i >= n - k]
        rest = [i for i in current.indices if i < n - k]
        if not window or w[rest].sum() < MIN_HISTORY:
            continue
        d = np.average(y[window], weights=w[window]) - np.average(y[rest], weights=w[rest])
        t = d / (sigma * math.sqrt(1 / w[window].sum() + 1 / w[rest].sum()))
        if abs(t) >= hint and abs(math.expm1(d)) >= min_effect and (best is None or abs(t) > abs(best[1])):
            best = (window[0], t, d, rest)
    if best is not None:
        first, t, d, rest = best
        run = points[first].run_id
        what = "tonight alone is" if first == n - 1 else f"the nights since run {run} are"
        return Judgement(Verdict.UNCERTAIN, math.expm1(d), math.exp(np.average(y[rest], weights=w[rest])),
                         f"{what} {math.expm1(d):+.1%} off their level (t={t:+.1f}, {noise_text}); not beyond doubt: "
                         "a re-measure or the next night decides", cause(points, first), run)
    rest = [i for i in current.indices if i < n - 1]
    if w[rest].sum() < MIN_HISTORY:  # tonight's level is too young to judge by: against the last level that is not
        reference = next((lv for lv in reversed(fitted[:-1]) if lv.weight >= MIN_HISTORY), None)
        rest = list(reference.indices) if reference else rest or list(range(n - 1))
    base = float(np.average(y[rest], weights=w[rest]))
    change = math.expm1(y[-1] - base)
    reason = f"same: tonight {change:+.1%} against the level of the {int(w[rest].sum())} measurement(s) before ({noise_text})"
    return Judgement(Verdict.SAME, change, math.exp(base), reason + _since(found))


def _since(found: list[Change]) -> str:
    if not found:
        return ""
    c = found[-1]
    return f"; level changed {c.change:+.1%} at run {c.first_run}" + (f" ({c.cause})" if c.cause else "")


def judge_series(points: Sequence[Point], higher_is_better: bool, **kw) -> list[Judgement]:
    """The verdict on each night given only the nights before it."""
    return [judge(points[:i], p, higher_is_better, **kw) for i, p in enumerate(points)]


def open_changes(points: Sequence[Point], min_effect: float = MIN_EFFECT) -> list[Change]:
    """The change that started the current level, if there is one and the level stands on two
    measurements or more: it stays open until the series moves to another level."""
    found = changes(points, min_effect, noise(points[:-1]))  # the noise judge() takes, so both find the same levels
    if found and len(points) - 1 in found[-1].after.indices and found[-1].after.weight >= 2:
        return [found[-1]]
    return []


def compare(base: Point, current: Point, higher_is_better: bool, sigma: float | None = None,
            *, min_effect: float = MIN_EFFECT) -> Judgement:
    """Two runs against each other (``replaybench compare``, a pinned baseline). FASTER/SLOWER
    needs the change to reach ``min_effect``, the two runs' intervals not to overlap, and, where
    the nightly history gives the run-to-run noise ``sigma``, the same t-test as between two levels
    (one measurement each). Two runs whose intervals do not support a difference are never SLOWER."""
    change = current.value / base.value - 1
    apart = _apart(base, current)
    if sigma is not None:
        t = math.log1p(change) / (sigma * math.sqrt(1 / base.weight + 1 / current.weight))
        crit = float(sps.t.ppf(1 - ALPHA / 2, 30))
        noise_text = f"t={t:+.1f} with the nightly run-to-run noise {sigma:.1%}"
        significant = abs(t) >= crit
    else:
        noise_text = "no nightly history to judge run-to-run noise by: the two runs' intervals only"
        significant = True
    if abs(change) >= min_effect and apart and significant:
        verdict = _direction(change, higher_is_better)
        return Judgement(verdict, change, base.value, f"{change:+.1%} against run {base.run_id}; {noise_text}")
    if not apart or abs(change) < min_effect:
        why = "the intervals overlap" if not apart else f"below the {min_effect:.0%} minimum effect"
        return Judgement(Verdict.SAME, change, base.value, f"{change:+.1%} against run {base.run_id}: {why}; {noise_text}")
    return Judgement(Verdict.UNCERTAIN, change, base.value, f"{change:+.1%} against run {base.run_id}, within the noise ({noise_text})")


def _apart(a: Point, b: Point) -> bool:
    if None in (a.ci_low, a.ci_high, b.ci_low, b.ci_high):
        return True
    return b.ci_high < a.ci_low or b.ci_low > a.ci_high
