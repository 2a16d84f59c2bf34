"""A temporary local Prefect server for a CLI run, when no PREFECT_API_URL is set: Prefect's own
(``SubprocessASGIServer``), but started in a session of its own, so that a Ctrl-C to the terminal
reaches the run and not the server. The run then ends in order (its flow run marked on a live
server, its store updated) and stops the server itself, instead of calling a dead one for minutes.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager


class _SessionPopen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("start_new_session", True)
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


def kill_server() -> None:
    """At once, for a second Ctrl-C."""
    process = getattr(_current, "server_process", None)
    if process is not None and process.poll() is None:
        process.kill()
