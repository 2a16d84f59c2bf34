"""Is tonight's result faster, slower or the same as before? A step detector on nightly medians.

Input is one point per night: the run's median of one metric of one (workload, params, mode), its
95% interval, and the environment key (GPU model, driver, CUDA, torch). The unit of evidence is the
night. Block timings are not used: the blocks of one run share its process, host state and clocks,
so a test on pooled blocks of two nights would call every run-to-run wobble significant. Everything
is on log scale, so effects are relative; FASTER/SLOWER mean better/worse for the user
(``higher_is_better``: False for a time, True for a speedup).

Method (defaults in brackets; all are keyword options of judge and judge_series):

1. Comparable nights. Only nights with tonight's environment key count. No earlier night at all:
   NEW. Earlier nights, none on this key: ENV_CHANGED, the reason naming each field that differs
   from the previous night's key ("torch 2.10.0 -> 2.11.0"); never SLOWER. Fewer than
   ``min_history`` [5] comparable nights: UNCERTAIN.
2. Levels and baseline. The series of a key is cut into levels at confirmed steps. The baseline is
   the current level's last ``window`` [30] nights before the nights under test: its mean log
   median (the geometric mean) and the run-to-run noise sigma, the standard deviation of those log
   medians (nights more than ``outlier`` [5] robust sigmas (1.4826 MAD) off the median are left out,
   with 8 nights or more; a level shorter than the window pools its residuals with the previous
   level's; sigma is floored by the nights' own standard error from their intervals and by
   ``noise_floor`` [0.2%]).
3. Confirmation. The last ``confirm`` [3] nights (tonight the last) against the baseline: a pooled-
   variance Student t, t = m_r / (sigma * sqrt(1/3 + 1/n_b)), df = the baseline's. Not Welch: three
   nights give 2 df for their own variance, and adjacent nights of one setup share the noise that
   the baseline measures. m_r is a robust mean of the three deviations: each is capped at
   ``spread`` [1.5] sigmas from the window's median night, and one further than ``spike`` [4] sigmas
   counts as the median (one bad night next to normal ones is no step). FASTER/SLOWER when
   |t| > t(1 - alpha/2, df) with ``alpha`` [0.025], |change| >= ``min_effect`` [3%] where change =
   exp(mean deviation) - 1, the robust and plain means agree in direction, and tonight is not back
   at the old level (closer to it than to the window's other nights, and ``split`` [2] sigmas of a
   difference below them). The reported change is then the step's size, baseline the geometric mean.
4. After a step. The window's first night starts a new level, the baseline from the next night on:
   a step is reported on the night it is confirmed, and later nights read SAME against the new
   level (the reason keeps naming the change). If the window's first night still sits at the old
   level (as in 3, mirrored), the step began a night later: it is reported, starts its level there,
   and must hold on the next night (its three nights against the old level, same test) or is
   withdrawn. A new level needs ``min_level`` [4] nights before a further step can be confirmed
   against it. While a level is young (4 to 30 nights), the change is withdrawn as soon as its
   nights no longer differ from the level before at ``alpha_hint`` or by half the minimum effect:
   a false alarm then blinds the detector for a night or two, not a week. A step back from a young
   level (confirmed as in 3, against it) withdraws the change instead of being reported if its
   three nights do not differ from the level before the change (same test) and neither, by the
   withdrawal test, do the nights between them and the night that confirmed the change (the nights
   that confirmed it, picked for being off, are left out): tonight is then judged against the
   level before. A change that held, then went back, is reported as a step back.
5. Not confirmed. UNCERTAIN if each of the last 2 or 3 nights is at least a sigma off and together
   they differ by at least the minimum effect at ``alpha_hint`` [0.02] ("possible step"), or if
   tonight alone does ("one night off; not confirmed"), or if such a window is not off on every
   night ("ambiguous"); otherwise SAME, including changes that are significant but smaller than
   the minimum effect. change is tonight against the baseline.
6. Pinned baseline (``pinned=Point``): the last 3 nights on tonight's key against the pinned run's
   value, t = m_r / sqrt(sigma^2/3 + max(sigma^2, se_pinned^2)), with sigma the current level's
   run-to-run noise (the nights' intervals when the level has fewer than 3 nights) and the same
   thresholds and verdicts (with fewer than 3 nights on the key, at most UNCERTAIN); tonight alone
   off: UNCERTAIN. A pinned run on another key: ENV_CHANGED.

Operating point (benchmarks/regression_detector.py, 1000 synthetic histories of 60 nights, fixed
seeds, lognormal run-to-run noise 2%, one 5% step per history in either direction on a time or a
speedup metric; seed 0, seed 1 in brackets): 93.4% [92.3%] of steps found by their third night
(median: on the second), 97.3% [95.3%] by the fourth, 0.89 [0.87] false alarms per 100 step-free
nights, 3.3% [3.2%] of step-free nights UNCERTAIN; with 2% of nights one bad night (+25%), 1.05
[1.06] false alarms per 100 nights. The target, 95% of 5% steps found at <= 1 false alarm per 100
nights, is met by the fourth night. Our stricter goal, 95% by the third night, is not, and is
close to the limit of what three nights tell: a window-of-3 test
that knows the noise exactly but, as any detector must, estimates the old level from the nights
before finds 94.3% at 1 night over its threshold per 100 step-free nights (91.3% at 0.5; a
detector that reports an excursion once counts somewhat fewer alarms than nights over the
threshold, so this is a guide, not a hard bound); one that also knows the old level, 96.1% (94.0%
at 0.5). The 3% minimum effect alone loses about 5% of 5% steps
on their third night. ``alpha`` moves along the frontier (seed 0, found by the third night / false
alarms per 100 nights): 0.01 -> 88.3% / 0.57, 0.015 -> 91.4% / 0.71, 0.02 -> 92.8% / 0.82, 0.03
-> 93.5% / 0.93, 0.04 -> 94.0% / 0.99. ``window`` 20 instead of 30 finds 91.5% at 0.90 [90.9% at
0.92]; 60, 94.1% at 0.87 [92.6% at 0.87], at the cost of a baseline twice as long that a slow drift
would widen.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Sequence

from scipy import stats as sps

ENV_FIELDS = ("GPU", "driver", "CUDA", "torch")  # the order of storage.Run.environment_key
Z95 = 1.959963984540054

# Defaults, tuned with benchmarks/regression_detector.py (see the module docstring).
MIN_EFFECT = 0.03
MIN_HISTORY = 5
MIN_LEVEL = 4
WINDOW = 30
CONFIRM = 3
ALPHA = 0.025
ALPHA_HINT = 0.02
SPREAD = 1.5
SPIKE = 4.0
SPLIT = 2.0
NOISE_FLOOR = 0.002
OUTLIER = 5.0


class Verdict(str, enum.Enum):
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    SAME = "SAME"
    UNCERTAIN = "UNCERTAIN"
    ENV_CHANGED = "ENV_CHANGED"
    NEW = "NEW"  # no history at all


@dataclass(frozen=True)
class Point:
    """One night: the run's median (seconds per iteration, or a speedup), its 95% interval, and
    the environment key (GPU model, driver, CUDA, torch), as storage.Run.environment_key."""

    run_id: int
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    env_key: tuple = ()


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    change: float | None  # relative change of the metric vs the baseline (+0.05: value 5% higher)
    baseline: float | None
    reason: str


@dataclass(frozen=True)
class Settings:
    """The detector's knobs; keyword arguments of judge and judge_series."""

    min_effect: float = MIN_EFFECT  # smallest relative change reported as FASTER/SLOWER
    min_history: int = MIN_HISTORY  # comparable nights before any verdict, and before a first step
    min_level: int = MIN_LEVEL  # nights a new level needs before a further step is tested against it
    window: int = WINDOW  # baseline: at most this many nights of the current level
    confirm: int = CONFIRM  # a step is confirmed over this many nights
    alpha: float = ALPHA  # two-sided level of the confirmation test
    alpha_hint: float = ALPHA_HINT  # two-sided level at which a change is worth an UNCERTAIN
    split: float = SPLIT  # sigmas (of a difference) that put a window's first or last night at the old level
    spike: float = SPIKE  # a window night this many sigmas from the window's median night counts as it
    spread: float = SPREAD  # a window night counts at most this many sigmas from the window's median night
    noise_floor: float = NOISE_FLOOR  # the run-to-run noise is never taken below this (log scale)
    outlier: float = OUTLIER  # baseline nights this many robust sigmas off their median are left out

    def __post_init__(self):
        if self.confirm < 2 or self.min_history < 2 or self.window < 2:
            raise ValueError("confirm, min_history and window must be at least 2")


