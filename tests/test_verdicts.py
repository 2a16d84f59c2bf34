"""Verdicts against the nightly history: which figures are judged, what the history is, causes,
storing, comparing two runs, open regressions and their acknowledgement (real SQLite stores)."""

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import event, insert

from replaybench.analysis import HOST_ELASTICITY, STANDARD_REFERENCE_S
from replaybench import verdicts as verdicts_module
from replaybench.history import Verdict
from replaybench.report import write_report
from replaybench.storage import Result, Run, Store
from replaybench.verdicts import acknowledge, compare_runs, judge_run, open_regressions, run_verdicts, store_verdicts
from replaybench.workload import params_json

START = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)
SETTINGS = {"processes": 6, "time_budget_s": 3.0, "precision": 0.02, "min_units": 6}
PARAMS = {"batch_size": 1, "dtype": "float32", "width": 128}


@pytest.fixture
def store(tmp_path):
    return Store(f"sqlite:///{tmp_path / 'verdicts.db'}")


def add_night(store, night, eager=0.12, graph=6e-6, gpu=5.9e-6, *, trigger="nightly", status="completed",
              torch="2.11.0", gpu_name="NVIDIA H200", settings=SETTINGS, repeats=1, workload="seed_mlp", noise=0.0, rng=None,
              normalised=True):
    """One run with an eager and a graph row (per repeat): eager at standard host speed, graph
    throughput and GPU time with 1% intervals, the speedup derived, and the speedup with the host's
    speed taken out near 8.0, moving a quarter as much as eager (its own draws: the others' stay as
    they were). Returns the run id."""
    rng = rng or np.random.default_rng(night)
    steadier = np.random.default_rng(1000 + night)
    with store.engine.begin() as c:
        run_id = c.execute(insert(Run).values(
            started_at=START + timedelta(days=night), trigger=trigger, status=status, environment={},
            parameters=settings, gpu_name=gpu_name, gpu_driver="580.159.04", cuda_version="13.0", torch_version=torch,
            python_version="3.12.3", package_version="0.1.0")).inserted_primary_key[0]
        rows = []
        for repeat in range(repeats):
            e = eager * math.exp(rng.normal(0, noise))
            g = graph * math.exp(rng.normal(0, noise / 5))
            common = {"run_id": run_id, "measured_at": START + timedelta(days=night), "workload": workload,
                      "params": PARAMS, "params_key": params_json(PARAMS), "status": "ok", "attempts": 1, "flags": [],
                      "health": {}, "samples": {}, "repeat": repeat, **dict.fromkeys(
                          ("throughput_ci_low", "throughput_ci_high", "gpu_s", "gpu_ci_low", "gpu_ci_high", "speedup",
                           "speedup_ci_low", "speedup_ci_high", "host_normalised", "host_normalised_ci_low",
                           "host_normalised_ci_high", "normalised_speedup", "normalised_speedup_ci_low",
                           "normalised_speedup_ci_high", "host_reference_s"))}
            standard = e * 3e-4 * (STANDARD_REFERENCE_S / 3e-4) ** HOST_ELASTICITY  # eager at standard host speed
            rows.append({**common, "mode": "eager", "throughput_s": e * 3e-4, "host_reference_s": 3e-4, "host_normalised": standard,
                         "host_normalised_ci_low": standard * 0.99, "host_normalised_ci_high": standard * 1.01})
            rows.append({**common, "mode": "graph", "throughput_s": g, "throughput_ci_low": g * 0.99, "throughput_ci_high": g * 1.01,
                         "gpu_s": gpu, "gpu_ci_low": gpu * 0.99, "gpu_ci_high": gpu * 1.01,
                         "speedup": e * 3e-4 / g, "speedup_ci_low": e * 3e-4 / g * 0.95, "speedup_ci_high": e * 3e-4 / g * 1.05,
                         **({"normalised_speedup": (n := 8.0 * math.exp(steadier.normal(0, noise / 4))),
                             "normalised_speedup_ci_low": n * 0.97, "normalised_speedup_ci_high": n * 1.03} if normalised else {})})
        c.execute(insert(Result.__table__), rows)
    return run_id


