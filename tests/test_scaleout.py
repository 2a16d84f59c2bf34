"""Two workers on one work pool: a nightly run is sharded, both workers take a shard, one report.
Deployments come from prefect.yaml, as a user registers them. CPU only."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replaybench.storage import Store

from .prefect_server import NO_SCHEDULER, background, prefect_server, served_env

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def test_a_sharded_nightly_run_spreads_over_two_workers_and_reports_once(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with prefect_server(tmp_path, NO_SCHEDULER) as api:
        env = served_env(api, tmp_path, tmp_path, REPLAYBENCH_HOME=str(REPO))
        setup = subprocess.run([sys.executable, "-m", "replaybench.cli", "setup", "--pool", "gpu", "--gpus", "0,1"],
                               env=env, capture_output=True, text=True, timeout=120)
        assert setup.returncode == 0, setup.stderr
        # Idempotent: a second setup changes nothing and does not fail.
        assert subprocess.run([sys.executable, "-m", "replaybench.cli", "setup", "--pool", "gpu", "--gpus", "0,1"],
                              env=env, capture_output=True, text=True, timeout=120).returncode == 0
        deploy = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        (tmp_path / "deploy.log").write_text(deploy.stdout + deploy.stderr)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        worker = [sys.executable, "-m", "replaybench.cli", "worker", "--pool", "gpu", "--gpu"]
        with background(worker + ["0"], env, tmp_path / "w0.log"), background(worker + ["1"], env, tmp_path / "w1.log"):
            with temporary_settings({PREFECT_API_URL: api}):
                parent = run_deployment(
                    "replaybench/nightly",
                    parameters={
                        "parameters": {"workloads": ["seed_mlp", "deep_mlp"], "sizes": {"depth": [2]},
                                       "time_budget_s": 0.3, "processes": 1},
                        "shards": 2,
                    },
                    timeout=600,
                    poll_interval=2,
                )
                logs = lambda: "\n".join((tmp_path / f).read_text()[-2000:] for f in ("w0.log", "w1.log"))
                assert parent.state.is_completed(), logs()
                with get_client(sync_client=True) as client:
                    shards = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="shard-")))
    assert len(shards) == 2 and all(s.state.is_completed() for s in shards)
    assert {s.work_queue_name for s in shards} == {q for q in (f"gpu-{os.uname().nodename}-0", f"gpu-{os.uname().nodename}-1")}
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert run.trigger == "nightly" and run.status == "completed"
    assert {r.workload for r in run.results} == {"seed_mlp", "deep_mlp"}
    report = (tmp_path / "reports" / f"{run.id}.md").read_text()
    assert "## seed_mlp" in report and "## deep_mlp" in report
