"""Verdicts against the nightly history: judged once when a run is finished and stored, read back by
its reports, and identical to judging each result against its whole history one by one."""

import math
from collections import Counter
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from sqlalchemy import event, insert, select

from replaybench import verdicts as verdicts_module
from replaybench.history import Point, judge
from replaybench.report import write_report
from replaybench.storage import Result, Run, Store
from replaybench.verdicts import HISTORY_NIGHTS, compare_points, judge_run, run_verdicts
from replaybench.workload import params_json

START = datetime(2025, 1, 1, 2, 0, tzinfo=timezone.utc)
NIGHTS = 122
CONFIGS = [("a", 1), ("a", 8), ("b", 1), ("b", 8)]


def env(night):
    """torch changes on night 40: histories up to 90 nights later mix the two environments."""
    return {"gpu_name": "NVIDIA H200", "gpu_driver": "580.159.04", "cuda_version": "13.0",
            "torch_version": "2.10.0" if night < 40 else "2.11.0"}


def history(store, seed=0) -> list[int]:
    """NIGHTS nightly runs, inserted in bulk, with what a history holds besides steady nights: a
    step (config a/1 8% slower from night 118 on), an environment change, a config measured every
    other night, failed rows, rows measured ok without a value, and a config measured twice in one
    run. Returns the run ids, oldest first."""
    rng = np.random.default_rng(seed)
    ids, rows = [], []
    with store.engine.begin() as c:
        for night in range(NIGHTS):
            when = START + timedelta(days=night)
            run_id = c.execute(insert(Run).values(started_at=when, trigger="nightly", status="completed",
                                                  environment={}, parameters={}, **env(night))).inserted_primary_key[0]
            ids.append(run_id)
            for k, (workload, batch) in enumerate(CONFIGS):
                if (workload, batch) == ("b", 8) and night % 2:
                    continue
                params = {"batch_size": batch, "dtype": "float32"}
                slower = 1.08 if (workload, batch) == ("a", 1) and night >= 118 else 1.0
                eager = 40e-6 * (1 + k) * slower * math.exp(rng.normal(0, 0.02))
                graph = 6e-6 * (1 + k) * math.exp(rng.normal(0, 0.02))
                common = {"run_id": run_id, "measured_at": when, "workload": workload, "params": params,
                          "params_key": params_json(params), "attempts": 1, "flags": [], "health": {}, "samples": {},
                          "throughput_ci_low": None, "throughput_ci_high": None, "speedup": None,
                          "speedup_ci_low": None, "speedup_ci_high": None}
                failed = (workload, batch) == ("b", 1) and night % 7 == 3
                rows.append({**common, "mode": "eager", "status": "ok", "throughput_s": eager,
                             "throughput_ci_low": eager * 0.99, "throughput_ci_high": eager * 1.01})
                for _ in range(2 if (workload, batch) == ("a", 8) and night == 100 else 1):
                    speedup = eager / graph * math.exp(rng.normal(0, 0.01))
                    rows.append({**common, "mode": "graph", "status": "failed" if failed else "ok",
                                 "throughput_s": None if failed else graph, "speedup": None if failed else speedup,
                                 "speedup_ci_low": None if failed else speedup * 0.98,
                                 "speedup_ci_high": None if failed else speedup * 1.02})
                if workload == "a":  # measured, but without a speedup every third night
                    speedup = None if night % 3 == 0 else 1.5 * math.exp(rng.normal(0, 0.02))
                    rows.append({**common, "mode": "compile", "status": "ok", "throughput_s": graph, "speedup": speedup})
        c.execute(insert(Result.__table__), rows)
    return ids


def one_by_one(store, run) -> dict:
    """The straightforward way: every earlier row of the store, each of the run's measured rows
    judged against the last HISTORY_NIGHTS of its own (same workload, parameters and mode, measured
    ok with a value, in run then row order)."""
    def metric(r):
        if r.mode == "eager":
            return r.throughput_s, r.throughput_ci_low, r.throughput_ci_high, False
        return r.speedup, r.speedup_ci_low, r.speedup_ci_high, True

    def env_key(run):
        return (run.gpu_name, run.gpu_driver, run.cuda_version, run.torch_version)

    with store.session() as s:
        earlier = s.execute(select(Result, Run).join(Run).where(Result.run_id < run.id).order_by(Result.run_id, Result.id)).all()
    judged = {}
    for r in run.results:
        value, lo, hi, higher = metric(r)
        if r.status != "ok" or value is None:
            continue
        nights = [Point(e.id, *metric(x)[:3], env_key(e)) for x, e in earlier
                  if (x.workload, x.params_key, x.mode) == (r.workload, r.params_key, r.mode)
                  and x.status == "ok" and metric(x)[0] is not None]
        judged[r.id] = judge(nights[-HISTORY_NIGHTS:], Point(run.id, value, lo, hi, env_key(run)), higher)
    return judged


