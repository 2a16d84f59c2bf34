import math

import numpy as np
import pytest

from replaybench.history import Judgement, Point, Verdict, env_difference, judge, judge_series

ENV = ("NVIDIA H200", "570.86", "12.8", "2.10.0")
TIME, SPEEDUP = False, True  # higher_is_better


def night(run_id, value, env=ENV, rel_ci=0.01):
    return Point(run_id, value, value * (1 - rel_ci), value * (1 + rel_ci), env)


def noisy(n, level=1e-4, sigma=0.02, seed=0, start=0, env=ENV):
    rng = np.random.default_rng(seed)
    return [night(start + i, level * math.exp(rng.normal(0, sigma)), env) for i in range(n)]


def stepped(flat=20, after=3, step=0.10, sigma=0.01, seed=1, level=1e-4):
    """A flat noisy history, then `after` nights `step` higher (the last one is tonight)."""
    pts = noisy(flat, level, sigma, seed)
    rng = np.random.default_rng(seed + 100)
    pts += [night(flat + i, level * (1 + step) * math.exp(rng.normal(0, sigma))) for i in range(after)]
    return pts[:-1], pts[-1]


def test_time_going_up_is_slower():
    history, tonight = stepped()
    j = judge(history, tonight, higher_is_better=TIME)
    assert j.verdict is Verdict.SLOWER
    assert j.change == pytest.approx(0.10, abs=0.02)
    assert j.baseline == pytest.approx(1e-4, rel=0.01)
    assert "step" in j.reason


def test_speedup_going_up_is_faster():
    # The very same values as a speedup: going up is better.
    history, tonight = stepped()
    j = judge(history, tonight, higher_is_better=SPEEDUP)
    assert j.verdict is Verdict.FASTER
    assert j.change == pytest.approx(0.10, abs=0.02)
    assert j.change == judge(history, tonight, higher_is_better=TIME).change


def test_time_going_down_is_faster_and_speedup_going_down_is_slower():
    history, tonight = stepped(step=-0.10, level=2.0)
    assert judge(history, tonight, TIME).verdict is Verdict.FASTER
    j = judge(history, tonight, SPEEDUP)
    assert j.verdict is Verdict.SLOWER
    assert j.change == pytest.approx(-0.10, abs=0.02)


def test_flat_noisy_history_is_same():
    pts = noisy(30, sigma=0.02, seed=3)
    j = judge(pts[:-1], pts[-1], TIME)
    assert j.verdict is Verdict.SAME
    assert abs(j.change) < 0.06
    # ...and no night of it is called a step.
    assert not {j.verdict for j in judge_series(pts, TIME)} & {Verdict.FASTER, Verdict.SLOWER}


def test_one_bad_night_is_uncertain_not_slower():
    pts = noisy(20, sigma=0.01, seed=4)
    bad = night(20, 1e-4 * 1.15)
    j = judge(pts, bad, TIME)
    assert j.verdict is Verdict.UNCERTAIN
    assert "one night off" in j.reason
    assert j.change == pytest.approx(0.15, abs=0.03)
    # Neither is the night after it, back to normal, nor the one after that.
    after = [night(21, 1.005e-4), night(22, 0.998e-4)]
    verdicts = [j.verdict for j in judge_series([*pts, bad, *after], TIME)[-2:]]
    assert Verdict.SLOWER not in verdicts


def test_two_off_nights_that_do_not_hold_are_withdrawn():
    # 10% up for two nights (1% noise): reported on the second, as the step must then hold on the
    # third; it does not, so the third night is not SLOWER and the change is withdrawn.
    history, _ = stepped(after=2)
    back = night(22, 1.002e-4)
    j = judge_series([*history, _, back], TIME)
    assert [x.verdict for x in j[-3:-1]] == [Verdict.UNCERTAIN, Verdict.SLOWER]
    assert j[-1].verdict is not Verdict.SLOWER
    assert "withdrawn" in j[-1].reason


def test_too_short_history_is_uncertain():
    pts = noisy(4)
    j = judge(pts[:-1], pts[-1], TIME)
    assert j.verdict is Verdict.UNCERTAIN
    assert "too short" in j.reason
    # Even a large change: 3 nights are not a baseline.
    assert judge(pts[:-1], night(9, 2e-4), TIME).verdict is Verdict.UNCERTAIN


def test_no_history_is_new():
    j = judge([], night(1, 1e-4), TIME)
    assert j == Judgement(Verdict.NEW, None, None, j.reason)


def test_env_change_names_the_field_and_is_never_slower():
    pts = noisy(20)
    new_env = ENV[:3] + ("2.11.0",)
    j = judge(pts, night(20, 1.3e-4, env=new_env), TIME)  # 30% slower, but on another torch
    assert j.verdict is Verdict.ENV_CHANGED
    assert "torch 2.10.0 -> 2.11.0" in j.reason
    assert "driver" not in j.reason
    assert j.change == pytest.approx(0.3, abs=0.03)
    # The second night on it has one comparable night only; history on the old key is never used.
    j2 = judge([*pts, night(20, 1.3e-4, env=new_env)], night(21, 1.31e-4, env=new_env), TIME)
    assert j2.verdict is Verdict.UNCERTAIN and "too short" in j2.reason
    # Later nights on the new key are judged against the new key only: SAME at 1.3e-4.
    later = noisy(8, level=1.3e-4, seed=9, start=20, env=new_env)
    assert judge([*pts, *later[:-1]], later[-1], TIME).verdict is Verdict.SAME


