import numpy as np
import pytest

from replaybench.stats import StoppingRule, interleave, median_ci, speedup_ci, summarize


def test_median_ci_uses_binomial_order_statistics():
    # n=10: the 95% interval of the median is [x(2), x(9)] (coverage 97.9%).
    assert median_ci(range(1, 11)) == (2.0, 9.0)
    # n=100: [x(40), x(61)].
    assert median_ci(range(1, 101)) == (40.0, 61.0)
    # Order does not matter.
    assert median_ci(list(reversed(range(1, 101)))) == (40.0, 61.0)


def test_median_ci_with_too_few_samples_is_the_whole_range():
    assert median_ci([5, 1, 3, 2, 4]) == (1.0, 5.0)


def test_median_ci_covers_the_true_median_as_promised():
    rng = np.random.default_rng(1)
    true_median = np.log(2)  # of Exp(1): skewed, like host noise
    covered = 0
    for _ in range(2000):
        lo, hi = median_ci(rng.exponential(size=30))
        covered += lo <= true_median <= hi
    assert 0.94 <= covered / 2000 <= 0.995


def test_summary_figures():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.minimum == 1.0 and s.maximum == 100.0
    assert s.iqr == pytest.approx(2.0)
    assert s.n == 5


def test_speedup_is_baseline_over_candidate_with_an_interval_around_it():
    rng = np.random.default_rng(0)
    eager = 50e-6 * (1 + 0.05 * rng.standard_normal(40))
    graph = 10e-6 * (1 + 0.02 * rng.standard_normal(40))
    point, lo, hi = speedup_ci(eager, graph)
    assert point == pytest.approx(np.median(eager) / np.median(graph))
    assert 4.5 < lo < point < hi < 5.5


def test_speedup_interval_widens_with_noise():
    rng = np.random.default_rng(0)
    quiet = speedup_ci(10 + 0.01 * rng.standard_normal(30), 2 + 0.01 * rng.standard_normal(30))
    noisy = speedup_ci(10 + 1.0 * rng.standard_normal(30), 2 + 0.2 * rng.standard_normal(30))
    assert (noisy[2] - noisy[1]) > 10 * (quiet[2] - quiet[1])


def test_stopping_rule_stops_at_min_blocks_when_precise():
    rule = StoppingRule(precision=0.01, min_blocks=10, budget_s=100)
    assert not rule.done([[1.0] * 9], 0.0)
    assert rule.done([[1.0] * 10], 0.0)


def test_stopping_rule_waits_for_every_series_then_gives_up_at_the_budget():
    rng = np.random.default_rng(0)
    noisy = list(1 + 0.5 * rng.standard_normal(20) ** 2)
    rule = StoppingRule(precision=0.01, min_blocks=10, budget_s=2.0)
    assert not rule.met(noisy)
    assert not rule.done([[1.0] * 20, noisy], elapsed_s=1.0)
    assert rule.done([[1.0] * 20, noisy], elapsed_s=2.0)


def test_interleave_alternates_modes_and_stops_on_the_rule():
    order = []
    timers = {
        "eager": lambda: order.append("eager") or 1.0,
        "graph": lambda: order.append("graph") or 0.2,
    }
    ticks = iter(range(10_000))
    samples = interleave(StoppingRule(min_blocks=6, budget_s=1e9), timers, clock=lambda: next(ticks))
    assert order[:6] == ["eager", "graph"] * 3
    assert order == ["eager", "graph"] * (len(order) // 2)
    assert samples == {"eager": [1.0] * 6, "graph": [0.2] * 6}


def test_interleave_respects_the_time_budget():
    rng = np.random.default_rng(0)
    clock = iter(np.arange(0, 1000, 0.5))
    samples = interleave(
        StoppingRule(precision=0.001, min_blocks=6, budget_s=10),
        {"a": lambda: float(1 + rng.exponential())},
        clock=lambda: next(clock),
    )
    assert 6 <= len(samples["a"]) <= 25


def test_speedup_interval_covers_the_true_ratio_about_as_promised():
    """Percentile bootstrap of a ratio of medians, 40 blocks a mode, skewed (lognormal) noise."""
    rng = np.random.default_rng(2)
    trials, covered = 400, 0
    for seed in range(trials):
        eager = 40e-6 * rng.lognormal(0, 0.05, 40)  # median 40 us
        graph = 8e-6 * rng.lognormal(0, 0.02, 40)  # median 8 us: the true speedup is 5
        _, lo, hi = speedup_ci(eager, graph, seed=seed)
        covered += lo <= 5.0 <= hi
    assert 0.88 <= covered / trials <= 0.99


def test_bootstrap_draws_in_bounded_chunks_give_the_same_interval(monkeypatch):
    """Resamples are drawn in chunks to bound memory; the chunk size changes nothing."""
    import replaybench.stats as stats

    rng = np.random.default_rng(3)
    eager = [40e-6 * rng.lognormal(0, 0.05, n) for n in (25, 60, 140)]
    graph = [8e-6 * rng.lognormal(0, 0.02, n) for n in (30, 50, 200)]
    whole = (speedup_ci(eager, graph), stats.summarize_groups(eager))
    monkeypatch.setattr(stats, "_DRAW_ELEMENTS", 1000)
    assert (speedup_ci(eager, graph), stats.summarize_groups(eager)) == whole