def verdict_of(store, run_id, mode):
    run = store.run(run_id)
    judged = judge_run(store, run)
    return next(judged[r.id] for r in run.results if r.mode == mode and r.id in judged)


def steady(store, nights=12, **kw):
    rng = np.random.default_rng(0)
    return [add_night(store, n, noise=0.01, rng=rng, **kw) for n in range(nights)]


def test_graph_rows_are_judged_on_replay_and_gpu_time_never_on_the_speedup(store):
    steady(store)
    # Eager 20% faster tonight, graph unchanged: the speedup drops 17%, and the graph row is SAME.
    run = add_night(store, 12, eager=0.12 / 1.2, repeats=3)
    graph = verdict_of(store, run, "graph")
    assert graph.verdict is Verdict.SAME, graph.reason
    assert "GPU time: SAME" in graph.reason and "throughput: SAME" in graph.reason
    assert verdict_of(store, run, "eager").verdict is Verdict.FASTER
    # GPU time 15% slower while the throughput holds: SLOWER, and the reason says which.
    run = add_night(store, 13, gpu=5.9e-6 * 1.15, repeats=3)
    graph = verdict_of(store, run, "graph")
    assert graph.verdict is Verdict.SLOWER and "GPU time: SLOWER +15.0%" in graph.reason


def test_the_history_is_finished_nightly_runs_with_the_same_settings_on_the_same_gpu(store):
    steady(store, 8)
    # None of these is history: an ad-hoc run, a failed run, one still running, other settings,
    # another GPU model; all 50% slower, which would show as a step if they counted.
    for kw in ({"trigger": "adhoc"}, {"status": "failed"}, {"status": "running"},
               {"settings": {**SETTINGS, "processes": 3}}, {"gpu_name": "NVIDIA H100"}):
        add_night(store, 8, eager=0.18, **kw)
    tonight = add_night(store, 9, repeats=2)
    j = verdict_of(store, tonight, "eager")
    assert j.verdict is Verdict.SAME, j.reason
    assert "of the 8 measurement(s) before" in j.reason  # the eight steady nights, nothing else
    # An ad-hoc run is judged against the nightly history (and never enters it).
    adhoc = add_night(store, 10, eager=0.18, trigger="adhoc", repeats=3)
    assert verdict_of(store, adhoc, "eager").verdict is Verdict.SLOWER
    # Another GPU model has no history of its own yet.
    assert verdict_of(store, add_night(store, 11, gpu_name="NVIDIA B200"), "eager").verdict is Verdict.NEW


def test_a_torch_upgrade_is_judged_across_and_named(store):
    steady(store)
    same = add_night(store, 12, torch="2.12.0", repeats=3)
    assert verdict_of(store, same, "eager").verdict is Verdict.SAME
    slower = add_night(store, 13, torch="2.12.1", eager=0.12 * 1.15, repeats=3)
    j = verdict_of(store, slower, "eager")
    assert j.verdict is Verdict.SLOWER and "torch 2.12.0 -> 2.12.1" in j.reason and j.cause == "torch 2.12.0 -> 2.12.1"


def test_stored_verdicts_are_what_reports_read(store, tmp_path, monkeypatch):
    ids = steady(store)
    run = add_night(store, 12, eager=0.15, repeats=3)
    expected = judge_run(store, store.run(run))
    assert store_verdicts(store, run) == expected
    stored = store.run(run)
    assert {r.verdict for r in stored.results} == {"SLOWER", "SAME"}
    monkeypatch.setattr(verdicts_module, "judge", lambda *a, **k: pytest.fail("judged again"))
    assert {i: j.verdict for i, j in run_verdicts(store, stored).items()} == {i: j.verdict for i, j in expected.items()}
    _, text = write_report(store, run, tmp_path / "reports")
    assert "Against the nightly history: **1 slower**, 0 faster, 1 same" in text
    verdicts_section = text.split("## Verdicts")[1].split("\n## ")[0]
    assert "| eager | **SLOWER** (+2" in verdicts_section and "eager at standard host speed: SLOWER +2" in verdicts_section
    assert "speedup 2" in verdicts_section and "higher (derived from eager and graph, not judged)" in verdicts_section
    assert "## Open regressions" in text and len(ids) == 12