def test_env_difference_lists_every_changed_field():
    old = ("NVIDIA H200", "570.86", "12.8", "2.10.0")
    new = ("NVIDIA H200", "575.51", "12.9", "2.10.0")
    assert env_difference(old, new) == "driver 570.86 -> 575.51, CUDA 12.8 -> 12.9"


def test_pinned_baseline_is_the_reference():
    # The history drifted up 6% in two steps of 3%, each too small to confirm; against the
    # pinned run from before the drift, the last nights are slower.
    rng = np.random.default_rng(5)
    pinned = night(0, 1e-4)
    pts = [pinned] + [night(i, 1e-4 * (1 + 0.02 * (i // 5)) * math.exp(rng.normal(0, 0.005))) for i in range(1, 16)]
    tonight = pts[-1]
    j = judge(pts[:-1], tonight, TIME, pinned=pinned)
    assert j.verdict is Verdict.SLOWER
    assert j.baseline == pinned.value
    assert j.change == pytest.approx(0.06, abs=0.015)
    assert "pinned run 0" in j.reason
    # Without the pin the same night is judged against the recent level.
    assert judge(pts[:-1], tonight, TIME).verdict is not Verdict.SLOWER
    # A pinned run at tonight's level: SAME, and the change is relative to the pin.
    same = night(99, tonight.value * 1.005)
    j = judge(pts[:-1], tonight, TIME, pinned=same)
    assert j.verdict is Verdict.SAME
    assert j.change == pytest.approx(tonight.value / same.value - 1)
    # A pin from another environment is not compared.
    other = Point(98, 1e-4, env_key=ENV[:3] + ("2.9.0",))
    j = judge(pts[:-1], tonight, TIME, pinned=other)
    assert j.verdict is Verdict.ENV_CHANGED and "torch 2.9.0 -> 2.10.0" in j.reason


def test_step_is_reported_until_it_holds_then_the_new_level_is_the_baseline():
    history, tonight = stepped(after=8)
    verdicts = [j.verdict for j in judge_series([*history, tonight], TIME)]
    # One night off; two nights at +10% with 1% noise: the step (reported, to hold); it holds on
    # the third; then the new level is the baseline.
    assert verdicts[20:] == [Verdict.UNCERTAIN, Verdict.SLOWER, Verdict.SLOWER] + [Verdict.SAME] * 5
    reason = judge(history, tonight, TIME).reason
    assert "level changed +" in reason and "run 20" in reason


def test_judge_is_the_last_night_of_judge_series():
    pts = noisy(40, seed=11)
    series = judge_series(pts, TIME)
    for n in (0, 3, 5, 17, 39):
        assert judge(pts[:n], pts[n], TIME) == series[n]


def _rates(n_histories: int, seed: int):
    """Detection of 5% steps within 3 nights, and false alarms per 100 step-free nights, 2% noise."""
    rng = np.random.default_rng(seed)
    found = alarms = nights = 0
    for i in range(n_histories):
        hib = bool(i % 2)
        sign = 1 if i % 4 < 2 else -1
        expected = Verdict.FASTER if (sign > 0) == hib else Verdict.SLOWER
        at = int(rng.integers(15, 58))
        x = rng.normal(0, 0.02, 60) + np.where(np.arange(60) >= at, np.log1p(sign * 0.05), 0.0)
        verdicts = [j.verdict for j in judge_series([Point(k, float(np.exp(v))) for k, v in enumerate(x)], hib)]
        found += expected in verdicts[at : at + 3]
        y = rng.normal(0, 0.02, 60)
        verdicts = [j.verdict for j in judge_series([Point(k, float(np.exp(v))) for k, v in enumerate(y)], hib)]
        alarms += sum(v in (Verdict.FASTER, Verdict.SLOWER) for v in verdicts[5:])
        nights += 55
    return found / n_histories, 100 * alarms / nights


def test_detection_and_false_alarm_rates_on_synthetic_histories():
    detected, false_alarms = _rates(200, seed=2024)
    # The benchmark (1000 histories each) gives 91.5% and 0.74 per 100 nights; these 200 give 94%
    # and 0.69. The bounds leave room for the sampling error of 200 histories (sd about 2% and 0.15)
    # and are the brief's false-alarm target.
    assert detected >= 0.85
    assert false_alarms <= 1.0


def back_to_the_old_level(nights_slower, seed=0):
    """30 steady nights (1% noise), `nights_slower` nights 6% slower, then six back at the old level."""
    rng = np.random.default_rng(seed)
    factors = [1.0] * 30 + [1.06] * nights_slower + [1.0] * 6
    return [night(i, 1e-4 * f * math.exp(rng.normal(0, 0.01))) for i, f in enumerate(factors)]


def test_a_young_level_that_steps_back_is_withdrawn_not_reported_as_a_step_back():
    verdicts = judge_series(back_to_the_old_level(3), TIME)
    assert Verdict.SLOWER in [j.verdict for j in verdicts[30:33]]
    back = verdicts[33:]
    assert Verdict.FASTER not in [j.verdict for j in back]
    withdrawn = [j for j in back if "back at the level before it" in j.reason]
    assert withdrawn and withdrawn[0].verdict == Verdict.SAME
    assert [j.verdict for j in back][-2:] == [Verdict.SAME, Verdict.SAME]


def test_a_level_that_held_then_steps_back_is_reported_as_a_step_back():
    verdicts = judge_series(back_to_the_old_level(12), TIME)
    assert Verdict.SLOWER in [j.verdict for j in verdicts[30:33]]
    assert all(j.verdict == Verdict.SAME for j in verdicts[34:42])  # the new level is the baseline
    assert Verdict.FASTER in [j.verdict for j in verdicts[42:]]
    assert not any("back at the level before it" in j.reason for j in verdicts[42:])
