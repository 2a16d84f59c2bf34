"""Intervals, the disturbance filter and the stopping rule on real H200 noise (and H100 runs of the
default suite and of repeated configs): the timed units of repeated runs on H200 VMs kept in benchmarks/data
(benchmarks/data/README.md says how they were made). Synthetic noise is in test_stats.py and
test_analysis.py; these hold the statistics to the widths and the noise the product meets on the
machine it is for."""

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from replaybench.analysis import Units, figures, interim
from replaybench.stats import StoppingRule

from .helpers import benchmark

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
MODES = ["eager", "graph"]
NEVER = float("inf")  # a base no reference reaches: every unit counts


def processes(units: dict, count: int | None = None) -> list[Units]:
    """The measuring processes of one stored config, optionally only their first ``count`` units."""
    before = units.get("ref_before") or units["ref"]
    after = units.get("ref_after") or units["ref"]
    out = []
    for e, g, b, a in zip(units["eager"], units["graph"], before, after):
        k = len(e) if count is None else count
        out.append(Units(ref_before=list(b[:k]), ref_after=list(a[:k]), blocks={"eager": list(e[:k]), "graph": list(g[:k])}))
    return out


@pytest.fixture(scope="module")
def calibration():
    """(workload, stored units) for each config of each H200 calibration run with raw units."""
    saved = json.loads((DATA / "h200-calibration-2.json").read_text())
    return [(row["workload"], row["units"]) for run in saved["runs"] for row in run]


def test_speedup_intervals_from_h200_units_are_tight_enough_to_act_on(calibration):
    widths = [figures(processes(u), MODES).speedup["graph"].rel_halfwidth for _, u in calibration]
    assert len(widths) == 18
    assert statistics.median(widths) <= 0.08 and max(widths) <= 0.20


def test_setting_disturbed_units_aside_is_what_narrows_them(calibration):
    kept = [figures(processes(u), MODES) for _, u in calibration]
    every = [figures(processes(u), MODES, base=NEVER) for _, u in calibration]
    assert all(not f.masks[0].all() for f in kept[:1])  # units were set aside
    narrow = statistics.median(f.speedup["graph"].rel_halfwidth for f in kept)
    wide = statistics.median(f.speedup["graph"].rel_halfwidth for f in every)
    assert narrow < 0.5 * wide


def test_graph_replay_and_its_gpu_time_are_steady_on_h200(calibration):
    widths = [figures(processes(u), MODES).throughput["graph"].rel_halfwidth for _, u in calibration]
    assert statistics.median(widths) <= 0.02


def test_the_stopping_rule_stops_on_the_reported_interval_with_real_units(calibration):
    """Replaying each config's units round by round (two units per process a round, as measured):
    the rule stops at the first round where every reported interval is within the target, not
    before; quiet configs stop early and noisy ones run on."""
    rule = StoppingRule(precision=0.05, min_units=6, budget_s=NEVER)
    stopped_early = ran_on = 0
    for _, u in calibration:
        total = min(len(e) for e in u["eager"])
        stop = None
        for k in range(2, total + 1, 2):
            f = figures(processes(u, k), MODES)
            kept = [int(f.masks[i].sum()) for i in f.used]
            if rule.done(f.estimates, kept if 2 * len(f.used) >= len(f.masks) else [], 0.0):
                stop = k
                break
            previous = f
        if stop is None:
            ran_on += 1
            continue
        assert all(e.rel_halfwidth <= 0.05 for e in f.estimates)
        if stop > 6:  # the round before, something was still too wide (or too few units)
            assert any(e.rel_halfwidth > 0.05 for e in previous.estimates) or min(
                int(m.sum()) for m in previous.masks) < 6
        stopped_early += stop < total
    assert stopped_early >= 6 and ran_on >= 1


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Per config of the default suite's H200 run (3 s of rounds each; benchmarks/data/README.md),
    its measuring processes' units as stored."""
    from replaybench.analysis import stored_units
    from replaybench.storage import Store

    copy = tmp_path_factory.mktemp("suite") / "suite.db"
    copy.write_bytes((DATA / "h200-default-suite-run-2.db").read_bytes())
    rows: dict = defaultdict(dict)
    for r in Store(f"sqlite:///{copy}").run(1).results:
        if r.status == "ok":
            rows[(r.workload, r.params_key)][r.mode] = r
    return {key: stored_units(modes) for key, modes in rows.items()}