def test_an_earlier_run_left_running_does_not_stop_verdicts(store):
    ids = steady(store)
    with store.session.begin() as s:
        s.get(Run, ids[3]).status = "running"  # a dead host on a shared database
    run = add_night(store, 12, repeats=2)
    assert store_verdicts(store, run) and all(r.verdict for r in store.run(run).results)


def test_compare_judges_two_runs_with_the_nightly_noise(store):
    rng = np.random.default_rng(1)
    ids = [add_night(store, n, noise=0.04, rng=rng) for n in range(12)]
    # Two nights of the same code, 6% apart: their 1% intervals do not overlap, but the nights
    # differ that much: never SLOWER.
    a = add_night(store, 12, eager=0.12, trigger="cli")
    b = add_night(store, 13, eager=0.12 * 1.06, trigger="cli")
    rows = {(r["mode"], r["figure"]): r for r in compare_runs(store, a, b)}
    eager = rows[("eager", "eager at standard host speed")]
    assert eager["verdict"] != "SLOWER" and eager["change"] == pytest.approx(0.06)
    assert "nightly run-to-run noise" in eager["reason"]
    # A 40% step is one whatever the noise.
    c = add_night(store, 14, eager=0.12 * 1.4, trigger="cli")
    assert {r["verdict"] for r in compare_runs(store, a, c) if r["mode"] == "eager"} == {"SLOWER"}
    assert ids


def test_an_open_regression_stays_until_acknowledged_or_the_level_returns(store):
    steady(store)
    first = add_night(store, 12, gpu=5.9e-6 * 1.2, repeats=3)
    later = [add_night(store, 13 + k, gpu=5.9e-6 * 1.2) for k in range(3)]
    (o,) = open_regressions(store, store.run(later[-1]))
    assert (o.mode, o.metric, o.first_run_id) == ("graph", "GPU time", first) and o.change == pytest.approx(0.2, abs=0.01)
    assert o.ident.endswith(":GPU_time")
    with pytest.raises(ValueError, match="not a regression id"):
        acknowledge(store, "drop table results")
    with pytest.raises(ValueError, match="no open regression"):
        acknowledge(store, f"{o.first_result_id}:eager")
    assert acknowledge(store, o.ident, "new kernel, expected").first_run_id == first
    assert open_regressions(store, store.run(later[-1])) == []
    # Not acknowledged: the level moving back closes it.
    store2 = Store(f"sqlite:///{Path(store.engine.url.database).parent / 'other.db'}")
    steady(store2)
    add_night(store2, 12, gpu=5.9e-6 * 1.2, repeats=3)
    back = [add_night(store2, 13 + k) for k in range(6)]
    assert open_regressions(store2, store2.run(back[-1])) == []


def test_real_h200_run_pairs_of_the_same_code_are_never_slower():
    """Graph replay and GPU time of the H200 calibration runs (benchmarks/data): every pair of runs
    of one config, compared with the run-to-run noise of the other runs, is never SLOWER."""
    from replaybench.history import Point, compare, noise

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    pairs = 0
    for vm in (1, 2):
        runs = json.loads((data / f"h200-calibration-{vm}.json").read_text())["runs"]
        for k in range(len(runs[0])):
            for figure in ("graph", "graph_gpu"):
                points = [Point(i, *run[k]["metrics"][figure]) for i, run in enumerate(runs)]
                for a in points:
                    for b in points:
                        if a is b:
                            continue
                        others = [p for p in points if p is not a and p is not b]
                        j = compare(a, b, higher_is_better=False, sigma=noise(others) if len(others) >= 3 else None)
                        assert j.verdict is not Verdict.SLOWER, (vm, k, figure, j.reason)
                        pairs += 1
    assert pairs > 100


