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
