"""A/B runs: two variants of the code under test (``replaybench.variants``) measured side by side.

Each of the ``processes`` cores runs one measuring process of A and one of B. Every config is
prepared in all of them and timed in rounds, the two processes of a core one right after the other,
alternately A first and B first (A B, B A, A B, ...): the two variants of a pair see the same core,
GPU and moment, so the host's drift, which moves eager time by up to 1.8x on an H200 VM within
seconds, hits both alike and cancels in their ratio.

B against A, per config and metric: each pair's ratio of B's figure to A's (``ratios`` says how it
pairs them), and their geometric mean with a Student-t 95% interval over the pairs. A metric reads
"slower"/"faster" (a time) or "lower"/"higher" (a speedup) where the interval excludes no change,
"no difference" where it holds no change and lies within +/- ``min_effect`` (it rules out any change
that large), and "inconclusive" otherwise (it holds no change, but also changes that large). Before any timing, B's eager outputs are checked
against A's on the same inputs: a config whose variants compute different things is not compared.

Torch-free: runs in the orchestrating process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats as sps

from .analysis import Units, assemble
from .params import MIN_EFFECT
from .results import ConfigResult, MeasureSettings
from .stats import CONFIDENCE, Estimate
from .variants import Variant
from .worker import (DEFAULT_TIMEOUT_S, Died, MeasuringProcess, ProcessGroup, Stuck, _release, crashed, gpu_slot,
                     measuring_cores, prepare_in, time_rounds)
from .workload import BenchConfig

Metric = Literal["time per call", "GPU time", "speedup"]


class Comparison(BaseModel):
    """B against A for one mode and metric of one config."""

    mode: str
    metric: Metric
    ratio: float | None = None  # B's figure over A's
    ci_low: float | None = None
    ci_high: float | None = None
    pairs: int = 0  # pairs of measuring processes the ratio rests on
    verdict: str  # slower, faster, lower, higher, no difference, inconclusive, not compared
    text: str  # what a reader reads: "B slower by 12% [8%, 16%]"


class ABResult(BaseModel):
    config: BenchConfig
    a: ConfigResult
    b: ConfigResult
    comparisons: list[Comparison] = Field(default_factory=list)
    output_differs: str | None = None  # why B's eager outputs are not A's, if they are not


def interval(log_ratios, confidence: float = CONFIDENCE) -> Estimate | None:
    """exp of the mean of the pairs' log ratios, with its Student-t interval over the pairs; None
    with fewer than two pairs."""
    logs = np.asarray([x for x in log_ratios if x is not None and np.isfinite(x)], dtype=float)
    if logs.size < 2:
        return None
    point = float(np.exp(logs.mean()))
    if np.ptp(logs) == 0:
        return Estimate(point, point, point)
    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return Estimate(point, float(np.exp(ci.low)), float(np.exp(ci.high)))


def ratio(a_values: list[float | None], b_values: list[float | None]) -> Estimate | None:
    """B/A from each pair's own figures (a process without one leaves its pair out)."""
    return interval([np.log(b / a) if a and b else None for a, b in zip(a_values, b_values)])


def judge(metric: str, estimate: Estimate | None, min_effect: float) -> tuple[str, str]:
    """(verdict, text) of one ratio, as the module's docstring says."""
    if estimate is None:
        return "inconclusive", "fewer than two pairs of processes gave this figure"
    change, lo, hi = estimate.value - 1, estimate.ci_low - 1, estimate.ci_high - 1
    interval = f"[{lo:+.1%}, {hi:+.1%}]"
    worse, better = ("lower", "higher") if metric == "speedup" else ("slower", "faster")
    what = "B's speedup" if metric == "speedup" else "B"
    if lo > 0 or hi < 0:
        word = ((better if change > 0 else worse) if metric == "speedup" else (worse if change > 0 else better))
        return word, f"{what} {word} by {abs(change):.1%} {interval}"
    if -min_effect < lo and hi < min_effect:
        return "no difference", f"no difference: {change:+.1%} {interval}, within +/-{min_effect:.0%}"
    return "inconclusive", f"inconclusive: {change:+.1%} {interval} reaches +/-{min_effect:.0%}"


def _gpu_medians(finishes: list[dict], mode: str) -> list[float | None]:
    out = []
    for fin in finishes:
        gpu = ((fin.get("gpu") or {}).get(mode) or ([], []))[0]
        out.append(float(np.median(gpu)) if gpu else None)
    return out


