"""A nightly run whose flow-run process is killed (SIGKILL: an OOM killer, a lost host) on a real
Prefect server and a real `replaybench worker`: the worker reports the flow run Crashed, the next
nightly run marks the run crashed from that state with its finished results intact, takes the GPU
once the killed run's lease on it runs out, and completes normally. CPU only, as in CI."""

import os
import signal
import subprocess
import sys
import time

import pytest

from flows.supervise import alive
from replaybench.storage import Store

from .prefect_server import NO_SCHEDULER, background, prefect_server
from .test_interrupt import REPO, children, prefect_env, wait_for_a_stored_config

pytestmark = pytest.mark.slow

LEASE_S = 60  # the shortest lease a Prefect server grants (REPLAYBENCH_GPU_LEASE_S)


def test_a_flow_run_killed_mid_nightly_is_marked_crashed_and_the_next_nightly_runs_normally(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The server looks for expired leases every second (15 s by default), so that the test waits
    # for the killed run's lease itself, not for the next look.
    with prefect_server(tmp_path, {"PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "1", **NO_SCHEDULER}) as api:
        env = {**prefect_env(tmp_path, api), "REPLAYBENCH_GPU_LEASE_S": str(LEASE_S)}
        for command in (["replaybench.cli", "setup", "--pool", "gpu", "--gpus", "0"],
                        ["prefect", "--no-prompt", "deploy", "-n", "nightly"]):
            done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        log = tmp_path / "worker.log"
        worker_log = lambda: log.read_text()[-3000:]
        measuring: set[int] = set()
        with background([sys.executable, "-m", "replaybench.cli", "worker", "--gpu", "0"], env, log) as worker, \
                temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            first = run_deployment("replaybench/nightly", timeout=0, parameters={
                "parameters": {"workloads": ["steady"], "time_budget_s": 2, "processes": 1}, "shards": 1})
            wait_for_a_stored_config(tmp_path, worker)
            store = Store(env["REPLAYBENCH_DB_URL"])
            killed = store.run()
            assert killed.status == "running" and killed.flow_run_id == str(first.id) and alive(killed.pid)
            measuring = children(killed.pid)
            os.kill(killed.pid, signal.SIGKILL)  # the flow-run process, holding the GPU's slot

            deadline = time.monotonic() + 60
            while not (state := client.read_flow_run(first.id).state).is_final():
                assert time.monotonic() < deadline, f"the worker did not report the killed flow run: {state}\n{worker_log()}"
                time.sleep(1)
            assert state.is_crashed(), state
            assert store.run(killed.id).status == "running"  # until the next run looks

            started = time.monotonic()
            second = run_deployment("replaybench/nightly", timeout=300, poll_interval=2, parameters={
                "parameters": {"workloads": ["steady"], "batch_sizes": [1, 2], "time_budget_s": 0.3, "processes": 1},
                "shards": 1})
            took = time.monotonic() - started
            assert second.state.is_completed(), f"{second.state}\n{worker_log()}"
            (limit,) = [c for c in client.read_global_concurrency_limits() if c.name.startswith("replaybench-gpu-")]
            assert limit.active_slots == 0
        for pid in measuring:  # the killed run's measuring process, if it outlived its parent
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    crashed, next_run = store.run(killed.id), store.run()
    assert crashed.status == "crashed" and crashed.error == "its flow run ended Crashed before the run finished"
    assert crashed.ended_at is not None and crashed.results
    assert all(r.status == "ok" and r.throughput_s > 0 for r in crashed.results if r.mode == "eager")
    assert next_run.id == killed.id + 1 and next_run.flow_run_id == str(second.id)
    assert next_run.trigger == "nightly" and next_run.status == "completed" and next_run.error is None
    assert len({r.params_key for r in next_run.results}) == 2
    assert (tmp_path / "reports" / f"{next_run.id}.md").exists()
    # It waited for the killed run's lease on the GPU to run out, no longer: well under the default
    # lease of 300 s, with room for a loaded machine's flow-run start and two configs.
    assert took < LEASE_S + 150, took
