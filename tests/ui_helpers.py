"""Helpers for the end-to-end test through the Prefect UI (tests/test_ui.py): a real `prefect server`
whose UI can reach its API, `replaybench serve` against it, headless Chromium, and diagnostics.

Chromium is Debian's package (`apt-get install chromium`, /usr/bin/chromium), driven by the
`playwright` Python package; `playwright install` (a browser download) is never needed."""

from __future__ import annotations

import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from .prefect_server import background, prefect_server, served_env

# Chromium on a closed network: without the background-networking flags it floods refused connections.
BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def chromium_path() -> str | None:
    """Debian's chromium, or the one named by REPLAYBENCH_CHROMIUM."""
    candidate = os.environ.get("REPLAYBENCH_CHROMIUM") or "/usr/bin/chromium"
    return candidate if os.access(candidate, os.X_OK) else shutil.which("chromium")


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"<{path}: {exc}>"


@contextmanager
def served_for_ui(home: Path, work: Path, timeout_s: float = 180):
    """`prefect server start` + `replaybench serve` (nightly, adhoc, shard); yields the API URL.

    The server's UI asks `/ui-settings` where the API is; by default that is PREFECT_API_URL or
    127.0.0.1:4200, not the port the server was started on, so the UI is told a relative `/api`."""
    with prefect_server(home, {"PREFECT_UI_API_URL": "/api"}) as api:
        env = served_env(api, home, work)
        args = [sys.executable, "-m", "replaybench.cli", "serve", "--gpu", "0"]
        with background(args, env, work / "serve.log") as proc:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{api}/deployments/name/replaybench/adhoc", timeout=10).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("replaybench serve exited:\n" + tail(work / "serve.log"))
                time.sleep(1)
            else:
                raise RuntimeError("serve did not register its deployments:\n" + tail(work / "serve.log"))
            yield api


def deployment_id(api: str, name: str) -> str:
    response = httpx.get(f"{api}/deployments/name/{name}", timeout=30)
    response.raise_for_status()
    return response.json()["id"]


def wait_for_final_state(api: str, flow_run_id: str, timeout_s: float = 420) -> dict:
    """Poll the API until the flow run is in a final state; returns the flow run as JSON."""
    deadline = time.monotonic() + timeout_s
    run: dict = {}
    while time.monotonic() < deadline:
        try:
            run = httpx.get(f"{api}/flow_runs/{flow_run_id}", timeout=30).json()
        except (httpx.HTTPError, ValueError):
            pass
        if run.get("state_type") in FINAL_STATES:
            return run
        time.sleep(2)
    raise TimeoutError(f"flow run {flow_run_id} not final after {timeout_s:.0f} s; last state {run.get('state_name')}")


class PageDiagnostics:
    """Collects what the browser saw, for the failure message."""

    def __init__(self, page):
        self.page = page
        self.console: list[str] = []
        page.on(
            "console",
            lambda m: m.type in ("error", "warning")
            and self.console.append(f"{m.type}: {m.text[:300]} ({(m.location or {}).get('url', '')})"),
        )
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {str(e)[:300]}"))
        page.on("requestfailed", lambda r: self.console.append(f"requestfailed: {r.method} {r.url} {r.failure}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and self.console.append(f"HTTP {r.status}: {r.request.method} {r.url}"),
        )

    def report(self, screenshot: Path | None = None, logs: dict[str, Path] | None = None) -> str:
        parts = []
        try:
            parts.append(f"page url: {self.page.url}")
            body = self.page.inner_text("body", timeout=5000)
            parts.append("page text (last 3000 chars):\n" + body[-3000:])
        except Exception as exc:  # the page may be gone
            parts.append(f"<page text unavailable: {exc}>")
        if screenshot is not None:
            try:
                self.page.screenshot(path=str(screenshot), timeout=10000)
                parts.append(f"failure screenshot: {screenshot}")
            except Exception as exc:
                parts.append(f"<no screenshot: {exc}>")
        parts.append("browser console (last 30):\n" + "\n".join(self.console[-30:]))
        for name, path in (logs or {}).items():
            parts.append(f"{name} (tail):\n{tail(path)}")
        return "\n\n".join(parts)