def _unit_log_ratio(a: np.ndarray, b: np.ndarray) -> float | None:
    """The median over units of log(B's unit / A's unit), unit j of each timed in the same round."""
    n = min(len(a), len(b))
    return float(np.median(np.log(b[:n] / a[:n]))) if n else None


def ratios(units_a: list[Units], units_b: list[Units], timed: list[str],
           finishes: tuple[list[dict], list[dict]] | None = None) -> dict[tuple[str, str], Estimate | None]:
    """B/A per (mode, metric): time per call of each timed mode, each speedup, and, once the
    processes have finished, GPU time.

    Time per call and speedup pair the units themselves: unit j of A and of B in a pair were timed
    in the same round, on the same core, milliseconds apart, so each pair's figure is the median of
    their unit-by-unit log ratios, every unit counted (the host's state, disturbed or not, is shared
    by the two). On H200 units this narrowed the eager interval from +/-6.1% (each process's own
    median compared) to +/-2.4% (median over 18 configs, benchmarks/ab_noise.py). GPU time, timed after the rounds, compares each process's
    median; it moves with where a process's memory lies, not with the host."""
    out: dict[tuple[str, str], Estimate | None] = {}

    def paired(values) -> Estimate | None:
        return interval([_unit_log_ratio(values(a), values(b)) for a, b in zip(units_a, units_b)])

    for mode in timed:
        out[(mode, "time per call")] = paired(lambda u: np.asarray(u.blocks[mode]))
        if mode != "eager" and "eager" in timed:
            out[(mode, "speedup")] = paired(lambda u: np.asarray(u.blocks["eager"]) / np.asarray(u.blocks[mode]))
        if finishes is not None and mode != "eager":
            out[(mode, "GPU time")] = ratio(_gpu_medians(finishes[0], mode), _gpu_medians(finishes[1], mode))
    return out


def comparisons(estimates: dict[tuple[str, str], Estimate | None], min_effect: float, pairs: int) -> list[Comparison]:
    out = []
    for (mode, metric), e in estimates.items():
        if metric == "GPU time" and e is None:
            continue  # not measured (no GPU, or a call that waits for it): nothing to compare
        verdict, text = judge(metric, e, min_effect)
        out.append(Comparison(mode=mode, metric=metric, ratio=e and e.value, ci_low=e and e.ci_low,
                              ci_high=e and e.ci_high, pairs=pairs, verdict=verdict, text=text))
    return out


def not_compared(timed: list[str], why: str) -> list[Comparison]:
    return [Comparison(mode=m, metric="time per call", verdict="not compared", text=f"not compared: {why}") for m in timed]


def _skipped_alike(mode: str, results) -> bool:
    """Skipped in both variants for one reason (no CUDA on this host): never a question to answer,
    where a mode that a single variant could time, or that failed, is named as not compared."""
    outcomes = {(r.status, r.reason) for result in results for r in result.modes if r.mode == mode}
    return len(outcomes) == 1 and next(iter(outcomes))[0] == "skipped"