def judge(
    history: Sequence[Point],
    current: Point,
    higher_is_better: bool,
    *,
    min_effect: float = MIN_EFFECT,
    pinned: Point | None = None,
    **kw,
) -> Judgement:
    """Verdict on ``current`` given the earlier nights ``history`` (chronological, any environment).

    Keyword options besides ``min_effect`` and ``pinned`` are the fields of :class:`Settings`.
    The history is replayed night by night so that the level changes confirmed earlier are known:
    the result is the last element of ``judge_series([*history, current], ...)``.
    """
    return judge_series([*history, current], higher_is_better, min_effect=min_effect, pinned=pinned, **kw)[-1]


def judge_series(points: Sequence[Point], higher_is_better: bool, **kw) -> list[Judgement]:
    """The verdict on each night given the nights before it (for trend plots). Keyword options:
    ``pinned`` (a Point) and the fields of :class:`Settings`."""
    pinned = kw.pop("pinned", None)
    detector = _Detector(Settings(**kw), higher_is_better)
    return [detector.night(p, pinned) for p in points]


def env_difference(old: tuple, new: tuple) -> str:
    """'torch 2.10.0 -> 2.11.0, driver 550.54 -> 560.35': the fields of two environment keys that differ."""
    old, new = tuple(old or ()), tuple(new or ())
    names = ENV_FIELDS if max(len(old), len(new)) <= len(ENV_FIELDS) else ()
    parts = []
    for i, (a, b) in enumerate(zip_longest(old, new)):
        if a != b:
            name = names[i] if i < len(names) else f"field {i}"
            parts.append(f"{name} {a} -> {b}")
    return ", ".join(parts) or "no field differs"


# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _crit(alpha: float, df: float) -> float:
    """Two-sided critical value of Student's t."""
    return float(sps.t.ppf(1 - alpha / 2, df))


def _log_se(p: Point) -> float:
    """Standard error of log(value) from the run's 95% interval; nan without one."""
    lo, hi = p.ci_low, p.ci_high
    if lo is None or hi is None or not (0 < lo <= hi) or not math.isfinite(hi):
        return math.nan
    return (math.log(hi) - math.log(lo)) / (2 * Z95)


def _valid(p: Point) -> bool:
    return p.value is not None and math.isfinite(p.value) and p.value > 0


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class _Change:
    first: int  # index of the first night of the new level
    change: float  # relative change of the metric
    verdict: Verdict
    confirmed_by: int  # run id of the night that confirmed it
    at: int = -1  # index of the night that confirmed it (or that it last held on)
    retracted_by: int | None = None  # run id of the night whose history no longer bore it out
    pending: bool = False  # confirmed with fewer than `confirm` nights at its level: must hold on the next


@dataclass
class _Env:
    """The nights seen on one environment key (log scale), and where the current level starts."""

    xs: list[float] = field(default_factory=list)
    ses: list[float] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=lambda: [0])  # first night of each level, the current one last
    changes: list[_Change] = field(default_factory=list)
    cache: dict = field(default_factory=dict)  # (stop, seg, prev_seg) -> _Baseline

    def current_change(self) -> _Change | None:
        """The change that started the current level; None for the first level."""
        if self.seg == 0:
            return None
        return next((c for c in reversed(self.changes) if c.first == self.seg and c.retracted_by is None), None)

    @property
    def seg(self) -> int:
        return self.starts[-1]

    @property
    def prev_seg(self) -> int:
        return self.starts[-2] if len(self.starts) > 1 else 0


