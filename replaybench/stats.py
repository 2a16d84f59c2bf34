"""Statistics of timed blocks: what a reported figure is, its 95% interval, which blocks count,
and when to stop measuring.

The unit of measurement is the *unit*: one block of each mode (eager, graph, ...) timed back to
back in one measuring process, bracketed by two timings of a fixed CPU reference block
(``engine.reference_block``). A unit whose reference took ``DISTURBED`` times the host's
undisturbed reference time or more was timed while its core ran slow and is set aside: on the H200
VMs each vCPU, independently of the others, spent 0.5-3 s at a time running the reference about
1.8-2x and eager about 1.4-1.5x slower (``benchmarks/host_noise.py``). A figure describes the host
at its own speed, and the share set aside is reported with it. What the filter cannot see is a
change of the whole host's speed, on every core at once, over tens of seconds: there the
reference moves with eager, and ``ModeResult.host_normalised`` (eager scaled to a host of a fixed
reference time, ``analysis.Units.at_standard_host``) is the steadier figure across runs
(``benchmarks/interval_calibration.py``). Graph replay, which the
GPU paces, is not slowed by a slow core: its figure counts every unit (``analysis.GPU_PACED``).

A reported figure is the *typical process's* median: each measuring process's median over its
kept blocks (for a speedup, over its kept units' eager/mode ratios: the two blocks of a unit were
timed within milliseconds of each other, so their ratio cancels the host's drift), then the
geometric mean over processes, with a Student-t interval over the processes' logs. Each process is
one equal witness of a host state: the spread between processes carries every source of
variation that differs between them (core, memory layout, time), which blocks of one process
cannot show. With one process the interval is the order-statistic interval of its median.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
DISTURBED = 1.5  # a reference block this many times its undisturbed time marks a disturbed unit
# Percentile of a config's reference blocks taken as its undisturbed time: on the H200 VMs the
# references fall in two clusters about 1.8-2x apart, the fast one holding 25-60% of the units; a
# low percentile stays in it (the 25th flipped between the clusters from run to run there).
BASE_QUANTILE = 10


@dataclass(frozen=True)
class Estimate:
    """A reported figure and its 95% interval."""

    value: float
    ci_low: float
    ci_high: float

    @property
    def rel_halfwidth(self) -> float:
        if not self.value > 0 or not np.isfinite(self.ci_high - self.ci_low):
            return float("inf")
        return (self.ci_high - self.ci_low) / 2 / self.value


def median_ci(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval of the median from order statistics (binomial); with too few
    samples for the asked confidence, the whole range."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    ci = sps.quantile_test(x, p=0.5).confidence_interval(confidence)
    lo = ci.low if np.isfinite(ci.low) else x.min()
    hi = ci.high if np.isfinite(ci.high) else x.max()
    return float(lo), float(hi)


def typical(per_process: list, confidence: float = CONFIDENCE) -> Estimate:
    """The typical process's median of a positive quantity, from each process's samples (a list
    of sequences, one per process).

    Each process gives its median; the figure is their geometric mean, and its interval the
    Student-t interval of the mean of their logs (n - 1 degrees of freedom), since host noise is
    multiplicative. With one process: its median and the order-statistic interval of it.
    """
    groups = [np.asarray(g, dtype=float) for g in per_process if len(g)]
    if not groups:
        raise ValueError("no samples")
    if len(groups) == 1:
        lo, hi = median_ci(groups[0], confidence)
        return Estimate(float(np.median(groups[0])), lo, hi)
    logs = np.log([np.median(g) for g in groups])
    point = float(np.exp(logs.mean()))
    if np.ptp(logs) == 0:  # every process gave the same figure
        return Estimate(point, point, point)
    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return Estimate(point, float(np.exp(ci.low)), float(np.exp(ci.high)))


def undisturbed_base(refs) -> float:
    """The host's undisturbed reference time for one config: a low percentile of its reference
    blocks over every process (whose cores are disturbed independently). Per config, because the
    reference's own time depends on what ran before it (the cache a CPU workload leaves)."""
    return float(np.percentile(np.asarray(refs, dtype=float), BASE_QUANTILE))


def undisturbed(ref_before, ref_after, base: float) -> np.ndarray:
    """Per unit: True where neither reference block around it shows the core disturbed."""
    worst = np.maximum(np.asarray(ref_before, dtype=float), np.asarray(ref_after, dtype=float))
    return worst < DISTURBED * base


SETTLE = 4  # from half the budget on, intervals within this many times the target will do


@dataclass
class StoppingRule:
    """Keep adding rounds until every reported interval (each mode's figure and each speedup) is
    within ``precision`` of its figure, once every process has ``min_units`` kept units; or stop
    when ``budget_s`` is spent.

    With ``settle``, rounds also stop from half the budget on once every interval is within
    ``SETTLE`` times the target, ``min_units`` waived (on the H200 a process often kept fewer than
    six undisturbed units in 3 s, which alone carried almost every config to its budget). The
    budget's second half then goes only to configs still too wide to act on (on the H200, one whose
    processes' cores ran slow most of the time rested on two processes at +/-72%), not to configs
    already at a few percent."""

    precision: float = 0.02
    min_units: int = 6
    budget_s: float = 6.0
    settle: bool = False

    def done(self, estimates: list[Estimate], kept_per_process: list[int], elapsed_s: float) -> bool:
        if elapsed_s >= self.budget_s:
            return True
        if not kept_per_process:
            return False
        if self.settle and elapsed_s >= self.budget_s / 2:
            return bool(estimates) and all(e.rel_halfwidth <= SETTLE * self.precision for e in estimates)
        if min(kept_per_process) < self.min_units:
            return False
        return all(e.rel_halfwidth <= self.precision for e in estimates)
