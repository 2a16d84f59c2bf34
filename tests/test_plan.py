"""Capture plans (replaybench.plan, replaybench.planning): the search against every subset on cost
tables with known optima, the traffic, size and budget inputs, and the report of a plan measured on
an H200 (benchmarks/data/h200-plan.json). The measuring itself needs CUDA: tests/test_gpu.py."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from replaybench.plan import (MiB, Costs, PlanError, Planner, Traffic, brute_force, common_schedules, covering, expected,
                              parse_sizes, parse_traffic, read_traffic_file, trace_prediction)
from replaybench.planning import sizes_label

H200_PLAN = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200-plan.json"


def traffic(weights: dict[int, float]) -> Traffic:
    total = sum(weights.values())
    return Traffic({b: w / total for b, w in weights.items()}, "test")


def table(graph: dict[int, float], largest: int, held: int = 0, alone: int = 0, eager: float = 1e-3) -> Costs:
    return Costs(eager_s={b: eager for b in range(1, largest + 1)}, graph_s=graph,
                 alone_bytes={c: alone or held for c in graph}, held_bytes={c: held for c in graph})


def test_two_batch_sizes_are_captured_exactly_when_memory_allows():
    # Batches of 3 and 9 only; a graph costs its size in microseconds: capture 3 and 9, nothing else.
    costs = table({c: c * 1e-6 for c in range(1, 17)}, 16, held=MiB)
    t = traffic({3: 1, 9: 1})
    assert Planner(costs, t).best() == [3, 9]
    # Room for one graph (alone 1 MiB): 9 serves both batches, 3 would leave 9 to eager.
    assert Planner(costs, t, MiB).best(MiB) == [9]
    # No room at all: everything eager.
    assert Planner(costs, t, MiB // 2).best(MiB // 2) == []


def test_padding_up_beats_an_exact_size_that_is_slower():
    # Size 5 is slow (a bad kernel choice): batches of 5 run faster padded to 6.
    graph = {4: 4e-6, 5: 9e-6, 6: 6e-6}
    assert Planner(table(graph, 6, held=MiB), traffic({4: 1, 5: 1, 6: 1})).best() == [4, 6]


@pytest.mark.parametrize("trial", range(60))
def test_the_search_finds_the_best_subset_that_fits_the_budget(trial):
    rng = random.Random(trial)
    largest = rng.randint(2, 11)
    candidates = sorted(rng.sample(range(1, largest + 1), rng.randint(1, largest)))
    unit = 512  # memory in the allocator's steps: the search is exact there
    held = {c: unit * rng.randint(0, 40) for c in candidates}
    costs = Costs(eager_s={b: 1e-4 * rng.uniform(0.8, 1.2) * (1 + b / 10) for b in range(1, largest + 1)},
                  graph_s={c: 2e-5 * rng.uniform(0.5, 1.5) * (1 + c / 5) for c in candidates},
                  alone_bytes={c: held[c] + unit * rng.randint(0, 200) for c in candidates}, held_bytes=held)
    t = traffic({b: rng.random() for b in range(1, largest + 1)})
    budget = rng.choice([None, unit * rng.randint(0, 400)])
    found = Planner(costs, t, budget).best(budget)
    best_time, _ = brute_force(costs, t, budget)
    assert budget is None or costs.memory(found) <= budget
    assert expected(costs, t, found)["time_s"] == pytest.approx(best_time, rel=1e-12, abs=1e-18)


def test_the_plan_never_loses_to_a_common_schedule_at_that_schedules_memory():
    # The shape measured on the H200 (benchmarks/data/h200-plan.json): replay time per size and
    # what each graph keeps, under zipf traffic over 1-256.
    data = json.loads(H200_PLAN.read_text())
    sizes = [s for s in data["sizes"] if s.get("graph")]
    costs = Costs(eager_s={s["size"]: s["eager"]["s"] for s in data["sizes"]},
                  graph_s={s["size"]: s["graph"]["s"] for s in sizes},
                  alone_bytes={s["size"]: s["alone_bytes"] for s in sizes}, held_bytes={s["size"]: s["held_bytes"] for s in sizes})
    t = parse_traffic("zipf", 256)
    for name, schedule in common_schedules(256).items():
        budget = costs.memory(schedule)
        plan = Planner(costs, t, budget).best(budget)
        assert costs.memory(plan) <= budget, name
        assert expected(costs, t, plan)["time_s"] <= expected(costs, t, schedule)["time_s"], name


def test_expected_time_padding_and_eager_share():
    costs = table({4: 4e-6, 8: 8e-6}, 10, held=MiB, eager=100e-6)
    priced = expected(costs, traffic({2: 1, 8: 1, 10: 2}), [4, 8])
    # 2 -> 4 (half the rows padding), 8 -> 8, 10 -> eager
    assert priced["time_s"] == pytest.approx(0.25 * 4e-6 + 0.25 * 8e-6 + 0.5 * 100e-6)
    assert priced["padding"] == pytest.approx(0.25 * 0.5)
    assert priced["eager_share"] == pytest.approx(0.5)
    assert covering([4, 8], 5) == 8 and covering([4, 8], 9) is None
    assert trace_prediction(costs, [4, 8], [2, 2, 10, 8]) == pytest.approx((4e-6 * 2 + 100e-6 + 8e-6) / 4)


def test_common_schedules():
    s = common_schedules(256)
    assert s["powers of two"] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert s["1, 2, 4 and multiples of 8"][:5] == [1, 2, 4, 8, 16] and s["1, 2, 4 and multiples of 8"][-1] == 256
    assert len(s["1, 2, 4 and multiples of 8"]) == 35
    assert common_schedules(6) == {"powers of two": [1, 2, 4], "1, 2, 4 and multiples of 8": [1, 2, 4]}


def test_sizes_and_their_label():
    assert parse_sizes("1-4,8-32:8, 64") == [1, 2, 3, 4, 8, 16, 24, 32, 64]
    assert sizes_label([1, 2, 3, 4, 8, 16, 24, 32, 64]) == "1-4, 8-32:8, 64"
    assert sizes_label([]) == "none (eager only)"
    for bad, why in (("", "give a range"), ("0-4", "upwards from 1"), ("8-4", "upwards"), ("1-70000", "above the limit"),
                     ("a", "not a size"), ("1-1000", "more than 512"), ("1-9:0", "step")):
        with pytest.raises(PlanError, match=why):
            parse_sizes(bad)


def test_traffic_presets_weights_and_files(tmp_path):
    zipf = parse_traffic("zipf", 256)
    assert sum(zipf.probabilities.values()) == pytest.approx(1)
    assert sum(p for b, p in zipf.probabilities.items() if b <= 16) > 0.5  # most batches small
    assert parse_traffic("1:40, 2-4:60", 8).probabilities == pytest.approx({1: 0.4, 2: 0.2, 3: 0.2, 4: 0.2})
    trace = parse_traffic("1:1,8:3", 8).trace(4000, seed=1)
    assert set(trace) == {1, 8} and 0.7 < trace.count(8) / len(trace) < 0.8
    assert trace == parse_traffic("1:1,8:3", 8).trace(4000, seed=1)  # reproducible
    for bad, why in (("1:x", "not SIZE:WEIGHT"), ("1:-1", "not SIZE:WEIGHT"), ("0:1", "upwards from 1"),
                     ("9:1", "above the largest candidate size, 8"), ("1:0", "no batch has a positive weight"),
                     ("", "give a preset"), ("1:1," * 1500, "longer than"), ("1:nan", "not SIZE:WEIGHT")):
        with pytest.raises(PlanError, match=why):
            parse_traffic(bad, 8)
    # Every distinct batch size is built and timed eagerly: a few characters must not ask for 65536.
    for bad in ("1-65536:1", "uniform", "zipf"):
        with pytest.raises(PlanError, match="more than 1024"):
            parse_traffic(bad, 65536)
    observed = tmp_path / "batches.txt"
    observed.write_text("# batch sizes seen\n1 1 2\n3,3,3\n")
    assert read_traffic_file(observed, 8).probabilities == pytest.approx({1: 2 / 6, 2: 1 / 6, 3: 3 / 6})
    for text, why in (("1 x\n", "line 1: 'x' is not a batch size"), ("9\n", "above the largest"), ("# none\n", "no batch size"),
                      ("0\n", "not a batch size")):
        observed.write_text(text)
        with pytest.raises(PlanError, match=why):
            read_traffic_file(observed, 8)
    with pytest.raises(PlanError, match="No such file"):
        read_traffic_file(tmp_path / "missing.txt", 8)


def test_a_traffic_file_is_bounded_as_it_is_read_even_a_pipe_or_a_device_that_has_no_size(tmp_path, monkeypatch):
    import os
    import threading

    import replaybench.plan

    monkeypatch.setattr(replaybench.plan, "MAX_TRAFFIC_FILE_BYTES", 1024)
    pipe = tmp_path / "traffic.fifo"
    os.mkfifo(pipe)

    def feed(text):
        with contextlib.suppress(BrokenPipeError), open(pipe, "w") as f:  # a reader may stop at the bound and leave
            f.write(text)

    for text, fits in (("1 2\n" * 256, True), ("1 2\n" * 257, False)):  # 1024 bytes, then 1028
        writer = threading.Thread(target=feed, args=(text,), daemon=True)
        writer.start()
        if fits:
            assert read_traffic_file(pipe, 8).probabilities == pytest.approx({1: 0.5, 2: 0.5})
        else:
            with pytest.raises(PlanError, match="larger than"):
                read_traffic_file(pipe, 8)
        writer.join(10)
    with pytest.raises(PlanError, match="traffic file /dev/zero: larger than"):
        read_traffic_file("/dev/zero", 8)  # endless: refused after the bound, not read forever


def cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "replaybench.cli", "plan", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, why", [
    (("--candidates", "0-4"), "candidate sizes"),
    (("--traffic", "1:5,300:1"), "above the largest candidate size, 256"),
    (("--memory-budget", "-1"), "argument --memory-budget: Input should be greater than 0 (got -1.0)"),
    (("--set", "layers=3"), "layers=3 is not one of its values"),
    (("--set", "batch_size=3"), "batch_size cannot be set here"),
    (("no_such_workload",), "unknown workload"),
    (("--traffic-file", "missing.txt"), "traffic file missing.txt"),
    (("--calls", "5"), "argument --calls: Input should be greater than or equal to 100 (got 5)"),
    (("--traffic-file", ""), "argument --traffic-file: expected a value, got an empty one"),  # not zipf in its place
    (("--memory-budget", "nan"), "argument --memory-budget: Input should be a finite number"),
    (("--candidates", "1-65536:256", "--traffic", "uniform"), "more than 1024"),
    (("--max-run-s", "abc"), "REPLAYBENCH_MAX_RUN_S must be a positive number"),
])
def test_bad_plan_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, args, why, monkeypatch):
    if args == ("--max-run-s", "abc"):  # the operator's cap, from the environment
        monkeypatch.setenv("REPLAYBENCH_MAX_RUN_S", "abc")
        args = ()
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and why in result.stderr and result.stderr.startswith(("replaybench: error:", "replaybench plan: error:"))
    assert list(tmp_path.iterdir()) == []  # no database, no report


def test_without_cuda_the_plan_run_fails_saying_so_and_is_reported(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: tests/test_gpu.py plans on it")
    result = cli("--candidates", "1-4", "--db", f"sqlite:///{tmp_path / 'r.db'}", "--reports", str(tmp_path / "reports"),
                 cwd=tmp_path)
    assert result.returncode == 1
    assert "failed" in result.stdout and "needs a CUDA device" in result.stdout
    as_json = cli("--candidates", "1-4", "--format", "json", "--db", f"sqlite:///{tmp_path / 'r.db'}",
                  "--reports", str(tmp_path / "reports"), cwd=tmp_path)
    assert as_json.returncode == 1 and "run 2 failed" in as_json.stderr
    answer = json.loads(as_json.stdout)  # stdout holds the JSON alone
    assert answer["run"] == 2 and answer["status"] == "failed" and "needs a CUDA device" in answer["error"] and answer["plan"] is None
    report = (tmp_path / "reports" / "1.md").read_text()
    assert "status **failed**" in report and "needs a CUDA device" in report


def test_a_plan_measured_on_the_h200_is_stored_and_reported(tmp_path):
    from replaybench.report import write_report
    from replaybench.storage import Store

    data = json.loads(H200_PLAN.read_text())
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = store.create_run("plan", {"workload": data["workload"]}, {"gpu_name": "NVIDIA H200", "torch": "2.11.0+cu130"})
    store.add_plan(run_id, data)
    store.finish_run(run_id)
    assert store.plan(run_id) == json.loads(json.dumps(data))
    path, text = write_report(store, run_id, tmp_path / "reports")
    plan = data["schedules"][0]
    assert f"Capture **{len(plan['sizes'])} graph(s)**" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for e in data["schedules"]:
        assert any(row.startswith(f"| {e['name']}") for row in rows), e["name"]
    assert "![time per call against batch size](1-plan.png)" in text
    assert (tmp_path / "reports" / "1-plan.png").stat().st_size > 10_000


def test_a_plan_that_fails_after_its_sizes_were_measured_keeps_them_and_reports_them(tmp_path):
    """The measuring process answers each size as the H200 did (benchmarks/data/h200-plan.json),
    then dies while capturing the sets: the failure carries every size's figures, which are stored
    with the failed run and shown in its report, with no plan claimed."""
    from replaybench.params import PlanParameters
    from replaybench.planning import PlanFailed, make_plan
    from replaybench.report import write_report
    from replaybench.storage import Store
    from replaybench.unstored import store_plan
    from replaybench.worker import Died
    from replaybench.workload import load_registry

    h200 = json.loads(H200_PLAN.read_text())
    recorded = {s["size"]: s for s in h200["sizes"]}
    asked = []

    def request(message, deadline):
        asked.append(message[0])
        if message[0] == "plan_sets":
            raise Died("the measuring process was killed by signal SIGKILL")
        _, workload, params, sizes, eager_sizes, _ = message
        return {"ok": True, "failed": {},
                "sizes": {c: {k: recorded[c][k] for k in ("capture_s", "alone_bytes", "held_bytes", "graph")} for c in sizes},
                "eager": {b: recorded[b]["eager"] for b in eager_sizes}}

    parameters = PlanParameters(workload="gpt_decode_step", candidates="1-256", traffic="zipf")
    with pytest.raises(PlanFailed, match="killed by signal SIGKILL") as failure:
        make_plan(parameters, load_registry(), request)
    assert asked == ["plan_sizes", "plan_sets"]
    partial = failure.value.partial
    assert partial["schedules"] == [] and "SIGKILL" in partial["incomplete"]  # no set was captured
    assert [s["size"] for s in partial["sizes"]] == list(range(1, 257))
    assert partial["sizes"][7]["graph"] == recorded[8]["graph"] and partial["sizes"][7]["eager"] == recorded[8]["eager"]

    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = store.create_run("plan", parameters.model_dump(mode="json"), {"gpu_name": "NVIDIA H200"})
    assert store_plan(store, run_id, partial, tmp_path / "reports") is None
    assert store.finish_run(run_id, error=str(failure.value)) == "failed"
    assert store.plan(run_id)["sizes"] == json.loads(json.dumps(partial["sizes"]))
    _, text = write_report(store, run_id, tmp_path / "reports")
    assert "status **failed**" in text and "## Measured before the plan failed" in text
    assert "## The plan" not in text and "Capture **" not in text and "## Per size" in text
    assert f"![time per call against batch size]({run_id}-plan.png)" in text
    rows = [line for line in text.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1 and f"{recorded[8]['graph']['s'] * 1e6:.1f}" in rows[0]
    assert (tmp_path / "reports" / f"{run_id}-plan.png").stat().st_size > 10_000


def test_a_plan_that_fails_while_replaying_the_trace_keeps_the_sets_it_had_captured(tmp_path):
    """Sizes answered as on the H200, every set captured (memory: its sizes' own, added up), then
    the measuring process dies replaying the trace: the sets captured so far are kept and shown as
    such, no plan is claimed."""
    from replaybench.params import PlanParameters
    from replaybench.planning import PlanFailed, make_plan
    from replaybench.report import write_report
    from replaybench.storage import Store
    from replaybench.unstored import store_plan
    from replaybench.worker import Died
    from replaybench.workload import load_registry

    recorded = {s["size"]: s for s in json.loads(H200_PLAN.read_text())["sizes"]}

    def request(message, deadline):
        if message[0] == "plan_sets":
            _, sets, trace, timed = message
            if timed:
                raise Died("the measuring process was killed by signal SIGKILL")
            return {"ok": True, "sets": {k: {"status": "ok", "memory_bytes": sum(recorded[c]["alone_bytes"] for c in v),
                                             "capture_s": sum(recorded[c]["capture_s"] for c in v)} for k, v in sets.items()}}
        _, workload, params, sizes, eager_sizes, _ = message
        return {"ok": True, "failed": {},
                "sizes": {c: {k: recorded[c][k] for k in ("capture_s", "alone_bytes", "held_bytes", "graph")} for c in sizes},
                "eager": {b: recorded[b]["eager"] for b in eager_sizes}}

    parameters = PlanParameters(workload="gpt_decode_step", candidates="1-64", traffic="zipf", memory_budget_mib=20)
    with pytest.raises(PlanFailed) as failure:
        make_plan(parameters, load_registry(), request)
    partial = failure.value.partial
    names = [e["name"] for e in partial["schedules"]]
    assert names[:3] == ["plan", "powers of two", "1, 2, 4 and multiples of 8"] and all(
        e["measured"]["status"] == "ok" for e in partial["schedules"])
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    run_id = store.create_run("plan", parameters.model_dump(mode="json"))
    assert store_plan(store, run_id, partial, tmp_path / "reports") is None
    store.finish_run(run_id, error=str(failure.value))
    _, text = write_report(store, run_id, tmp_path / "reports")
    assert "## Measured before the plan failed" in text and "Sets captured into one pool" in text
    assert "Capture **" not in text and "| powers of two | 7 | 1, 2, 4, 8, 16, 32, 64 |" in text