def cut(units: list[Units], k: int) -> list[Units]:
    return [Units(u.ref_before[:k], u.ref_after[:k], {m: b[:k] for m, b in u.blocks.items()}) for u in units]


def replay_rounds(units: list[Units], rule: StoppingRule, budget_units: int) -> int:
    """Units per process at which ``rule`` stops, replaying stored units two a round with the
    budget spent at ``budget_units`` (time stands in as units timed)."""
    for k in range(2, budget_units + 1, 2):
        if rule.done(*interim(cut(units, k), MODES), rule.budget_s * k / budget_units):
            return k
    return budget_units


def test_the_budgets_second_half_goes_to_the_configs_still_too_wide_to_act_on(suite):
    """The H200 suite's units replayed under the settling rule, each config's stored length as its
    budget: most configs stop past half of it, within 4x the target; the one whose figure rested
    on two processes (+/-95% at half the budget) carries on to the end and comes out narrower.
    Without settling, the fewest-units guard alone carries almost every config to the budget."""
    settling = StoppingRule(precision=0.02, min_units=6, budget_s=6.0, settle=True)
    plain = StoppingRule(precision=0.02, min_units=6, budget_s=6.0)
    early, to_the_end, plain_to_the_end = [], [], 0
    for key, units in suite.items():
        total = min(len(u) for u in units) // 2 * 2
        stop = replay_rounds(units, settling, total)
        if stop < total:
            assert stop >= total // 2
            early.append(max(e.rel_halfwidth for e in figures(cut(units, stop), MODES).estimates))
        else:
            to_the_end.append((max(e.rel_halfwidth for e in figures(cut(units, total // 2), MODES).estimates),
                               max(e.rel_halfwidth for e in figures(units, MODES).estimates)))
        plain_to_the_end += replay_rounds(units, plain, total) == total
    assert len(suite) == 19 and len(early) >= 15 and max(early) <= 0.08
    at_half, at_end = max(to_the_end)
    assert at_half > 0.5 and at_end < at_half
    assert plain_to_the_end >= 17


@pytest.fixture(scope="module")
def trace():
    """The host-noise trace of another H200 VM: per config, rounds of four processes in turn."""
    rows = [json.loads(line) for line in gzip.open(DATA / "h200-host-noise.jsonl.gz", "rt")]
    by_config = defaultdict(list)
    for r in rows:
        if r["exp"] == "trace":
            by_config[r["workload"]].append(r)
    return by_config


def window(rounds, start: float, seconds: float) -> list[Units]:
    """The units of rounds that began in [start, start + seconds); each round's reference was
    timed before its two units only, so it stands on both sides of both."""
    t0 = rounds[0]["t"]
    out = [Units() for _ in range(4)]
    for r in rounds:
        if start <= r["t"] - t0 < start + seconds:
            u = out[r["proc"]]
            for e, g in zip(r["eager"], r["graph"]):
                u.add({"ref": [r["ref"], r["ref"]], "eager": [e], "graph": [g]})
    return out


def test_on_a_second_vm_the_filter_narrows_three_second_windows_too(trace):
    assert len(trace) == 8
    kept, every = [], []
    for rounds in trace.values():
        for start in (0.0, 4.0, 8.0, 12.0):
            units = window(rounds, start, 3.0)
            kept.append(figures(units, MODES).speedup["graph"].rel_halfwidth)
            every.append(figures(units, MODES, base=NEVER).speedup["graph"].rel_halfwidth)
    assert statistics.median(kept) <= 0.08 and statistics.median(kept) < statistics.median(every)


def test_the_reference_block_sees_what_slows_eager_on_a_core(trace):
    """Within a config, units whose reference ran slow ran eager slow too (the filter's premise)."""
    for rounds in trace.values():
        ref = np.array([r["ref"] for r in rounds])
        eager = np.array([np.median(r["eager"]) for r in rounds])
        assert np.corrcoef(np.log(ref), np.log(eager))[0, 1] > 0.6


@pytest.mark.parametrize("run", ["h200-default-suite-run-2.db", "h200-default-suite-run-3.db"])
def test_a_slow_core_slows_eager_but_not_graph_replay_so_graph_figures_count_every_process(run, tmp_path):
    """The premise of ``analysis.GPU_PACED`` on the H200 default-suite runs: within a process, graph
    blocks timed while its core ran slow match its undisturbed ones, eager blocks do not; the graph
    figure therefore rests on all six processes, where eager's often rests on three or four."""
    from replaybench.analysis import stored_units
    from replaybench.storage import Store

    copy = tmp_path / run
    copy.write_bytes((DATA / run).read_bytes())
    store = Store(f"sqlite:///{copy}")
    rows: dict = defaultdict(dict)
    for r in store.run(1).results:
        rows[r.params_key + r.workload][r.mode] = r
    slower: dict[str, list[float]] = defaultdict(list)
    for modes in rows.values():
        units = stored_units(modes)
        f = figures(units, ["eager", "graph"])
        for u, kept in zip(units, f.masks):
            if kept.sum() >= 3 and (~kept).sum() >= 3:
                for mode in ("eager", "graph"):
                    blocks = np.asarray(u.blocks[mode])
                    slower[mode].append(np.median(blocks[~kept]) / np.median(blocks[kept]) - 1)
        assert len(f.counted("graph")[1]) == len(units) == 6
        assert len(f.counted("eager")[1]) == len(f.used)
    assert len(slower["graph"]) >= 30
    assert abs(statistics.median(slower["graph"])) < 0.01 and max(map(abs, slower["graph"])) < 0.05
    assert statistics.median(slower["eager"]) > 0.2
    assert sum(len(f) < 6 for f in [figures(stored_units(m), ["eager", "graph"]).used for m in rows.values()]) >= 10


def test_the_previous_engines_h200_suite_printed_the_intervals_the_readme_starts_from(tmp_path):
    """The README's starting point, read from the previous engine's own run (three processes in
    sequence, a t interval over them): speedup half-widths median 18.2%, largest 128.6%, 9 of 19
    wider than +/-50%, as that engine stored and printed them."""
    from replaybench.storage import Store

    suite_intervals = benchmark("suite_intervals")
    copy = tmp_path / "previous.db"
    copy.write_bytes((DATA / "h200-previous-engine-suite.db").read_bytes())  # opening it upgrades the schema
    store = Store(f"sqlite:///{copy}")
    speedup = [suite_intervals.config_widths(modes, recompute=False)["speedup"][0]
               for modes in suite_intervals.configs(store.run(1)).values()]
    store.engine.dispose()
    assert len(speedup) == 19
    assert round(statistics.median(speedup), 3) == 0.182 and round(max(speedup), 3) == 1.286
    assert sum(w > 0.5 for w in speedup) == 9


@pytest.mark.parametrize("run, above_2_percent, normalised_configs", [
    ("h200-default-suite-run-3.db", 0, 19), ("h100-default-suite-run.db", 0, 19), ("h100-default-suite-run-2.db", 0, 19),
    ("h100-default-suite-run-3.db", 1, 19), ("h100-default-suite-run-4.db", 0, 19), ("h100-default-suite-run-5.db", 0, 19),
    ("h100-default-suite-run-7.db", 1, 19), ("h100-default-suite-run-8.db", 0, 19), ("h100-default-suite-run-9.db", 1, 18),
    ("h200-default-suite-run-4.db", 0, 19)])
def test_the_default_suites_intervals_recomputed_from_real_units_are_narrow_enough_to_act_on(
        run, above_2_percent, normalised_configs, tmp_path):
    """The single run's aims, on the default suites measured with the settling rule (an H200 VM and eight
    H100 VMs): speedup half-widths median <= 8% and none above 20%, graph time per call and GPU time
    within 2% (on three H100 VMs one config's graph a hair above: 2.0%, 2.1% and 2.0% printed, none
    above 2.5%), and the host-normalised speedup as the speedup, recomputed by this checkout from
    the stored units. (The H200 run without the settling rule, h200-default-suite-run-2.db, printed a
    72% speedup interval.)"""
    from replaybench.storage import Store

    suite_intervals = benchmark("suite_intervals")
    copy = tmp_path / run
    copy.write_bytes((DATA / run).read_bytes())
    store = Store(f"sqlite:///{copy}")
    widths = [suite_intervals.config_widths(modes, recompute=True) for modes in suite_intervals.configs(store.run(1)).values()]
    store.engine.dispose()
    assert len(widths) == 19
    speedup = [w["speedup"][0] for w in widths]
    assert statistics.median(speedup) <= 0.08 and max(speedup) <= 0.20
    for figure in ("graph", "graph GPU"):
        graph = [w[figure][0] for w in widths]
        assert sum(g > 0.02 for g in graph) == above_2_percent and max(graph) <= 0.025
    # The speedup with the host's speed taken out: as narrow, where given (not for a graph the core paces:
    # seed_mlp's on run-9's host).
    normalised = [w["normalised"][0] for w in widths if w["normalised"][0] is not None]
    assert len(normalised) == normalised_configs and statistics.median(normalised) <= 0.08 and max(normalised) <= 0.20


def test_passes_are_combined_as_witnesses_of_the_host_at_their_time():
    """Each pass's figure is one witness: the geometric mean over passes, and a t interval with
    passes - 1 degrees of freedom (not one over every process of every pass)."""
    calibration = benchmark("interval_calibration")
    figures_of = [(7.0, 40e-6), (8.0, 44e-6), (6.5, 38e-6)]
    rows = [{"workload": "w", "params": {"x": 1}, "wall_s": 3.0, "pass": p, "eager_normalised": 0.1 * (p + 1),
             "host_disturbed": 0.5, "metrics": {"speedup": [s, s * 0.99, s * 1.01], "eager": [e, e * 0.99, e * 1.01]}}
            for p, (s, e) in enumerate(figures_of)]
    rows += [{**r, "workload": "v"} for r in rows]
    combined = calibration.combine_passes(rows)
    assert [r["workload"] for r in combined] == ["w", "v"]
    row = combined[0]
    logs = np.log([s for s, _ in figures_of])
    half = 4.303 * logs.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 df)
    value, low, high = row["metrics"]["speedup"]
    assert value == pytest.approx(np.exp(logs.mean()))
    assert (low, high) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)), rel=1e-3)
    assert row["wall_s"] == 9.0 and len(row["passes"]) == 3
    assert row["eager_normalised"] == pytest.approx(np.exp(np.mean(np.log([0.1, 0.2, 0.3]))))
    single = [{k: v for k, v in r.items() if k != "pass"} for r in rows]
    assert calibration.combine_passes(single) == single


