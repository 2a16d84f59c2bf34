"""The Prefect server of a CLI run. A temporary local one, when no PREFECT_API_URL is set: Prefect's
own (``SubprocessASGIServer``), but started in a session of its own, so that a Ctrl-C to the terminal
reaches the run and not the server. The run then ends in order (its flow run marked on a live
server, its store updated) and stops the server itself, instead of calling a dead one for minutes.
Should the run be killed outright, the kernel stops the server (SIGTERM) rather than leave it behind.
And ``ServerWatch``, which tells a run that its server (temporary or not) stopped answering.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Callable

import httpx

from flows.supervise import dies_with_parent


class _SessionPopen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("preexec_fn", dies_with_parent(signal.SIGTERM))
        super().__init__(*args, **kwargs)


_current = None  # the server started here, from the moment it starts


@contextmanager
def temporary_server():
    """Yields the server (None where PREFECT_API_URL names one already); stops it on the way out,
    also when interrupted while it starts."""
    global _current
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = _current = SubprocessASGIServer()
    try:
        original, subprocess.Popen = subprocess.Popen, _SessionPopen  # only while it starts its process
        try:
            server.start()
        finally:
            subprocess.Popen = original
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            try:
                yield server
            finally:
                drain()
    finally:
        server.stop()
        _current = None


def drain(timeout_s: float = 5) -> None:
    """Send the logs and events still queued while the server is up: at exit they would find it
    gone and be retried for a minute or more."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout_s)


def quiet_prefect() -> None:
    """Once a run has said its server is gone, Prefect has nothing to add: its logs stop, and so do
    the errors of sending logs queued before (a batch retried after the loss would print its
    connection error past ``logging.disable``)."""
    logging.disable(logging.CRITICAL)
    logging.raiseExceptions = False


def kill_server() -> None:
    """At once, for a second Ctrl-C."""
    process = getattr(_current, "server_process", None)
    if process is not None and process.poll() is None:
        process.kill()


class ServerWatch:
    """Watches a run's Prefect server from a thread: once its process has ended (a temporary
    server), ``misses`` health checks in a row were refused or failed, or none was answered for
    ``busy_s`` (a server too busy to answer within a check's interval is given that long), ``lost``
    is set and ``on_lost`` called, once. Prefect's client would otherwise retry every call to it
    for minutes."""

    def __init__(self, api_url: str, on_lost: Callable[[], None], process=None, interval_s: float = 1.0, misses: int = 3,
                 busy_s: float = 30.0):
        self.health = api_url.rstrip("/") + "/health"
        self.on_lost, self.process, self.interval_s, self.misses, self.busy_s = on_lost, process, interval_s, misses, busy_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="replaybench-server-watch", daemon=True)

    def __enter__(self) -> "ServerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2)

    def _ended(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def _answer(self) -> str:
        """'up', 'busy' (no answer within the interval) or 'down' (refused, or an error status)."""
        try:
            return "up" if httpx.get(self.health, timeout=self.interval_s).status_code == 200 else "down"
        except httpx.ConnectTimeout:  # a host that drops connections is gone, not busy
            return "down"
        except httpx.TimeoutException:
            return "busy"
        except httpx.HTTPError:
            return "down"

    def _watch(self) -> None:
        missed, answered = 0, time.monotonic()
        while not self._stop.wait(self.interval_s):
            ended = self._ended()
            answer = "down" if ended else self._answer()
            if answer == "up":
                missed, answered = 0, time.monotonic()
            elif answer == "down":
                missed += 1
            if ended or missed >= self.misses or time.monotonic() - answered >= self.busy_s:
                if not self._stop.is_set():
                    self.lost = True
                    self.on_lost()
                return
