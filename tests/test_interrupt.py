"""Stopping a run: real signals to the real CLI (`replaybench run`), with the temporary server it
starts and with an external one. It must exit within seconds with one line, keep what it measured,
store the run as interrupted, and leave no process behind."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import timezone
from pathlib import Path

import pytest

from flows.supervise import alive
from replaybench.storage import Store

from .helpers import children, kill_all, outliving
from .prefect_server import prefect_server

pytestmark = pytest.mark.slow

WORKLOAD = '''
import torch
from replaybench.workload import Built, Workload


def build(params, device, dtype):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).to(device, dtype).eval()
    return Built(fn=model, inputs=(torch.randn(params["batch_size"], 64, device=device, dtype=dtype),))


WORKLOAD = Workload(name="steady", description="a small MLP", build=build,
                    grid={"batch_size": [1, 2, 3, 4, 5, 6], "dtype": ["float32"]})
'''
CONFIGS = 6


def stored_results(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as con:
            return con.execute("select count(*) from results").fetchone()[0]
    except sqlite3.Error:
        return 0


def start_run(tmp_path: Path, extra_env: dict | None = None, command: tuple[str, ...] = ("run",)) -> subprocess.Popen:
    (tmp_path / "user").mkdir(exist_ok=True)
    (tmp_path / "user" / "steady.py").write_text(WORKLOAD)
    env = {**os.environ, "REPLAYBENCH_WORKLOADS_PATH": str(tmp_path / "user"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           **(extra_env or {})}
    if not extra_env or "PREFECT_API_URL" not in extra_env:
        env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "replaybench.cli", *command, "-w", "steady", "--processes", "2", "--time-budget", "2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def wait_for_a_stored_config(tmp_path: Path, proc: subprocess.Popen, within_s: float = 240) -> None:
    deadline = time.monotonic() + within_s
    while stored_results(tmp_path / "replaybench.db") == 0:
        assert proc.poll() is None, "it ended before storing a config"
        assert time.monotonic() < deadline, f"no config stored within {within_s:.0f} s"
        time.sleep(0.2)


def exit_seconds(proc: subprocess.Popen, since: float, within_s: float) -> float:
    """Seconds from ``since`` until ``proc`` exited; it is killed, and the test fails, past ``within_s``."""
    try:
        proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"it did not exit within {within_s:.0f} s")
    return time.monotonic() - since


def interrupt_after_first_result(tmp_path: Path, proc: subprocess.Popen, signals: list[tuple[int, bool]]):
    """Wait until a config is stored, then send ``signals`` ((signal, to the process group?), 0.3 s
    apart); returns (seconds from the last signal to exit, stderr, the processes it had started)."""
    wait_for_a_stored_config(tmp_path, proc)
    started = children(proc.pid)
    assert started, "the run has no measuring processes or server"
    for i, (sig, group) in enumerate(signals):
        if i:
            time.sleep(0.3)
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
        sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the run did not exit within 60 s of the signal")
    return time.monotonic() - sent, err, started


def after_the_signal(err: str) -> list[str]:
    """Lines printed after the progress bar's last line (what a user sees once they interrupt)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last_bar = max((i for i, ln in enumerate(lines) if "━" in ln or "measuring" in ln), default=-1)
    return lines[last_bar + 1:]


def check_interrupted_run(tmp_path: Path, err: str, exited_s: float, started: set[int]) -> None:
    assert exited_s < 10, err[-3000:]
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert run.status == "interrupted" and run.error.startswith("interrupted by SIG")
    kept = len({r.params_key for r in run.results})
    assert 1 <= kept < CONFIGS
    assert after_the_signal(err) == [f"interrupted: run {run.id} kept {kept} of {CONFIGS} configs"], err[-3000:]
    time.sleep(1)
    assert not [p for p in started if alive(p)], "processes left behind"


def test_ctrl_c_to_the_terminal_stops_the_run_within_seconds_and_keeps_its_results(tmp_path):
    proc = start_run(tmp_path)
    exited_s, err, started = interrupt_after_first_result(tmp_path, proc, [(signal.SIGINT, True)])
    assert proc.returncode == 130
    check_interrupted_run(tmp_path, err, exited_s, started)
    listed = subprocess.run([sys.executable, "-m", "replaybench.cli", "runs"], cwd=tmp_path, capture_output=True, text=True)
    assert "interrupted" in listed.stdout


def test_sigterm_to_the_main_process_stops_the_run_as_a_scheduler_would(tmp_path):
    proc = start_run(tmp_path)
    exited_s, err, started = interrupt_after_first_result(tmp_path, proc, [(signal.SIGTERM, False)])
    assert proc.returncode == 143
    check_interrupted_run(tmp_path, err, exited_s, started)