def test_h100_runs_taken_as_four_passes_promised_intervals_that_hold_the_typical_speedup():
    """The first look at passes (README): the H100's five repeated runs of the six noisiest configs,
    every four taken as the passes of one run, held the median of those combined figures in >= 90%
    at a median half-width <= 8% (none above 20%), where a single run's interval held the median of
    the runs in under 70%. The choices of four share runs; measured passes did not bear it out
    (the next test)."""
    calibration = benchmark("interval_calibration")
    runs = json.loads((DATA / "h100-calibration.json").read_text())["runs"]

    def speedups(runs):
        held, widths = [], []
        for i in range(len(runs[0])):
            values = [run[i]["metrics"]["speedup"] for run in runs]
            center = statistics.median(v[0] for v in values)
            held += [lo <= center <= hi for _, lo, hi in values]
            widths += [(hi - lo) / 2 / v for v, lo, hi in values]
        return np.mean(held), statistics.median(widths), max(widths)

    single_held, _, _ = speedups(runs)
    held, median_width, widest = speedups(calibration.as_passes(runs, 4))
    assert single_held < 0.7
    assert held >= 0.9 and median_width <= 0.08 and widest <= 0.20


def test_measured_passes_saw_host_states_that_move_eager_but_not_eager_over_the_reference():
    """Four passes per config in each of two runs on an H100 VM (h100-calibration-passes.json): the
    host went between states whose eager times differed by up to 1.7x, so the t interval over
    passes was wide (median half-width above 8%), that of the speedup with the host's speed taken
    out far narrower; and eager over the host reference as the file stored it (what the report showed
    and nightly verdicts judged eager on then) moved less than half as much as eager across the same
    eight passes of each config."""
    calibration = benchmark("interval_calibration")
    runs = json.loads((DATA / "h100-calibration-passes.json").read_text())["runs"]
    assert len(runs) == 2 and all(len(row["passes"]) == 4 for run in runs for row in run)
    recombined = [calibration.as_run(run) for run in calibration.recompute(runs)]
    widths = [(hi - lo) / 2 / v for run in recombined for row in run for v, lo, hi in [row["metrics"]["speedup"]]]
    assert statistics.median(widths) > 0.08
    # The same passes' speedup with the host's speed taken out (eager scaled by the reference, per
    # graph time) is far narrower, and each run's interval holds the other run's figure, or misses it by a hair.
    # A pass whose graph replay a slow core slowed makes no such figure, nor does its config's run.
    normalised = [[row["metrics"].get("normalised_speedup") for row in run] for run in recombined]
    both = [(a, b) for a, b in zip(*normalised) if a and b]
    assert len(both) >= 5
    assert statistics.median((hi - lo) / 2 / v for pair in both for v, lo, hi in pair) < 0.5 * statistics.median(widths)
    # Each run's interval over its four passes holds the other run's figure, or misses it by a hair.
    checks = [(v, lo, hi) for (v1, lo1, hi1), (v2, lo2, hi2) in both for v, lo, hi in ((v2, lo1, hi1), (v1, lo2, hi2))]
    assert sum(lo <= v <= hi for v, lo, hi in checks) >= 0.8 * len(checks)
    assert all(lo / 1.02 <= v <= hi * 1.02 for v, lo, hi in checks)
    # and each config's interval over its four passes holds the median of the two runs: 11 of 11
    count, share, _, _ = holding(recombined, "normalised_speedup")
    assert (count, share) == (11, 1.0)
    for i in range(len(runs[0])):
        passes = [p for run in runs for p in run[i]["passes"]]
        eager = np.log([p["metrics"]["eager"][0] for p in passes])
        over_reference = np.log([p["eager_normalised"] for p in passes])
        assert over_reference.std(ddof=1) < 0.5 * eager.std(ddof=1), passes[0]["workload"]