@dataclass
class _Baseline:
    mu: float  # mean log value
    n: int  # nights used
    sigma: float  # run-to-run noise of one night's log median
    df: int  # degrees of freedom of sigma
    ref_var: float = 0.0  # variance of a pinned reference value (log scale)


@dataclass
class _Window:
    k: int  # nights in the window, tonight the last
    base: _Baseline
    d: float  # mean log deviation of the window from the baseline
    t: float  # test statistic, from the robust mean (see _window)
    consistent: bool  # robust and plain means agree in direction, and tonight is not back at the old level
    late: bool  # the window's first night still sits at the old level
    d_late: float  # mean log deviation of the window without its first night
    every: bool  # every night of the window is at least one sigma off in the same direction

    @property
    def change(self) -> float:
        return math.expm1(self.d)


class _Detector:
    def __init__(self, s: Settings, higher_is_better: bool):
        self.s = s
        self.hib = higher_is_better
        self.envs: dict[tuple, _Env] = {}
        self.seen = 0
        self.last_env: tuple | None = None

    def night(self, p: Point, pinned: Point | None) -> Judgement:
        if not _valid(p):
            return Judgement(Verdict.UNCERTAIN, None, None, f"run {p.run_id}: value {p.value!r} is not a positive number")
        key = tuple(p.env_key or ())
        env = self.envs.setdefault(key, _Env())
        x = math.log(p.value)
        judgement, change = self._judge(env, key, p, x)
        if pinned is not None:
            judgement = self._pinned(env, p, x, pinned)
        env.xs.append(x)
        env.ses.append(_log_se(p))
        env.ids.append(p.run_id)
        if change is not None:  # the new level is the baseline from now on
            env.starts.append(change.first)
            env.changes.append(change)
        self.seen += 1
        self.last_env = key
        return judgement

    def _direction(self, d: float) -> Verdict:
        return Verdict.FASTER if (d > 0) == self.hib else Verdict.SLOWER

    # -- statistics -----------------------------------------------------------------------------

    def _baseline(self, env: _Env, stop: int, level_start: int | None = None) -> _Baseline:
        """Mean and run-to-run noise of the log medians of the current level's last ``window``
        nights before index ``stop``.

        Nights more than ``outlier`` robust sigmas (1.4826 MAD) from their median are left out (with
        8 nights or more). With fewer than ``window`` nights, the noise is pooled with the residuals
        of the previous level's last nights around their own mean: the noise belongs to the workload
        and the machine, not to the level. The noise is floored by the nights' own standard error
        (from their intervals) and by ``noise_floor``.
        """
        seg = env.seg if level_start is None else level_start
        prev_seg = env.prev_seg if level_start is None else None
        key = (stop, seg, prev_seg)
        cached = env.cache.get(key)
        if cached is None:
            cached = env.cache[key] = self._compute_baseline(env, stop, seg, prev_seg)
        return _Baseline(**cached.__dict__)

    def _compute_baseline(self, env: _Env, stop: int, seg: int, prev_seg: int | None) -> _Baseline:
        s = self.s
        start = max(seg, stop - s.window)
        b = env.xs[start:stop]
        se = env.ses[start:stop]
        if len(b) >= 8:
            med = _median(b)
            rob = 1.4826 * _median([abs(v - med) for v in b])
            cut = s.outlier * max(rob, s.noise_floor)
            keep = [i for i, v in enumerate(b) if abs(v - med) <= cut]
            if len(keep) < len(b):
                b, se = [b[i] for i in keep], [se[i] for i in keep]
        n = len(b)
        mu = sum(b) / n
        ss = sum((v - mu) ** 2 for v in b)
        df = n - 1
        if n < s.window and prev_seg is not None and seg > 0 and start == seg:
            prev = env.xs[max(prev_seg, seg - (s.window - n)) : seg]
            if len(prev) >= 2:
                m = sum(prev) / len(prev)
                ss += sum((v - m) ** 2 for v in prev)
                df += len(prev) - 1
        sigma = math.sqrt(ss / df) if df > 0 else 0.0
        finite = [v for v in se if v == v]
        floor = _median(finite) if finite else 0.0
        return _Baseline(mu=mu, n=n, sigma=max(sigma, floor, s.noise_floor), df=max(df, 1))

    def _window(self, env: _Env, x: float, k: int, base: _Baseline, ref: float | None = None) -> _Window:
        """The last k nights (tonight the last) against ``base`` (or against log value ``ref`` with
        the variance of one night, for a pinned run)."""
        n = len(env.xs)
        mu = base.mu if ref is None else ref
        r = [v - mu for v in env.xs[n - k + 1 : n]] + [x - mu]
        d = sum(r) / k
        # Robust mean: each night counts at most `spread` sigmas from the window's median night, so
        # that one bad night next to normal ones does not make a step.
        # A night further than `spike` sigmas from the median night is an isolated spike and
        # counts as the median night.
        med, c, spike = _median(r), self.s.spread * base.sigma, self.s.spike * base.sigma
        robust = sum(med if abs(v - med) > spike else min(max(v, med - c), med + c) for v in r) / k
        if ref is None:
            var = base.sigma**2 * (1 / k + 1 / base.n)
        else:
            var = base.sigma**2 / k + base.ref_var
        t = robust / math.sqrt(var)
        sign = 1.0 if d > 0 else -1.0
        # The step began inside the window if its first night still sits at the old level: the
        # other nights differ from it by more than `split` sigmas (of a difference). Then the
        # window holds fewer than k nights of the new level, and the step waits for another night.
        gap = self.s.split * base.sigma * math.sqrt(1 + 1 / (k - 1)) if k > 1 else math.inf
        rest_late = sum(r[1:]) / (k - 1) if k > 1 else d
        late = k > 1 and sign * (rest_late - r[0]) > gap and sign * r[0] < sign * rest_late / 2
        # Tonight is back at the old level if it differs from the window's other nights as much.
        rest_back = sum(r[:-1]) / (k - 1) if k > 1 else d
        back = k > 1 and sign * (rest_back - r[-1]) > gap and sign * r[-1] < sign * rest_back / 2
        consistent = (robust > 0) == (d > 0) and not back
        every = all(sign * v >= base.sigma for v in r)
        return _Window(k=k, base=base, d=d, t=t, consistent=consistent, late=late, every=every, d_late=rest_late)

    # -- the verdict ----------------------------------------------------------------------------

    def _judge(self, env: _Env, key: tuple, p: Point, x: float, withdrawn: str = "") -> tuple[Judgement, _Change | None]:
        s, n = self.s, len(env.xs)
        if self.seen == 0:
            return Judgement(Verdict.NEW, None, None, "no history: first night of this series"), None
        if n == 0:
            return self._env_changed(key, x), None
        env_note = ""
        if self.last_env is not None and self.last_env != key:
            env_note = (
                f" (environment differs from the previous night: {env_difference(self.last_env, key)};"
                f" compared with the earlier nights on this one)"
            )
        note = withdrawn + env_note
        if n < s.min_history:
            mu = sum(env.xs) / n
            reason = f"history too short: {_plural(n, 'comparable night')} on this environment, need {s.min_history}{note}"
            return Judgement(Verdict.UNCERTAIN, math.expm1(x - mu), math.exp(mu), reason), None

        c = env.current_change()
        if c is not None and c.pending:
            followed = self._follow_up(env, c, p, x, note)
            if followed is not None:
                return followed, None
            note = f"; the step at run {env.ids[c.first]} reported last night did not hold: withdrawn{note}"
        retracted = self._retract(env)
        if retracted is not None:
            c = retracted
            note = (
                f"; the change of {c.change:+.1%} at run {env.ids[c.first]} is withdrawn: the nights since "
                f"no longer differ from the level before{note}"
            )
        level = n - env.seg  # nights of the current level before tonight
        since = ""
        c = env.current_change()
        if c is not None:
            since = (
                f"; level changed {c.change:+.1%} at run {env.ids[c.first]} "
                f"({c.verdict.value}, confirmed at run {c.confirmed_by})"
            )

        # Confirmation: the last `confirm` nights against the level's nights before them.
        m = s.confirm
        if level - (m - 1) >= (s.min_level if env.seg > 0 else s.min_history):
            base = self._baseline(env, n - m + 1)
            w = self._window(env, x, m, base)
            crit = _crit(s.alpha, base.df)
            if abs(w.t) > crit and abs(w.change) >= s.min_effect and w.consistent:
                verdict = self._direction(w.d)
                if c is not None and (w.d > 0) != (c.change > 0) and level <= s.window and not withdrawn:
                    # A step back from a young level: if these nights do not differ from the level
                    # before the change, and neither do the level's nights between the nights that
                    # confirmed the change and these, the change did not hold: it is withdrawn and
                    # tonight judged against the level before, rather than a step back reported.
                    prior = self._baseline(env, env.seg, level_start=env.prev_seg)
                    wp = self._window(env, x, m, prior)
                    between = env.xs[c.at + 1 : n - m + 1]
                    if not (abs(wp.t) > _crit(s.alpha, prior.df) and abs(wp.change) >= s.min_effect and wp.consistent) and (
                        between and not self._differs(between, prior, c)
                    ):
                        c.retracted_by = p.run_id
                        env.starts.pop()
                        back = (
                            f"; the change of {c.change:+.1%} at run {env.ids[c.first]} is withdrawn: the nights since "
                            f"it was confirmed are back at the level before it"
                        )
                        # Tonight's earlier withdrawals (retraction, a pending step) stay in the reason.
                        earlier = note[: len(note) - len(env_note)]
                        return self._judge(env, key, p, x, withdrawn=earlier + back)
                stats = f"t={w.t:+.1f}, threshold {crit:.1f}; run-to-run noise {base.sigma:.1%}"
                if not w.late:
                    reason = (
                        f"step confirmed: the last {m} nights average {w.change:+.1%} vs the {base.n} nights before "
                        f"({stats}); the new level is the baseline from now on{note}"
                    )
                    change = _Change(first=n - m + 1, change=w.change, verdict=verdict, confirmed_by=p.run_id, at=n)
                    return Judgement(verdict, w.change, math.exp(base.mu), reason), change
                # The step began a night later than the window: it is reported now, and must hold
                # on the next night (then `confirm` nights at the new level) or be withdrawn.
                late = math.expm1(w.d_late)
                reason = (
                    f"step confirmed: the last {m - 1} nights average {late:+.1%} vs the {base.n} nights before, "
                    f"the night before them still at the old level ({stats}); to hold on the next night{note}"
                )
                change = _Change(first=n - m + 2, change=late, verdict=verdict, confirmed_by=p.run_id, at=n, pending=True)
                return Judgement(verdict, late, math.exp(base.mu), reason), change
            confirm_window = (w, crit)
        else:
            confirm_window = None

        # Not confirmed: tonight, and the last nights, against the current level.
        base = self._baseline(env, n)
        d1 = x - base.mu
        t1 = d1 / (base.sigma * math.sqrt(1 + 1 / base.n))
        hint = _crit(s.alpha_hint, base.df)
        change1 = math.expm1(d1)
        ref = f"vs the {base.n} nights before (geometric mean {math.exp(base.mu):.4g}, run-to-run noise {base.sigma:.1%})"
        off = abs(t1) > hint and abs(change1) >= s.min_effect
        hints = []
        for k in range(2, m + 1):
            if level - (k - 1) >= 2:
                b = self._baseline(env, n - k + 1)
                w = self._window(env, x, k, b)
                if abs(w.change) >= s.min_effect and abs(w.t) > _crit(s.alpha_hint, b.df):
                    hints.append(w)
        agreeing = [w for w in hints if w.every]
        if agreeing:
            w = max(agreeing, key=lambda w: w.k)
            reason = (
                f"possible step: each of the last {w.k} nights is off, together {w.change:+.1%} vs the {w.base.n} "
                f"nights before (t={w.t:+.1f}); not confirmed until {m} nights at the new level{since}{note}"
            )
            return Judgement(Verdict.UNCERTAIN, change1, math.exp(base.mu), reason), None
        if off:
            reason = f"one night off: tonight {change1:+.1%} {ref}; not confirmed{since}{note}"
            return Judgement(Verdict.UNCERTAIN, change1, math.exp(base.mu), reason), None
        if hints:
            w = max(hints, key=lambda w: abs(w.t))
            reason = (
                f"ambiguous: the last {w.k} nights average {w.change:+.1%} vs the {w.base.n} nights before, "
                f"but not every night agrees{since}{note}"
            )
            return Judgement(Verdict.UNCERTAIN, change1, math.exp(base.mu), reason), None
        if confirm_window is not None and abs(confirm_window[0].t) > confirm_window[1]:
            w = confirm_window[0]
            reason = f"same: the last {m} nights differ by {w.change:+.1%}, below the {s.min_effect:.0%} minimum effect{since}{note}"
        else:
            reason = f"same: tonight {change1:+.1%} {ref}{since}{note}"
        return Judgement(Verdict.SAME, change1, math.exp(base.mu), reason), None

    def _follow_up(self, env: _Env, c: _Change, p: Point, x: float, note: str) -> Judgement | None:
        """A step confirmed over fewer than `confirm` nights at its new level, on the next night:
        the new level's nights and tonight against the level before. The same verdict if the
        change still holds (significant, at least min_effect, same direction); None, and the
        change withdrawn, if not."""
        s, n = self.s, len(env.xs)
        old = self._baseline(env, env.seg, level_start=env.prev_seg)
        k = n - env.seg + 1
        w = self._window(env, x, k, old)
        crit = _crit(s.alpha, old.df)
        if abs(w.t) > crit and abs(w.change) >= s.min_effect and w.consistent and (w.d > 0) == (c.change > 0):
            c.change = w.change
            c.pending = k < s.confirm
            c.at = n
            reason = (
                f"step holds: the {k} nights since run {env.ids[c.first]} average {w.change:+.1%} vs the {old.n} "
                f"nights before (t={w.t:+.1f}, threshold {crit:.1f}); the new level is the baseline from now on{note}"
            )
            return Judgement(c.verdict, w.change, math.exp(old.mu), reason)
        c.retracted_by = p.run_id
        c.pending = False
        env.starts.pop()
        return None

    def _retract(self, env: _Env) -> _Change | None:
        """Withdraw the last level change while the new level is young (more nights than the
        window that confirmed it, at most ``window``) if its nights, together, no longer differ
        from the level before it at the ``alpha_hint`` level, or by half the minimum effect in the
        same direction. A false alarm is so withdrawn after a night or two of normal values, and
        the long baseline before it serves again; a real step stays."""
        s, n = self.s, len(env.xs)
        c = env.current_change()
        young = n - env.seg
        if c is None or young <= s.confirm or young > s.window:
            return None
        old = self._baseline(env, env.seg, level_start=env.prev_seg)
        if self._differs(env.xs[env.seg : n], old, c):
            return None
        c.retracted_by = env.ids[-1]
        env.starts.pop()
        return c

    def _differs(self, new: list[float], old: _Baseline, c: _Change) -> bool:
        """Whether nights ``new`` still differ from the level ``old`` before change ``c``: by at
        least half the minimum effect in its direction, and at the ``alpha_hint`` level (pooled
        variance)."""
        s = self.s
        mu_new = sum(new) / len(new)
        ss = sum((v - mu_new) ** 2 for v in new)
        sigma = max(math.sqrt((old.sigma**2 * old.df + ss) / (old.df + len(new) - 1)), s.noise_floor)
        d = mu_new - old.mu
        t = d / (sigma * math.sqrt(1 / len(new) + 1 / old.n))
        same_way = (d > 0) == (c.change > 0) and abs(math.expm1(d)) >= s.min_effect / 2
        return same_way and abs(t) > _crit(s.alpha_hint, old.df + len(new) - 1)

    # -- environment change and pinned baseline -------------------------------------------------

    def _env_changed(self, key: tuple, x: float) -> Judgement:
        what = env_difference(self.last_env or (), key)
        prev = self.envs.get(self.last_env)
        if prev is None or not prev.xs:
            return Judgement(Verdict.ENV_CHANGED, None, None, f"environment changed: {what}; first night on it, not compared")
        base = self._baseline(prev, len(prev.xs))
        change = math.expm1(x - base.mu)
        return Judgement(
            Verdict.ENV_CHANGED,
            change,
            math.exp(base.mu),
            f"environment changed: {what}; first night on it, not compared "
            f"({change:+.1%} vs the last {base.n} nights on the previous environment, for information only)",
        )

    def _pinned(self, env: _Env, p: Point, x: float, pinned: Point) -> Judgement:
        """Tonight (and the nights before it) against a pinned run's value instead of the level."""
        s = self.s
        if not _valid(pinned):
            return Judgement(Verdict.UNCERTAIN, None, None, f"pinned run {pinned.run_id} has no usable value")
        xp = math.log(pinned.value)
        change1 = math.expm1(x - xp)
        if p.run_id == pinned.run_id:
            return Judgement(Verdict.SAME, 0.0, pinned.value, "this is the pinned baseline run")
        if tuple(pinned.env_key or ()) != tuple(p.env_key or ()):
            return Judgement(
                Verdict.ENV_CHANGED,
                change1,
                pinned.value,
                f"pinned run {pinned.run_id} is from another environment: {env_difference(pinned.env_key, p.env_key)}; not compared",
            )
        n = len(env.xs)
        se_c, se_p = _log_se(p), _log_se(pinned)
        se_c = 0.0 if se_c != se_c else se_c
        se_p = 0.0 if se_p != se_p else se_p
        if n - env.seg >= 3:
            base = self._baseline(env, n)
            src = f"run-to-run noise {base.sigma:.1%} from {_plural(base.n, 'night')}"
        else:
            base = _Baseline(mu=xp, n=1, sigma=max(se_c, s.noise_floor), df=10**6)
            src = "too few nights for the run-to-run noise: the intervals only"
        # The pinned run is one night: its noise, or its own interval if wider.
        base.ref_var = max(base.sigma**2, se_p**2)
        ref = f"pinned run {pinned.run_id} ({pinned.value:.4g}; {src})"
        k = min(s.confirm, n + 1)
        w = self._window(env, x, k, base, ref=xp)
        w1 = self._window(env, x, 1, base, ref=xp)
        crit, hint = _crit(s.alpha, base.df), _crit(s.alpha_hint, base.df)
        if k == s.confirm and abs(w.t) > crit and abs(w.change) >= s.min_effect and w.consistent:
            reason = f"the last {k} nights average {w.change:+.1%} vs {ref}; t={w.t:+.1f}, threshold {crit:.1f}"
            return Judgement(self._direction(w.d), w.change, pinned.value, reason)
        if abs(w1.t) > hint and abs(change1) >= s.min_effect:
            reason = f"tonight {change1:+.1%} vs {ref}; not confirmed over {s.confirm} nights"
            return Judgement(Verdict.UNCERTAIN, change1, pinned.value, reason)
        return Judgement(Verdict.SAME, change1, pinned.value, f"same: tonight {change1:+.1%} vs {ref}")
