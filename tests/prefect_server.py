"""A real `prefect server start` for end-to-end tests, on a free local port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from .helpers import kill_tree


PROCESSES: dict[str, subprocess.Popen] = {}  # each running server's process, by its API URL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# For a test that deploys the nightly flow but starts its runs itself: the server's scheduler would
# otherwise start the real 02:00 UTC nightly in the middle of a test that runs across it.
NO_SCHEDULER = {"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}


def served_env(api: str, home, work=None, **more: str) -> dict:
    """The environment of a replaybench command that talks to the server at ``api``; with ``work``,
    its store and reports are kept there."""
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if work is not None:
        env |= {"REPLAYBENCH_DB_URL": f"sqlite:///{Path(work) / 'replaybench.db'}", "REPLAYBENCH_REPORTS_DIR": str(Path(work) / "reports")}
    return env | more


@contextmanager
def prefect_server(home, extra_env: dict | None = None):
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
        # A 503 from the server is SQLite saying "busy": log why, so a failed test shows it.
        "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true",
        # The port as the README sets it: `--port` alone leaves the UI calling port 4200.
        "PREFECT_SERVER_API_PORT": str(port),
        **(extra_env or {}),
    }
    env.pop("PREFECT_API_URL", None)
    log = open(os.path.join(home, "server.log"), "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited: {open(log.name).read()[-2000:]}")
            time.sleep(0.5)
        else:
            raise RuntimeError("prefect server did not start within 120 s")
        if "PREFECT_UI_API_URL" not in env:  # the UI in a browser calls this server, not another port
            assert httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()["api_url"] == url
        PROCESSES[url] = proc
        yield url
    finally:
        PROCESSES.pop(url, None)
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:  # killed by the test already
            pass
        proc.wait()
        log.close()


@contextmanager
def background(args, env, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        # A `replaybench worker` or `serve` runs Prefect's in a session of its own, out of reach of a
        # kill of the group: the whole tree is killed, not left to the parent-death signal under test.
        kill_tree(proc.pid)
        proc.wait()
        log.close()