# Every kept file of repeated runs with raw units, each pass read as a run: (runs per config, runs whose
# host-normalised speedup held the median of its config's runs, runs that made the figure).
REPEATED = {"h100-calibration.json": (5, 30, 30), "h200-calibration-2.json": (3, 17, 18),
            "h100-calibration-passes.json": (8, 45, 47), "h100-calibration-3.json": (5, 25, 29),
            "h100-calibration-4.json": (5, 26, 30), "h100-calibration-5.json": (5, 25, 30)}


@pytest.mark.parametrize("name", REPEATED)
def test_a_single_runs_speedup_with_the_host_speed_taken_out_holds_across_runs_where_the_speedup_does_not(name):
    """Repeated runs on an H200 VM and five H100 VMs (one of them in 1.5-s passes, each read as a run):
    over its processes, the engine's host-normalised speedup held the median of the runs in >= 80% of
    each file's runs (>= 90% pooled, below) at a median half-width <= 8% (none above 20%), where the
    speedup's interval held it in under 65%. (The first five files held >= 86%; the sixth, measured
    after HOST_ELASTICITY was chosen, 83%.)"""
    runs, held, made = REPEATED[name]
    saved = single_pass_runs(name)
    assert len(saved) == runs
    count, share, median_width, widest = holding(saved, "normalised_speedup")
    assert (count, round(count / share)) == (held, made)
    assert share >= 0.80 and median_width <= 0.08 and widest <= 0.20
    assert holding(saved, "speedup")[1] < 0.65


