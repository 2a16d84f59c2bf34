"""Statistics over block timings: the median with a distribution-free confidence interval, the
stopping rule, and the bootstrap interval of a speedup.

Every figure replaybench reports is a median over blocks (a block is many iterations timed as one),
because block times are skewed by host noise; the interval of the median comes from order
statistics (binomial), so it assumes nothing about the shape of that noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """A series of per-iteration times (seconds) summarized; plain data."""

    n: int
    median: float
    ci_low: float
    ci_high: float
    minimum: float
    maximum: float
    iqr: float

    @property
    def rel_halfwidth(self) -> float:
        """Half the width of the median's confidence interval, relative to the median."""
        return (self.ci_high - self.ci_low) / 2 / self.median if self.median > 0 else float("inf")


def median_ci(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics.

    The number of samples below the median is Binomial(n, 1/2); the interval runs between the order
    statistics that leave at most (1 - confidence)/2 of that distribution out on each side. With too
    few samples for the asked confidence the interval is the whole range.
    """
    x = np.sort(np.asarray(samples, dtype=float))
    n = x.size
    if n == 0:
        raise ValueError("no samples")
    alpha = 1 - confidence
    # Largest k with P(B <= k - 1) <= alpha/2: x[k-1] (1-based k) is the lower bound.
    k = int(sps.binom.ppf(alpha / 2, n, 0.5))
    while k > 0 and sps.binom.cdf(k - 1, n, 0.5) > alpha / 2:
        k -= 1
    if k < 1:
        return float(x[0]), float(x[-1])
    return float(x[k - 1]), float(x[n - k])


def summarize(samples) -> Summary:
    x = np.asarray(samples, dtype=float)
    lo, hi = median_ci(x)
    q1, q3 = np.percentile(x, [25, 75])
    return Summary(
        n=int(x.size),
        median=float(np.median(x)),
        ci_low=lo,
        ci_high=hi,
        minimum=float(x.min()),
        maximum=float(x.max()),
        iqr=float(q3 - q1),
    )


# Elements drawn at once when bootstrapping medians: bounds the memory of one draw (indices and values, 32 MiB each).
_DRAW_ELEMENTS = 4_000_000


def _resampled_medians(group: np.ndarray, shape: tuple[int, ...], rng) -> np.ndarray:
    """Medians of ``prod(shape)`` bootstrap resamples of ``group`` (each drawn with replacement,
    the size of the group), in an array of that shape."""
    count = int(np.prod(shape))
    per_draw = max(1, _DRAW_ELEMENTS // group.size)
    medians = np.empty(count)
    for start in range(0, count, per_draw):
        stop = min(count, start + per_draw)
        medians[start:stop] = np.median(group[rng.integers(0, group.size, (stop - start, group.size))], axis=1)
    return medians.reshape(shape)


def _hierarchical_medians(groups: list[np.ndarray], picks: np.ndarray, rng) -> np.ndarray:
    """For picks of processes (resamples x processes), the median of a fresh bootstrap resample of
    each picked process's blocks: the second stage of the hierarchical bootstrap, all at once."""
    out = np.empty(picks.shape)
    for i, group in enumerate(groups):
        chosen = picks == i
        out[chosen] = _resampled_medians(group, (int(chosen.sum()),), rng)
    return out


def speedup_ci(
    baseline, candidate, confidence: float = CONFIDENCE, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Speedup = median(baseline) / median(candidate), with a percentile bootstrap interval.

    ``baseline`` and ``candidate`` are block timings, either flat sequences (one measuring
    process) or lists of per-process sequences. With several processes, each process is one equal
    witness of the host's state: the speedup is the median over processes of each process's own
    speedup, whatever number of blocks each needed. The bootstrap is then hierarchical: processes
    are resampled first (the same picks for both modes, since both were measured in each process),
    then blocks within each picked process, so that the interval carries the process-to-process
    variation that blocks of one process cannot show; and it is never narrower than the Student-t
    interval over the processes' own speedups (see ``between_processes``).
    """
    a_groups, b_groups = as_groups(baseline), as_groups(candidate)
    if len(a_groups) != len(b_groups):
        raise ValueError("baseline and candidate must come from the same processes")
    n = len(a_groups)
    per_process = [np.median(a) / np.median(b) for a, b in zip(a_groups, b_groups)]
    point = float(np.median(per_process))
    if min(g.size for g in a_groups + b_groups) < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, (resamples, n))
    ratios = np.median(_hierarchical_medians(a_groups, picks, rng) / _hierarchical_medians(b_groups, picks, rng), axis=1)
    alpha = 1 - confidence
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    if n > 1:
        t_lo, t_hi = between_processes(per_process, confidence)
        lo, hi = min(lo, t_lo), max(hi, t_hi)
    return point, float(lo), float(hi)


def between_processes(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of the typical value of a positive figure measured once per process: Student t on
    the logs, with n - 1 degrees of freedom.

    With few processes (the default is 3) a percentile bootstrap over processes cannot reach past
    the range of the processes' own figures and covers far less often than it claims; the t
    quantile (4.3 for 3 processes) is the small-sample correction. Logs, because host noise is
    multiplicative and the figures are ratios or times.
    """
    logs = np.log(np.asarray(values, dtype=float))
    n = logs.size
    if n < 2:
        raise ValueError("needs two processes or more")
    half = sps.t.ppf(1 - (1 - confidence) / 2, n - 1) * logs.std(ddof=1) / np.sqrt(n)
    return float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def as_groups(samples) -> list[np.ndarray]:
    """Flat block timings -> one group; a list of sequences -> one group per process."""
    samples = list(samples)
    if samples and isinstance(samples[0], (list, tuple, np.ndarray)):
        return [np.asarray(g, dtype=float) for g in samples]
    return [np.asarray(samples, dtype=float)]


def summarize_groups(groups, confidence: float = CONFIDENCE, resamples: int = 2000, seed: int = 0) -> Summary:
    """Summary of blocks from several processes. The median is the median over processes of each
    one's median (processes weigh alike: one that needed ten times the blocks to meet the
    precision target is not ten times the witness); its interval is a hierarchical bootstrap
    (processes, then blocks), widened to the Student-t interval over the processes' medians where
    that is wider. Minimum, maximum and IQR are over all blocks. With one process it is
    ``summarize``."""
    groups = as_groups(groups)
    summary = summarize(np.concatenate(groups))
    if len(groups) == 1:
        return summary
    rng = np.random.default_rng(seed)
    n = len(groups)
    per_process = [np.median(g) for g in groups]
    medians = np.median(_hierarchical_medians(groups, rng.integers(0, n, (resamples, n)), rng), axis=1)
    alpha = 1 - confidence
    lo, hi = np.quantile(medians, [alpha / 2, 1 - alpha / 2])
    t_lo, t_hi = between_processes(per_process, confidence)
    return Summary(**{**summary.__dict__, "median": float(np.median(per_process)),
                      "ci_low": float(min(lo, t_lo)), "ci_high": float(max(hi, t_hi))})


@dataclass
class StoppingRule:
    """Repeat blocks until every series' median is known to ``precision`` (relative half-width of
    its 95% interval), after at least ``min_blocks`` blocks each, or until ``budget_s`` is spent.
    """

    precision: float = 0.01
    min_blocks: int = 10
    max_blocks: int = 2000
    budget_s: float = 3.0

    def met(self, samples) -> bool:
        if len(samples) < self.min_blocks:
            return False
        return summarize(samples).rel_halfwidth <= self.precision

    def done(self, series: list, elapsed_s: float) -> bool:
        if any(len(s) < self.min_blocks for s in series):
            return False
        if all(self.met(s) for s in series):
            return True
        return elapsed_s >= self.budget_s or any(len(s) >= self.max_blocks for s in series)


def interleave(stop: StoppingRule, timers: dict, clock) -> dict[str, list[float]]:
    """Run one block of each timer in turn (ABAB...) until ``stop`` is done.

    ``timers`` maps a name to a function that runs one block and returns seconds per iteration;
    ``clock`` returns seconds. Interleaving makes slow drift of the host hit every series alike.
    """
    samples: dict[str, list[float]] = {name: [] for name in timers}
    start = clock()
    while not stop.done(list(samples.values()), clock() - start):
        for name, run_block in timers.items():
            samples[name].append(run_block())
    return samples
