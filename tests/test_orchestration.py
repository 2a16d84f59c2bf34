"""End to end against a real `prefect server`: serve, ad-hoc runs through the API, the schedule,
the per-GPU concurrency limit. CPU only, as in CI."""

import sys
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from prefect.settings import PREFECT_API_URL, temporary_settings

from replaybench.storage import Store

from .prefect_server import background, prefect_server, served_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect")
    work = tmp_path_factory.mktemp("work")
    with prefect_server(home) as api:
        env = served_env(api, home, work)
        args = [sys.executable, "-m", "replaybench.cli", "serve", "--cron", "0 2 * * *", "--timezone", "Europe/Berlin", "--gpu", "0"]
        # Settings, not os.environ: an earlier test's Prefect context must not redirect this client.
        with background(args, env, work / "serve.log") as proc, temporary_settings({PREFECT_API_URL: api}):
            from prefect.client.orchestration import get_client

            deadline = time.monotonic() + 180
            with get_client(sync_client=True) as client:
                while time.monotonic() < deadline:
                    try:
                        for name in ("replaybench/adhoc", "replaybench-plan/plan"):  # registered one by one
                            client.read_deployment_by_name(name)
                        break
                    except Exception:
                        assert proc.poll() is None, (work / "serve.log").read_text()[-3000:]
                        time.sleep(1)
                else:
                    pytest.fail("serve did not register its deployments: " + (work / "serve.log").read_text()[-3000:])
            yield api, work


def test_adhoc_run_through_the_api_completes_with_database_report_and_artifact(served):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    api, work = served
    flow_run = run_deployment(
        "replaybench/adhoc",
        parameters={"parameters": {"workloads": ["seed_mlp"], "time_budget_s": 0.3, "processes": 1}},
        timeout=300,
        poll_interval=1,
    )
    assert flow_run.state.is_completed(), (work / "serve.log").read_text()[-3000:]
    run = Store(f"sqlite:///{work / 'replaybench.db'}").run()
    assert run.trigger == "adhoc" and run.status == "completed" and run.flow_run_id == str(flow_run.id)
    assert {r.mode for r in run.results} == {"eager", "graph"}
    report = (work / "reports" / f"{run.id}.md").read_text()
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts()
        assert any(a.flow_run_id == flow_run.id and a.data == report for a in artifacts)
        limit = client.read_global_concurrency_limit_by_name(next(
            l.name for l in client.read_global_concurrency_limits() if l.name.startswith("replaybench-gpu-")
        ))
        assert limit.limit == 1


@pytest.mark.parametrize(
    "deployment, parameters",
    [("replaybench/adhoc", p) for p in ({"batch_sizes": [0]}, {"workloads": ["os.system"]}, {"precision": 5}, {"modes": ["turbo"]})]
    + [("replaybench-plan/plan", p) for p in ({"workload": "os.system"}, {"memory_budget_mib": -1}, {"calls": 10},
                                              {"traffic": "1:1," * 1200}, {"candidates": "1" * 1001})],
)
def test_the_server_refuses_out_of_range_parameters(served, deployment, parameters):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment_id = client.read_deployment_by_name(deployment).id
        with pytest.raises(Exception, match="(?i)validation|invalid|422|409"):
            client.create_flow_run_from_deployment(deployment_id, parameters={"parameters": parameters})


def test_an_adhoc_run_cannot_label_itself_nightly(served):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    api, work = served
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("replaybench/adhoc")
    assert "trigger" not in deployment.parameter_openapi_schema["properties"]  # not in the form
    # Through the API, past the form: the flow takes no such parameter, and whatever it does, no
    # run of that flow run is stored as nightly.
    flow_run = run_deployment("replaybench/adhoc", timeout=300, poll_interval=1, parameters={
        "trigger": "nightly", "parameters": {"workloads": ["seed_mlp"], "time_budget_s": 0.3, "processes": 1}})
    assert flow_run.state.is_final(), flow_run.state
    stored = [r for r in Store(f"sqlite:///{work / 'replaybench.db'}").runs(100) if r.flow_run_id == str(flow_run.id)]
    assert all(r.trigger == "adhoc" for r in stored)


def test_a_run_keeps_the_name_typed_in_the_form(served):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    flow_run = run_deployment("replaybench/adhoc", flow_run_name="bisect-torch-2.12", timeout=300, poll_interval=1,
                              parameters={"parameters": {"workloads": ["seed_mlp"], "time_budget_s": 0.3, "processes": 1}})
    assert flow_run.state.is_completed(), flow_run.state
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run.id).name == "bisect-torch-2.12"


def test_nightly_is_scheduled_at_two_in_the_configured_timezone(served):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("replaybench/nightly")
        (schedule,) = nightly.schedules
        assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 2 * * *", "Europe/Berlin")
        assert "Europe/Berlin" in nightly.description  # shown on the deployment's page
        deadline = time.monotonic() + 60
        runs = []
        while not runs and time.monotonic() < deadline:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[nightly.id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
            )
            time.sleep(1)
        assert runs, "the scheduler created no nightly run"
        first = min(r.expected_start_time for r in runs)
        local = first.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.hour, local.minute) == (2, 0)
        assert first > datetime.now(ZoneInfo("UTC"))


def test_a_plan_with_a_bad_traffic_fails_before_anything_is_stored(served):
    from prefect.deployments import run_deployment

    api, work = served
    before = len(Store(f"sqlite:///{work / 'replaybench.db'}").runs(1000))
    flow_run = run_deployment("replaybench-plan/plan", timeout=300, poll_interval=1,
                              parameters={"parameters": {"candidates": "1-8", "traffic": "9:1"}})
    assert flow_run.state.is_failed(), flow_run.state
    assert "above the largest candidate size, 8" in flow_run.state.message
    assert len(Store(f"sqlite:///{work / 'replaybench.db'}").runs(1000)) == before