def test_the_history_is_read_through_the_index(store):
    steady(store)
    run = add_night(store, 12)
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, sql, params, *a: statements.append((sql, params)))
    judge_run(store, store.run(run))
    history = [(sql, params) for sql, params in statements if "LIMIT" in sql]
    assert len(history) == 2  # one per measured (workload, parameters, mode) of the run
    with store.engine.connect() as c:
        plan = " ".join(str(row) for row in c.exec_driver_sql("EXPLAIN QUERY PLAN " + history[0][0], history[0][1]))
    assert "USING INDEX ix_results_history" in plan


def test_the_report_gives_each_speedup_its_interval_across_nights_once_the_history_knows_the_noise(store, tmp_path):
    from replaybench.history import MIN_HISTORY, Point, across_nights

    rng = np.random.default_rng(3)
    for night in range(MIN_HISTORY - 1):
        add_night(store, night, noise=0.08, rng=rng)
    early = add_night(store, MIN_HISTORY - 1, noise=0.08, rng=rng)
    _, text = write_report(store, early, tmp_path / "early")
    assert "; nights [" not in text and "typical speedup from night to night" not in text
    for night in range(MIN_HISTORY, 12):
        add_night(store, night, noise=0.08, rng=rng)
    tonight = add_night(store, 12, noise=0.08, rng=rng)
    _, text = write_report(store, tonight, tmp_path / "late")
    assert "typical speedup from night to night" in text
    history = [Point(r.run_id, r.speedup, r.speedup_ci_low, r.speedup_ci_high) for run in store.runs(50)[::-1][:-1]
               for r in store.run(run.id).results if r.mode == "graph"]
    graph = next(r for r in store.run(tonight).results if r.mode == "graph")
    low, high = across_nights(history, Point(tonight, graph.speedup, graph.speedup_ci_low, graph.speedup_ci_high))
    assert f"**{graph.speedup:.2f}x** [{graph.speedup_ci_low:.2f}x, {graph.speedup_ci_high:.2f}x]; nights [{low:.2f}x, {high:.2f}x]" in text
    assert high / low > graph.speedup_ci_high / graph.speedup_ci_low  # eager's 8% noise from night to night
    # The speedup with the host's speed taken out gets its own, from its own (smaller) noise.
    normalised = [Point(r.run_id, r.normalised_speedup, r.normalised_speedup_ci_low, r.normalised_speedup_ci_high)
                  for run in store.runs(50)[::-1][:-1] for r in store.run(run.id).results if r.mode == "graph"]
    n_low, n_high = across_nights(normalised, Point(tonight, graph.normalised_speedup, graph.normalised_speedup_ci_low,
                                                    graph.normalised_speedup_ci_high))
    assert (f"{graph.normalised_speedup:.2f}x [{graph.normalised_speedup_ci_low:.2f}x, {graph.normalised_speedup_ci_high:.2f}x]; "
            f"nights [{n_low:.2f}x, {n_high:.2f}x]") in text
    assert n_high / n_low < high / low
    # An ad-hoc run is read against the same nightly history; a night with a same-night
    # confirmation gives its interval once, on the first measurement's row.
    adhoc = add_night(store, 13, noise=0.08, rng=rng, trigger="cli", repeats=2)
    _, text = write_report(store, adhoc, tmp_path / "adhoc")
    assert text.count("; nights [") == 2  # once for the speedup, once for the host-normalised one


def test_nights_that_stored_no_host_normalised_speedup_do_not_count_toward_its_interval_across_nights(store, tmp_path):
    # Twelve nights from before the figure was stored, then nights that store it: the speedup has its
    # nights at once; the host-normalised speedup only once MIN_HISTORY nights stored it.
    from replaybench.history import MIN_HISTORY
    from replaybench.verdicts import speedups_across_nights

    rng = np.random.default_rng(5)
    for night in range(12):
        add_night(store, night, noise=0.08, rng=rng, normalised=False)
    counts = []
    for night in range(12, 12 + MIN_HISTORY + 1):
        run = store.run(add_night(store, night, noise=0.08, rng=rng))
        found = speedups_across_nights(store, run)
        assert len(found["speedup"]) == 1
        counts.append([n for _, _, n in found["normalised_speedup"].values()])
    assert counts == [[]] * MIN_HISTORY + [[MIN_HISTORY]]
