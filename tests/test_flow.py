"""The Prefect flow end to end, under Prefect's test harness (a real temporary server)."""

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.testing.utilities import prefect_test_harness

from flows.benchmark import benchmark
from flows.benchmark import FlowParameters as RunParameters
from replaybench.storage import Store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def settings(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYBENCH_DB_URL", db_url)
    monkeypatch.setenv("REPLAYBENCH_REPORTS_DIR", str(tmp_path / "reports"))
    return db_url, tmp_path / "reports"


def test_flow_measures_stores_and_reports(harness, settings):
    db_url, reports = settings
    params = RunParameters(workloads=["seed_mlp"], time_budget_s=0.3, min_units=6)
    run_id = benchmark(parameters=params)

    run = Store(db_url).run(run_id)
    assert run.trigger == "cli" and run.status == "completed" and run.flow_run_id  # no deployment
    assert run.torch_version and run.python_version and run.host
    by_mode = {r.mode: r for r in run.results}
    assert by_mode["eager"].status == "ok" and by_mode["eager"].throughput_s > 0
    assert by_mode["graph"].status in ("ok", "skipped")

    report = (reports / f"{run_id}.md").read_text()
    assert f"{by_mode['eager'].throughput_s * 1e6:.1f} [" in report
    assert (reports / "latest.md").read_text() == report

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["replaybench-report"])))
    mine = [a for a in artifacts if str(a.flow_run_id) == run.flow_run_id]
    assert len(mine) == 1 and mine[0].data == report


def test_flow_rejects_an_unknown_workload_before_writing_anything(harness, settings):
    db_url, reports = settings
    with pytest.raises(Exception, match=r"workloads.0: Input should be .*'seed_mlp'"):  # not a registered workload
        benchmark(parameters={"workloads": ["nope"]})
    assert not (reports / "latest.md").exists()
    assert Store(db_url).runs() == []


def test_a_missing_gpu_limit_is_an_error_not_a_free_for_all(harness, settings, monkeypatch):
    db_url, _ = settings
    monkeypatch.setenv("REPLAYBENCH_GPU_LIMIT", "replaybench-gpu-nowhere-9")
    with pytest.raises(Exception, match="replaybench-gpu-nowhere-9"):
        benchmark(parameters=RunParameters(workloads=["seed_mlp"], time_budget_s=0.2, processes=1))
    run = Store(db_url).run()
    assert run.status == "failed" and run.results == []


def test_a_shard_measures_only_what_a_running_run_handed_out_and_only_once(harness, settings):
    from flows.benchmark import shard
    from replaybench.storage import StoreError

    db_url, _ = settings
    store = Store(db_url)
    params = {"workloads": ["seed_mlp"], "time_budget_s": 0.2, "processes": 1, "shards": 2}
    finished = store.create_run("nightly", params)
    store.add_shard(finished, "old", [{"workload": "seed_mlp", "params": {"batch_size": 1, "dtype": "float32", "width": 128}}])
    store.finish_run(finished)
    with pytest.raises(StoreError, match=f"run {finished} is not a running run that handed out this shard"):
        shard(run_id=finished, token="old")  # a past run: no rows added to it

    running = store.create_run("nightly", params)
    store.add_shard(running, "mine", [{"workload": "seed_mlp", "params": {"batch_size": 1, "dtype": "float32", "width": 128}}])
    with pytest.raises(StoreError, match="not a running run that handed out this shard"):
        shard(run_id=running, token="forged")
    assert shard(run_id=running, token="mine") == 1
    with pytest.raises(StoreError, match="not a running run that handed out this shard"):
        shard(run_id=running, token="mine")  # claimed once
    assert [len(Store(db_url).run(r).results) for r in (finished, running)] == [0, 2]  # eager and graph rows


def test_a_nightly_run_waits_for_a_busy_gpu_only_so_long_then_fails_saying_so(harness, settings, monkeypatch):
    import flows.benchmark as flows_benchmark
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency

    db_url, _ = settings
    name = "replaybench-gpu-test-busy-0"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
    monkeypatch.setenv("REPLAYBENCH_GPU_LIMIT", name)
    monkeypatch.setenv("REPLAYBENCH_NIGHTLY_GPU_WAIT_S", "2")
    monkeypatch.setattr(flows_benchmark, "cli_trigger", "nightly")
    with concurrency(name, occupy=1, strict=True):  # another run holds the GPU
        with pytest.raises(Exception, match=f"the GPU \\({name}\\) stayed busy with other runs for 2 s"):
            benchmark(parameters=RunParameters(workloads=["seed_mlp"], time_budget_s=0.2, processes=1))
    run = Store(db_url).run()
    assert run.trigger == "nightly" and run.status == "failed" and "stayed busy" in run.error and run.results == []


def test_a_run_whose_budget_passes_the_measuring_time_cap_fails_before_it_starts(harness, settings, monkeypatch):
    db_url, reports = settings
    monkeypatch.setenv("REPLAYBENCH_MAX_RUN_S", "5")  # where the flow runs: the worker's environment
    state = benchmark(parameters=RunParameters(workloads=["seed_mlp"], time_budget_s=6), return_state=True)
    assert state.is_failed()
    assert "the selection's time budget, 1 config x 6 s of timed rounds = 6 s, is more than the 5 s a run may measure" \
        in state.message
    assert Store(db_url).runs() == [] and not reports.exists()


def test_the_shards_of_a_run_stop_at_its_measuring_time_cap_together(harness, settings, monkeypatch, tmp_path):
    """Shards add up to one run's measuring time: one stops once the run has measured for its cap,
    and a shard that starts after that measures nothing; each ends Failed saying so."""
    from flows.benchmark import shard

    from .test_cli import SLOW_BUILD

    db_url, _ = settings
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "slow_build.py").write_text(SLOW_BUILD)
    monkeypatch.setenv("REPLAYBENCH_WORKLOADS_PATH", str(tmp_path / "user"))
    monkeypatch.setenv("REPLAYBENCH_MAX_RUN_S", "1.5")
    store = Store(db_url)
    run_id = store.create_run("nightly", {"time_budget_s": 0.1, "processes": 1, "shards": 2})
    configs = [{"workload": "slow_build", "params": {"batch_size": b, "dtype": "float32"}} for b in (1, 2, 3, 4)]
    store.add_shard(run_id, "first", configs[:3])
    store.add_shard(run_id, "second", configs[3:])
    first = shard(run_id=run_id, token="first", return_state=True)
    kept = store.configs_kept(run_id)
    assert first.is_failed() and 1 <= kept <= 2, (first, kept)
    assert first.message.startswith("measuring-time cap reached: the run measured for ")
    assert first.message.endswith(f"its cap is 1.5 s ($REPLAYBENCH_MAX_RUN_S); {3 - kept} config(s) of this shard not measured")
    second = shard(run_id=run_id, token="second", return_state=True)
    assert second.is_failed() and second.message.endswith("; 1 config(s) of this shard not measured")
    assert store.configs_kept(run_id) == kept and store.measuring_s(run_id) >= 1.5