def pooled(files, metric="normalised_speedup"):
    """``holding`` over several files: runs held, runs, and the median and largest half-width over
    every run."""
    hits, widths = [], []
    for name in files:
        file_hits, file_widths = held(single_pass_runs(name), metric)
        hits += file_hits
        widths += file_widths
    return sum(hits), len(hits), statistics.median(widths), max(widths)


def test_eager_moves_with_the_host_reference_to_a_power_below_one_and_the_engine_takes_that_power_out(monkeypatch):
    """Over every kept file of repeated runs, the host-normalised speedup's interval held the median
    of its config's runs in 168 of 184 runs (91%) at half-widths of 4.5% median and none above 20%,
    with the engine's HOST_ELASTICITY; dividing eager by the reference outright (1.0) held it in 151
    (82%) at 8.7%. Of 0.5-1.0, the engine's power holds the most (0.8 ties it). Nor is it fitted to
    these counts alone: from run to run, a config's median eager moved as its median reference to
    the power 0.63 (a least-squares slope, which the reference's own noise pulls toward zero); and
    chosen on any five of the six files (a tie going to the engine's), the power is 0.75 or 0.8, and
    holds the left-out file's runs' median in 167 of 184 runs, pooled over the six folds."""
    from replaybench import analysis

    hits, total, median_width, widest = pooled(REPEATED)
    assert (hits, total) == (168, 184) and round(median_width, 3) == 0.045 and widest <= 0.20
    with monkeypatch.context() as m:
        m.setattr(analysis, "HOST_ELASTICITY", 1.0)
        outright = pooled(REPEATED)
    assert outright[:2] == (151, 184) and round(outright[2], 3) == 0.087

    # From run to run, within each config: log median eager over every unit against log median reference.
    calibration, x, y = benchmark("interval_calibration"), [], []
    for name in REPEATED:
        saved = [calibration.unpassed(run) for run in json.loads((DATA / name).read_text())["runs"]]
        for rows in zip(*calibration.passes_as_runs(saved)):
            processes = [calibration.row_units(row) for row in rows]
            ref = [np.log(np.median([r for u in units for r in u.refs()])) for units in processes]
            eager = [np.log(np.median([e for u in units for e in u.blocks["eager"]])) for units in processes]
            x += list(np.subtract(ref, np.mean(ref)))
            y += list(np.subtract(eager, np.mean(eager)))
    slope = float(np.dot(x, y) / np.dot(x, x))
    assert round(slope, 2) == 0.63

    grid = [0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0]
    by_power = {}
    for power in grid:
        with monkeypatch.context() as m:
            m.setattr(analysis, "HOST_ELASTICITY", power)
            by_power[power] = {name: held(single_pass_runs(name), "normalised_speedup")[0] for name in REPEATED}

    def share(power, files):
        hits = [hit for name in files for hit in by_power[power][name]]
        return sum(hits) / len(hits)

    assert share(analysis.HOST_ELASTICITY, REPEATED) == max(share(power, REPEATED) for power in grid)
    assert share(0.8, REPEATED) == share(analysis.HOST_ELASTICITY, REPEATED)
    held_out = [0, 0]
    for left_out in REPEATED:
        rest = [name for name in REPEATED if name != left_out]
        best = max(grid, key=lambda power: (share(power, rest), power == analysis.HOST_ELASTICITY))
        assert best in (0.75, 0.8), left_out
        hits = by_power[best][left_out]
        held_out = [held_out[0] + sum(hits), held_out[1] + len(hits)]
    assert held_out == [167, 184]