def test_ctrl_c_stops_an_ab_run_the_same_way(tmp_path):
    (tmp_path / "variants.toml").write_text("[variants.a]\n[variants.b]\n")
    proc = start_run(tmp_path, command=("ab", "a", "b", "--variants", "variants.toml"))
    exited_s, err, started = interrupt_after_first_result(tmp_path, proc, [(signal.SIGINT, True)])
    assert proc.returncode == 130
    check_interrupted_run(tmp_path, err, exited_s, started)
    assert Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run().trigger == "ab"


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    proc = start_run(tmp_path)
    exited_s, err, started = interrupt_after_first_result(tmp_path, proc, [(signal.SIGINT, True), (signal.SIGINT, True)])
    assert proc.returncode == 130 and exited_s < 3, err[-3000:]
    time.sleep(1)
    assert not [p for p in started if alive(p)], "processes left behind"


def test_ctrl_c_with_an_external_server_marks_its_flow_run_crashed(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path / "prefect"
    home.mkdir()
    with prefect_server(home) as api:
        proc = start_run(tmp_path, {"PREFECT_API_URL": api, "PREFECT_HOME": str(home)})
        exited_s, err, started = interrupt_after_first_result(tmp_path, proc, [(signal.SIGINT, True)])
        assert proc.returncode == 130
        check_interrupted_run(tmp_path, err, exited_s, started)
        run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            state = client.read_flow_run(run.flow_run_id).state
        assert state.is_final() and not state.is_completed(), state


# -- a run that loses its Prefect server ---------------------------------------------------------
LOST = "stopped answering"


def kill_when_a_config_is_stored(tmp_path: Path, proc: subprocess.Popen, kill) -> float:
    """Wait until a config is stored, then ``kill()`` the server; returns when it was killed."""
    wait_for_a_stored_config(tmp_path, proc)
    kill()
    return time.monotonic()


def temporary_server_of(pid: int) -> int:
    (server,) = [p for p in children(pid) if b"uvicorn" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return server


def test_a_run_whose_temporary_server_dies_measures_on_and_ends_within_seconds(tmp_path):
    proc = start_run(tmp_path)
    kill_when_a_config_is_stored(tmp_path, proc, lambda: os.killpg(temporary_server_of(proc.pid), signal.SIGKILL))
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the run did not end within 120 s of losing its server")
    ended = time.time()
    assert proc.returncode == 0, err[-3000:]
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert run.status == "completed" and len({r.params_key for r in run.results}) == CONFIGS
    stored_at = run.ended_at.replace(tzinfo=run.ended_at.tzinfo or timezone.utc).timestamp()
    assert ended - stored_at < 10  # not minutes of retries once it is stored
    assert err.count(LOST) == 1 and "Traceback" not in err and "Error" not in err, err[-3000:]
    assert out.splitlines()[-1].startswith(f"run {run.id} completed: report ")
    assert (tmp_path / "reports" / f"{run.id}.md").exists()


QUEUED_LOG_TO_A_DEAD_SERVER = """
import socket, sys
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from flows.local_server import quiet_prefect

free = socket.socket()
free.bind(("127.0.0.1", 0))
port = free.getsockname()[1]
free.close()
with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
    if sys.argv[1] == "quiet":
        quiet_prefect()
    APILogWorker.instance().send({"name": "replaybench", "level": 20, "message": "queued before the loss",
                                  "timestamp": "2026-01-01T00:00:00Z", "flow_run_id": None, "task_run_id": None})
    APILogWorker.drain_all(timeout=60)
"""


@pytest.mark.parametrize("mode", ["loud", "quiet"])
def test_logs_queued_before_the_server_was_lost_fail_silently_once_it_is_said(mode):
    # A log queued before the loss and sent after it printed Prefect's raw connection error under
    # the run's own one line; the loud case shows this test sees that error where it is printed.
    sent = subprocess.run([sys.executable, "-c", QUEUED_LOG_TO_A_DEAD_SERVER, mode], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[1])
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert ("Error logging to API" in sent.stderr) == (mode == "loud"), sent.stderr[-3000:]


def test_ctrl_c_after_the_external_server_is_gone_still_exits_within_seconds(tmp_path):
    from .prefect_server import PROCESSES

    home = tmp_path / "prefect"
    home.mkdir()
    with prefect_server(home) as api:
        proc = start_run(tmp_path, {"PREFECT_API_URL": api, "PREFECT_HOME": str(home)})
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        killed = kill_when_a_config_is_stored(tmp_path, proc, lambda: os.killpg(PROCESSES[api].pid, signal.SIGKILL))
        while not any(LOST in line for line in lines):  # said within seconds
            assert time.monotonic() - killed < 20 and proc.poll() is None, "the lost server was never reported"
            time.sleep(0.2)
        said = len(lines)
        started = children(proc.pid)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        exited_s = exit_seconds(proc, sent, 60)
        reader.join(timeout=5)
        assert proc.returncode == 130
        err = "".join(lines)
        assert sum(LOST in line for line in lines) == 1 and "Traceback" not in err, err[-3000:]
        check_interrupted_run(tmp_path, "".join(lines[said:]), exited_s, started)


# -- stopping `replaybench serve` and `replaybench worker` ----------------------------------------
REPO = Path(__file__).resolve().parent.parent


def prefect_env(tmp_path: Path, api: str) -> dict:
    (tmp_path / "user").mkdir(exist_ok=True)
    (tmp_path / "user" / "steady.py").write_text(WORKLOAD)
    return {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "prefect"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "REPLAYBENCH_HOME": str(REPO),
            "REPLAYBENCH_WORKLOADS_PATH": str(tmp_path / "user"),
            "REPLAYBENCH_DB_URL": f"sqlite:///{tmp_path / 'replaybench.db'}", "REPLAYBENCH_REPORTS_DIR": str(tmp_path / "reports")}


def stop_mid_run(tmp_path: Path, api: str, process: subprocess.Popen, deployment: str, sig: int):
    """Start an ad-hoc run of six configs through ``deployment``, send ``sig`` to ``process`` once
    the first config is stored; returns (seconds to its exit, the flow run, the stored run)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        deadline = time.monotonic() + 180
        while True:
            try:
                client.read_deployment_by_name(deployment)
                break
            except Exception:
                assert process.poll() is None and time.monotonic() < deadline, "no deployment registered"
                time.sleep(1)
        flow_run = run_deployment(deployment, timeout=0, parameters={
            "parameters": {"workloads": ["steady"], "time_budget_s": 2, "processes": 2}})
        wait_for_a_stored_config(tmp_path, process)
        sent = time.monotonic()
        os.kill(process.pid, sig)
        exited_s = exit_seconds(process, sent, 120)
        state = client.read_flow_run(flow_run.id).state
    return exited_s, state, Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()


def test_sigterm_to_serve_lets_the_current_config_finish_and_cancels_the_flow_run(tmp_path):
    with prefect_server(tmp_path) as api:
        log = open(tmp_path / "serve.log", "w")
        serve = subprocess.Popen([sys.executable, "-m", "replaybench.cli", "serve", "--gpu", "0"], env=prefect_env(tmp_path, api),
                                 stdout=log, stderr=subprocess.PIPE, text=True, start_new_session=True)
        exited_s, state, run = stop_mid_run(tmp_path, api, serve, "replaybench/adhoc", signal.SIGTERM)
        err = serve.stderr.read()
    assert serve.returncode == 0 and exited_s < 10, err[-3000:]
    assert state.is_cancelled(), state
    assert run.status == "interrupted" and run.error == "interrupted by SIGTERM to the worker"
    kept = len({r.params_key for r in run.results})
    assert 1 <= kept < CONFIGS and f"{kept} config(s) kept" in state.message
    assert [ln for ln in err.splitlines() if ln.startswith("serve ")] == [
        "serve stopping (SIGTERM): 1 flow run(s) finish their current config (a second signal stops them now)",
        "serve stopped: its flow run(s) cancelled, their finished results stored"], err[-3000:]
    assert not children(serve.pid)


def test_ctrl_c_to_a_worker_with_now_stops_its_flow_run_at_once_and_cancels_it(tmp_path):
    with prefect_server(tmp_path) as api:
        env = prefect_env(tmp_path, api)
        for command in (["replaybench.cli", "setup", "--pool", "gpu", "--gpus", "0"], ["prefect", "--no-prompt", "deploy", "-n", "adhoc"]):
            done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        log = open(tmp_path / "worker.log", "w")
        worker = subprocess.Popen([sys.executable, "-m", "replaybench.cli", "worker", "--gpu", "0", "--now"], env=env,
                                  stdout=log, stderr=subprocess.PIPE, text=True, start_new_session=True)
        exited_s, state, run = stop_mid_run(tmp_path, api, worker, "replaybench/adhoc", signal.SIGINT)
        err = worker.stderr.read()
    assert worker.returncode == 0 and exited_s < 10, err[-3000:]
    assert state.is_cancelled(), state
    assert run.status == "interrupted" and run.error == "interrupted by SIGTERM"  # the worker's SIGTERM to its flow run
    assert 1 <= len({r.params_key for r in run.results}) < CONFIGS
    assert "worker stopping (SIGINT): 1 flow run(s) stopping now" in err, err[-3000:]


SUPERVISED = ("import sys; from flows.supervise import supervise; "
              "supervise([sys.executable, '-c', 'import time; time.sleep(300)'], 'sleeper')")


def test_what_worker_or_serve_supervises_ends_when_the_supervisor_is_killed_outright():
    # SIGKILL (kill -9, the OOM killer) runs no handler, and the supervised Prefect worker, in a
    # session of its own, gets no signal of its group's: without the kernel's help it would go on.
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISED], cwd=Path(__file__).resolve().parent.parent)
    found: set[int] = set()
    try:
        deadline = time.monotonic() + 30
        while not found and time.monotonic() < deadline:
            found = children(supervisor.pid)
            time.sleep(0.1)
        assert found, "the supervised process did not start"
        supervisor.kill()
        supervisor.wait()
        assert not outliving(found, within_s=10), "the supervised process outlived its killed supervisor"
    finally:
        supervisor.kill()
        supervisor.wait()
        kill_all(found)
