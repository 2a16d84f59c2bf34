"""Statistics of timed blocks: known inputs, known answers, and coverage where it is claimed."""

import numpy as np
import pytest
from scipy import stats as sps

from replaybench.stats import DISTURBED, Estimate, StoppingRule, median_ci, typical, undisturbed, undisturbed_base


def test_median_ci_is_the_binomial_order_statistic_interval():
    x = np.arange(1.0, 101.0)  # 100 samples
    lo, hi = median_ci(x)
    # P(Binomial(100, 1/2) <= 39) = 0.0176 <= 0.025 < P(<= 40): the 40th and 61st order statistics.
    assert sps.binom.cdf(39, 100, 0.5) <= 0.025 < sps.binom.cdf(40, 100, 0.5)
    assert (lo, hi) == (40.0, 61.0)


def test_median_ci_with_too_few_samples_is_the_whole_range():
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)
    with pytest.raises(ValueError):
        median_ci([])


def test_median_ci_covers_the_true_median_as_promised():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        x = rng.lognormal(0.0, 0.5, 40)  # skewed, median exactly 1
        lo, hi = median_ci(x)
        hits += lo <= 1.0 <= hi
    assert 0.92 <= hits / 400 <= 0.99


def test_one_process_is_its_median_and_the_order_statistic_interval():
    x = np.linspace(1.0, 2.0, 41)
    e = typical([x])
    assert e.value == pytest.approx(1.5)
    assert (e.ci_low, e.ci_high) == median_ci(x)


def test_several_processes_are_the_geometric_mean_of_their_medians_with_a_t_interval():
    groups = [[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [40.0, 40.0, 41.0]]
    e = typical(groups)
    logs = np.log([11.0, 21.0, 40.0])
    half = sps.t.ppf(0.975, 2) * logs.std(ddof=1) / np.sqrt(3)
    assert e.value == pytest.approx(np.exp(logs.mean()))
    assert (e.ci_low, e.ci_high) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
    # One estimand: the figure is the centre of its interval on the log scale.
    assert np.sqrt(e.ci_low * e.ci_high) == pytest.approx(e.value)


def test_processes_that_agree_exactly_give_a_point_interval():
    e = typical([[5.0, 5.0], [5.0, 5.0], [5.0]])
    assert (e.value, e.ci_low, e.ci_high) == pytest.approx((5.0, 5.0, 5.0)) and e.rel_halfwidth == 0


def test_the_interval_over_processes_covers_the_typical_process_as_promised():
    # Processes differ by a random 10% (lognormal) around a typical 100; 40 noisy blocks each.
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        levels = 100 * np.exp(0.1 * rng.standard_normal(6))
        groups = [lv * np.exp(0.05 * rng.standard_normal(40)) for lv in levels]
        e = typical(groups)
        hits += e.ci_low <= 100 <= e.ci_high
    assert 0.91 <= hits / 400 <= 0.99


def test_relative_halfwidth():
    assert Estimate(10.0, 9.0, 11.5).rel_halfwidth == pytest.approx(0.125)
    assert Estimate(0.0, 0.0, 1.0).rel_halfwidth == float("inf")


def test_the_base_sits_in_the_undisturbed_cluster_and_only_disturbed_units_are_set_aside():
    # The H200 pattern: references near 0.55 ms on an undisturbed core, near 1.05 ms on a disturbed
    # one, 40% of units disturbed.
    rng = np.random.default_rng(2)
    fast = 0.55e-3 * (1 + 0.03 * rng.standard_normal(60))
    slow = 1.05e-3 * (1 + 0.03 * rng.standard_normal(40))
    base = undisturbed_base(np.concatenate([fast, slow]))
    assert 0.5e-3 < base < 0.56e-3
    before = np.concatenate([fast, slow])
    after = before.copy()
    after[0] = 1.1e-3  # the core turned slow during the first unit: its closing reference shows it
    kept = undisturbed(before, after, base)
    assert not kept[0] and kept[1:60].all() and not kept[60:].any()
    assert DISTURBED * base < slow.min()


def test_stopping_rule_waits_for_every_process_then_for_every_interval_then_the_budget():
    rule = StoppingRule(precision=0.02, min_units=6, budget_s=3.0)
    tight, wide = Estimate(10.0, 9.9, 10.1), Estimate(10.0, 9.0, 11.0)
    assert not rule.done([tight], [6, 5], 0.5)  # one process short of units
    assert not rule.done([tight], [], 0.5)  # too few processes have undisturbed units yet
    assert rule.done([tight, tight], [6, 8], 0.5)
    assert not rule.done([tight, wide], [6, 8], 2.9)  # the speedup, say, is not there yet
    assert rule.done([tight, wide], [6, 8], 3.0)  # budget spent: stop, and the flags say so


def test_settling_stops_from_half_the_budget_within_four_times_the_target():
    rule = StoppingRule(precision=0.02, min_units=6, budget_s=6.0, settle=True)
    near, wide = Estimate(10.0, 9.3, 10.7), Estimate(10.0, 8.9, 11.1)  # +/-7% and +/-11%
    assert not rule.done([near], [6, 8], 2.9)  # before half the budget: the target itself
    assert rule.done([near], [6, 8], 3.0)
    assert rule.done([near], [3, 4], 3.0)  # the fewest-units guard is waived from there
    assert not rule.done([near], [], 3.0)  # but not the figures resting on half the processes
    assert not rule.done([near, wide], [6, 8], 5.9)  # still too wide to act on: the rest of the budget
    assert rule.done([near, wide], [6, 8], 6.0)
    assert not StoppingRule(precision=0.02, min_units=6, budget_s=6.0).done([near], [6, 8], 3.0)