def test_the_runs_that_miss_are_spread_over_configs_as_chance_spreads_them():
    """23 of the 36 configs of the kept files held their runs' median in every run. That is what
    misses at the pooled rate (16 of 184), falling on runs independently, leave (22.8 expected): no
    config's interval misses for a reason of its own. A 95% interval held in every one of five runs
    is itself a 77% event."""
    hits, runs = pooled(REPEATED)[:2]
    assert (hits, runs) == (168, 184)
    clean, expected = 0, 0.0
    for name in REPEATED:
        saved = single_pass_runs(name)
        for i in range(len(saved[0])):
            held_here = held([[run[i]] for run in saved], "normalised_speedup")[0]
            clean += all(held_here)
            expected += (hits / runs) ** len(held_here)
    assert clean == 23 and abs(clean - expected) < 1


def test_eager_at_standard_host_speed_moves_less_from_run_to_run_than_eager_over_the_reference():
    """What nightly verdicts judge eager on, from the raw units of every kept file of repeated runs:
    eager scaled to the standard host by the reference to the power HOST_ELASTICITY moved from run to
    run 1.4-4 times less than eager divided by the reference outright in every file (the standard
    deviation of its log, median over configs), and the engine's power is within 5% of the steadiest
    of 0.5-1.0 over the six files, where 0.5 and 0.6 are not."""
    from replaybench.analysis import HOST_ELASTICITY

    calibration = benchmark("interval_calibration")
    files = []
    for name in REPEATED:
        saved = [calibration.unpassed(run) for run in json.loads((DATA / name).read_text())["runs"]]
        files.append([[calibration.row_units(row) for row in rows] for rows in zip(*calibration.passes_as_runs(saved))])

    def run_to_run(power):
        return np.array([statistics.median(np.std(np.log([figures(units, ["eager"], elasticity=power).normalised.value
                                                          for units in runs]), ddof=1) for runs in configs)
                         for configs in files])

    by_power = {power: run_to_run(power) for power in (0.5, 0.6, 0.7, HOST_ELASTICITY, 0.8, 0.9, 1.0)}
    ratio = by_power[1.0] / by_power[HOST_ELASTICITY]
    assert ratio.min() >= 1.4 and ratio.max() <= 4
    steadiness = {power: np.median(spread) for power, spread in by_power.items()}
    best = min(steadiness.values())
    assert steadiness[HOST_ELASTICITY] <= 1.05 * best
    assert steadiness[0.5] > 1.5 * best and steadiness[0.6] > 1.5 * best