@pytest.fixture
def stored(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'history.db'}")
    return store, history(store)


def test_judging_a_run_gives_the_verdicts_of_judging_each_result_one_by_one(stored):
    store, ids = stored
    verdicts = set()
    # The first nights, histories shorter and longer than HISTORY_NIGHTS, the step, a run with a later one.
    for run_id in (ids[0], ids[1], ids[5], ids[60], ids[HISTORY_NIGHTS], ids[HISTORY_NIGHTS + 1], ids[100], ids[119], ids[-2]):
        run = store.run(run_id)
        expected = one_by_one(store, run)
        assert judge_run(store, run) == expected, run_id
        verdicts |= {j.verdict.value for j in expected.values()}
    assert {"NEW", "UNCERTAIN", "SAME", "SLOWER", "FASTER"} <= verdicts  # the step: eager slower, speedup up


def test_finishing_a_run_stores_its_verdicts_and_reports_read_them(stored, tmp_path, monkeypatch):
    store, ids = stored
    run_id = ids[-2]
    expected = one_by_one(store, store.run(run_id))
    assert run_verdicts(store, store.run(run_id)) == expected  # none stored yet: judged now
    store.finish_run(run_id)
    run = store.run(run_id)
    assert {r.id: r.verdict for r in run.results if r.id in expected} == {i: j.verdict.value for i, j in expected.items()}
    assert [r.verdict for r in run.results if r.id not in expected] == [None] * (len(run.results) - len(expected))

    def no_judging(*args, **kwargs):
        raise AssertionError("judged again")

    monkeypatch.setattr(verdicts_module, "judge", no_judging)
    assert run_verdicts(store, run) == expected  # read back exactly, floats and reasons included
    _, text = write_report(store, run_id, tmp_path / "reports")
    n = Counter(j.verdict.value for j in expected.values())
    assert f"**{n['SLOWER']} slower**, {n['FASTER']} faster, {n['SAME']} same, {n['UNCERTAIN']} uncertain" in text


def test_no_verdicts_are_stored_while_an_earlier_run_is_still_running(stored):
    """A run that finishes while an earlier one still measures (a sharded nightly next to an ad-hoc
    run) would be judged against part of that run: its verdicts are judged when asked instead."""
    store, ids = stored
    with store.session.begin() as s:
        s.get(Run, ids[-3]).status = "running"
    store.finish_run(ids[-2])
    assert all(r.verdict is None for r in store.run(ids[-2]).results)
    with store.session.begin() as s:
        s.get(Run, ids[-3]).status = "completed"
    store.finish_run(ids[-2])
    run = store.run(ids[-2])
    assert any(r.verdict for r in run.results)
    assert run_verdicts(store, run) == one_by_one(store, run)


def test_a_pinned_baseline_is_judged_on_demand(stored):
    store, ids = stored
    store.finish_run(ids[-2])
    run, base = store.run(ids[-2]), store.run(ids[52])  # night 52: b/1's graph row failed
    judged = run_verdicts(store, run, baseline=base.id)
    expected = {}
    for r in run.results:
        if r.id in judged:
            b = next(x for x in base.results if (x.workload, x.params_key, x.mode) == (r.workload, r.params_key, r.mode))
            metric = (lambda x: (x.throughput_s, x.throughput_ci_low, x.throughput_ci_high)) if r.mode == "eager" else \
                (lambda x: (x.speedup, x.speedup_ci_low, x.speedup_ci_high))
            pinned = Point(base.id, *metric(b), verdicts_module.env_key(base)) if metric(b)[0] is not None else None
            expected[r.id] = compare_points(pinned, Point(run.id, *metric(r), verdicts_module.env_key(run)), r.mode != "eager")
    assert judged == expected
    assert "NEW" in {j.verdict.value for j in judged.values()}


def test_the_history_is_read_through_the_index(stored):
    store, ids = stored
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, sql, params, *a: statements.append((sql, params)))
    judged = judge_run(store, store.run(ids[-2]))
    history = [(sql, params) for sql, params in statements if "LIMIT" in sql]
    assert len(history) == len(judged) == 8  # one per measured (workload, parameters, mode) of the run
    with store.engine.connect() as c:
        plan = " ".join(str(row) for row in c.exec_driver_sql("EXPLAIN QUERY PLAN " + history[0][0], history[0][1]))
    assert "USING INDEX ix_results_history" in plan and "TEMP B-TREE" not in plan