class ABPool(ProcessGroup):
    """``processes`` pairs of measuring processes, A's and B's, pair i on core i; started in
    parallel once per run and timing one at a time."""

    def __init__(self, a: Variant, b: Variant, processes: int = 12, timeout_s: float = DEFAULT_TIMEOUT_S):
        if processes < 2:
            raise ValueError("an A/B run needs at least two measuring processes per variant")
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
        chosen = measuring_cores(cores, processes, gpu_slot())
        self.a = [MeasuringProcess(c, timeout_s, variant=a) for c in chosen]
        self.b = [MeasuringProcess(c, timeout_s, variant=b) for c in chosen]
        self.timeout_s = timeout_s

    @property
    def members(self) -> list[MeasuringProcess]:
        return [*self.a, *self.b]

    def environment(self, which: int) -> dict[str, Any]:
        side = (self.a, self.b)[which]
        return {**side[0].environment, "cpu_cores": [m.core for m in side], "processes": len(side)}

    def measure(self, config: BenchConfig, settings: MeasureSettings, min_effect: float = MIN_EFFECT) -> ABResult:
        """One config measured by both variants; a process that dies is replaced and the config
        measured again from the start, once."""
        began = time.monotonic()
        result = self._measure_twice(config, settings, min_effect)
        result.a.measuring_s = result.b.measuring_s = time.monotonic() - began  # a retry or a timeout included
        return result

    def _measure_twice(self, config, settings, min_effect) -> ABResult:
        reason = ""
        for attempt in (1, 2):
            deadline = time.monotonic() + self.timeout_s
            try:
                result = self._measure_once(config, settings, min_effect, deadline)
                result.a.attempts = result.b.attempts = attempt
                return result
            except Stuck as exc:
                _release(self.members)
                reason = f"timed out: no result within {self.timeout_s:g} s; the measuring process was killed{exc}"
                break
            except Died as exc:
                _release(self.members)
                reason = str(exc) + ("; retried once in a fresh process, which died too" if attempt == 2 else "")
        dead = crashed(config, settings, reason, attempt)
        return ABResult(config=config, a=dead, b=dead.model_copy(deep=True), comparisons=not_compared(settings.modes, reason))

    def _measure_once(self, config, settings, min_effect, deadline) -> ABResult:
        started = time.monotonic()
        # A mode failing in one variant (B cannot be captured, say) leaves the others to compare:
        # both variants are prepared in every process unless nothing can be timed there.
        prepared_a, reports_a = prepare_in(self.a, config, settings, deadline, options={"send": True}, whole=True)
        expected = reports_a[0].get("output")
        prepared_b, reports_b = prepare_in(self.b, config, settings, deadline,
                                           options={"expected": expected} if expected is not None else None, whole=True)
        differs = reports_b[0].get("output_differs") if expected is not None else None
        timed = [m for m in settings.modes if all(m in r["timed"] for r in [*reports_a, *reports_b])]
        pairs = list(zip(prepared_a, prepared_b))  # as many as the side that stopped first (a failure)
        if len(pairs) < 2:
            timed = []
        for unpaired in [*prepared_a[len(pairs):], *prepared_b[len(pairs):]]:
            if unpaired.alive:
                unpaired.request(("release",), deadline)
        # Members 2i and 2i+1 are pair i's A and B; in round r a pair times A then B where r + i is
        # even, B then A where it is odd: each variant goes first as often as second, in every pair.
        order = [m for pair in pairs for m in pair]

        def schedule(r: int) -> list[int]:
            return [2 * i + (((r + i) % 2 == 1) ^ k) for i in range(len(pairs)) for k in (0, 1)]

        def split(units: list[Units]) -> tuple[list[Units], list[Units]]:
            return units[0::2], units[1::2]

        def interim(units: list[Units]):
            if any(len(u) == 0 for u in units):
                return [], []
            ua, ub = split(units)
            estimates = ratios(ua, ub, timed)
            if any(e is None for e in estimates.values()):
                return [], []
            return list(estimates.values()), [len(u) for u in units]

        reports = [*reports_a, *reports_b]
        units, completed = time_rounds(order, timed, settings, deadline, reports, interim, schedule)
        if not completed:
            timed = []
        finished = [m.request(("finish", timed), deadline) if m.alive else {} for m in order]
        units_a, units_b = split(units)
        fin_a, fin_b = split(finished)
        measuring_s = time.monotonic() - started
        result_a = assemble(config, settings, reports_a, units_a if timed else [], fin_a if timed else [],
                            cpu_cores=[m.core for m in prepared_a], measuring_s=measuring_s)
        result_b = assemble(config, settings, reports_b, units_b if timed else [], fin_b if timed else [],
                            cpu_cores=[m.core for m in prepared_b], measuring_s=measuring_s)
        skipped_alike = [m for m in settings.modes if _skipped_alike(m, (result_a, result_b))]
        for result in (result_a, result_b):
            for r in result.modes:
                if r.status == "ok" and r.throughput is None:
                    r.status, r.reason = "skipped", "not timed: an A/B run times only what both variants could"
        untimed = [m for m in settings.modes if m not in timed and m not in skipped_alike]
        if differs:
            found = not_compared(timed, f"B computes something else ({differs})")
        else:
            found = comparisons(ratios(units_a, units_b, timed, (fin_a, fin_b)), min_effect, len(pairs)) if timed else []
        found += not_compared(untimed, "not measured in both variants (see their rows)")
        return ABResult(config=config, a=result_a, b=result_b, comparisons=found, output_differs=differs)