def test_across_two_h100_vms_of_different_host_speeds_the_figures_with_the_host_speed_taken_out_agree(tmp_path):
    """Three configs measured on two H100 VMs 43 minutes apart (h100-default-suite-run-5.db and
    h100-three-configs-run-6.db), the second's host running the reference block up to 2.2 times
    slower: eager and the speedup differed by 23-88% between the VMs, eager at standard host speed
    and the host-normalised speedup by under 6%, as this checkout computes them from the stored units."""
    from replaybench.storage import Store

    figures_of = []
    for name in ("h100-default-suite-run-5.db", "h100-three-configs-run-6.db"):
        copy = tmp_path / name
        copy.write_bytes((DATA / name).read_bytes())
        store = Store(f"sqlite:///{copy}")  # opening upgrades the copy: its figures computed again
        by_config = defaultdict(dict)
        for r in store.run(1).results:
            by_config[r.workload][r.mode] = r
        figures_of.append({w: (m["eager"].throughput_s, m["graph"].speedup, m["eager"].host_normalised,
                               m["graph"].normalised_speedup, m["eager"].host_reference_s)
                           for w, m in by_config.items() if w in ("seed_mlp", "gpt_multi_step", "resnet_small")})
        store.engine.dispose()
    first, second = figures_of
    assert len(first) == len(second) == 3
    apart = {w: [max(a, b) / min(a, b) - 1 for a, b in zip(first[w], second[w])] for w in first}
    assert max(d[4] for d in apart.values()) > 1.0  # the reference block: a host twice as slow
    assert min(d[0] for d in apart.values()) > 0.2 and min(d[1] for d in apart.values()) > 0.2
    assert max(d[2] for d in apart.values()) < 0.06 and max(d[3] for d in apart.values()) < 0.06


def single_pass_runs(name):
    """A kept calibration file's runs, each pass read as a run of its own."""
    calibration = benchmark("interval_calibration")
    saved = [calibration.unpassed(run) for run in json.loads((DATA / name).read_text())["runs"]]
    return [calibration.as_run(run) for run in calibration.passes_as_runs(saved)]


def held(saved, metric):
    """Over the runs' configs, per run that made ``metric``: whether its interval holds the median of
    the runs' points of its config, and its relative half-width."""
    hits, widths = [], []
    for i in range(len(saved[0])):
        values = [run[i]["metrics"][metric] for run in saved if metric in run[i]["metrics"]]
        center = statistics.median(v for v, _, _ in values)
        hits += [lo <= center <= hi for _, lo, hi in values]
        widths += [(hi - lo) / 2 / v for v, lo, hi in values]
    return hits, widths


def holding(saved, metric):
    """``held`` summed up: how many intervals hold, that share, and the median and largest half-width."""
    hits, widths = held(saved, metric)
    return sum(hits), np.mean(hits), statistics.median(widths), max(widths)


@pytest.mark.parametrize("arguments, message", [
    (["--passes-as-runs"], "go with --summarize"),
    (["--summarize", "h100-calibration.json", "--as-passes", "2", "--passes-as-runs"], "take one"),
    (["--summarize", "no-such-file.json"], "no-such-file.json"),
    (["--passes", "0"], "at least 1"),
])
def test_the_calibration_benchmark_refuses_bad_arguments_in_one_line(arguments, message):
    import subprocess
    import sys

    script = DATA.parent / "interval_calibration.py"
    out = subprocess.run([sys.executable, str(script), *arguments], cwd=DATA, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr.splitlines()[-1], out.stderr


def test_on_six_repeated_runs_on_an_h200_the_host_normalised_speedup_holds_where_the_speedup_does_not():
    """h200-calibration-3.json: six runs of the six noisiest configs on one H200 VM, measured after
    the power was chosen (kept apart from REPEATED, whose pooled counts the README gives): the
    host-normalised speedup held the median of the runs in 34 of 36 at a median half-width under 5%,
    the speedup's own interval in under half."""
    saved = single_pass_runs("h200-calibration-3.json")
    assert len(saved) == 6
    count, share, median_width, widest = holding(saved, "normalised_speedup")
    assert (count, round(count / share)) == (34, 36)
    assert median_width <= 0.05 and widest <= 0.10
    assert holding(saved, "speedup")[1] < 0.5
