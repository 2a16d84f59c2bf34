"""Nightly verdicts end to end: real `replaybench run --trigger nightly` runs against a real Prefect
server, steady nights and then a slower forward under the same config; the report's verdicts,
the same-night confirmation, the Prefect event, open regressions and their acknowledgement, and a
run left running resolved from its flow run's state. CPU only, as in CI."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from replaybench.storage import Store

from .prefect_server import prefect_server, served_env
from .test_cli import SMALL_MLP

pytestmark = pytest.mark.slow

STEADY_NIGHTS = 6
RUN = ["run", "-w", "steady", "-w", "slowed", "--trigger", "nightly", "--processes", "2", "--time-budget", "0.5"]


def replaybench(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "replaybench.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def section(text, title):
    return text.split(f"## {title}")[1].split("\n## ")[0] if f"## {title}" in text else ""


class Webhook(BaseHTTPRequestHandler):
    """A local incoming webhook: keeps the JSON bodies it is sent."""

    received: list = []

    def do_POST(self):
        Webhook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """STEADY_NIGHTS nightly runs, the alert automation set up, then a night with the `slowed`
    workload doing twice the work."""
    home, work = tmp_path_factory.mktemp("prefect"), tmp_path_factory.mktemp("work")
    (work / "user_workloads").mkdir()
    for name in ("steady", "slowed"):
        (work / "user_workloads" / f"{name}.py").write_text(SMALL_MLP.format(name=name))
    hook = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    with prefect_server(home) as api:
        env = served_env(api, home, REPLAYBENCH_WORKLOADS_PATH=str(work / "user_workloads"))
        env.pop("SLOW_IT", None)
        for night in range(STEADY_NIGHTS):
            out = replaybench(*RUN, cwd=work, env=env)
            assert out.returncode == 0, out.stderr[-3000:]
        url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
        alerts = replaybench("alerts", "--webhook", url, "--allow-private-url", cwd=work, env=env)
        assert alerts.returncode == 0 and "replaybench-regressions" in alerts.stderr, alerts.stderr[-3000:]
        out = replaybench(*RUN, cwd=work, env={**env, "SLOW_IT": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        yield api, work, env, out
    hook.shutdown()


def test_the_slowed_workload_reads_slower_and_nothing_else_does(nights):
    api, work, env, out = nights
    store = Store(f"sqlite:///{work / 'replaybench.db'}")
    last = store.run()
    assert last.id == STEADY_NIGHTS + 1 and last.trigger == "nightly" and last.status == "completed"
    report = (work / "reports" / f"{last.id}.md").read_text()
    verdicts = section(report, "Verdicts")
    slowed = [line for line in verdicts.splitlines() if line.startswith("| slowed |")]
    steady = [line for line in verdicts.splitlines() if line.startswith("| steady |")]
    assert any("| eager | **SLOWER**" in line and "eager at standard host speed: SLOWER" in line for line in slowed), verdicts
    assert not any("SLOWER" in line.split("|")[4] for line in steady), verdicts
    # The slowed config looked off on its first night: measured again, twice, in fresh processes.
    repeats = {(r.workload, r.mode): 0 for r in last.results}
    for r in last.results:
        repeats[(r.workload, r.mode)] += r.repeat > 0
    assert repeats[("slowed", "eager")] == 2 and "(same-night confirmation)" in section(report, "slowed")
    # The regression is listed at the top, with its figure, size and first night.
    top = section(report, "Open regressions")
    assert "| slowed |" in top and "eager at standard host speed" in top and f"run {last.id}" in top
    assert "| steady |" not in top


def test_a_prefect_event_names_the_regression(nights):
    api, *_ = nights
    body = {"filter": {"event": {"prefix": ["replaybench."]}}, "limit": 50}
    deadline = time.monotonic() + 60
    while True:  # the server stores events in batches, a few seconds after it received them
        events = httpx.post(f"{api}/events/filter", json=body, timeout=30).json()["events"]
        found = [e for e in events if e["event"] == "replaybench.regression.detected"]
        if found or time.monotonic() > deadline:
            break
        time.sleep(1)
    (event,) = found
    assert event["resource"]["replaybench.workload"] == "slowed" and event["resource"]["replaybench.mode"] == "eager"
    assert event["resource"]["replaybench.change"].startswith("+") and event["payload"]["verdict"] == "SLOWER"


def test_the_alert_automation_posts_the_regression_to_the_webhook(nights):
    deadline = time.monotonic() + 60
    while not Webhook.received and time.monotonic() < deadline:
        time.sleep(1)
    (message,) = Webhook.received
    assert message["text"].startswith("replaybench: slowed(batch_size=1, dtype=float32) eager slower")
    assert "in run 7" in message["text"] and "eager at standard host speed: SLOWER" in message["text"]


def test_alerts_refuse_what_is_not_a_webhook(nights):
    api, work, env, _ = nights
    out = replaybench("alerts", "--webhook", "file:///etc/passwd", cwd=work, env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not an http(s) URL" in out.stderr


def test_regressions_are_listed_until_acknowledged(nights):
    api, work, env, _ = nights
    out = replaybench("regressions", "--format", "json", cwd=work, env=env)
    (listed,) = json.loads(out.stdout)
    assert listed["workload"] == "slowed" and listed["figure"] == "eager at standard host speed"
    assert replaybench("ack", "12345:nothing", cwd=work, env=env).returncode == 2
    ack = replaybench("ack", listed["id"], "--note", "twice the work, on purpose", cwd=work, env=env)
    assert ack.returncode == 0 and "acknowledged: slowed eager" in ack.stderr
    assert json.loads(replaybench("regressions", "--format", "json", cwd=work, env=env).stdout) == []
    report = replaybench("report", cwd=work, env=env).stdout
    assert "Open regressions: 0." in report


def test_a_run_left_running_is_resolved_from_its_flow_runs_state(nights):
    api, work, env, _ = nights
    store = Store(f"sqlite:///{work / 'replaybench.db'}")
    finished_flow_run = store.run(1).flow_run_id
    stuck = store.create_run("nightly", {})
    store.set_flow_run(stuck, finished_flow_run)  # its flow run ended long ago, the run never did
    out = replaybench("run", "-w", "steady", "--processes", "1", "--time-budget", "0.3", cwd=work, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    run = store.run(stuck)
    assert run.status == "crashed" and "its flow run ended Completed" in run.error


def test_confirmations_cut_short_by_the_measuring_time_cap_leave_the_night_judged(nights):
    """(Last: it adds a night.) A night whose configs are all measured but whose same-night confirmations reach the run's
    measuring-time cap ($REPLAYBENCH_MAX_RUN_S: one config's 0.5 s budget) completes and is judged:
    the confirmations are what is cut, not the night. Its build takes the cap, so that the night's one
    config alone reaches it whenever its timed rounds stop (from half the budget on, they may)."""
    api, work, env, _ = nights
    capped = {**env, "SLOW_IT": "1", "SLOW_BUILD_S": "0.5", "REPLAYBENCH_MAX_RUN_S": "0.5"}
    out = replaybench("run", "-w", "slowed", "--trigger", "nightly", "--processes", "2", "--time-budget", "0.5",
                      cwd=work, env=capped)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "same-night confirmations stopped: measuring-time cap reached" in out.stderr
    store = Store(f"sqlite:///{work / 'replaybench.db'}")
    run = store.run()
    assert store.measuring_s(run.id) >= 0.5  # the premise: the night itself took the cap
    assert run.status == "completed" and not any(r.repeat for r in run.results)
    assert any(r.verdict for r in run.results)
