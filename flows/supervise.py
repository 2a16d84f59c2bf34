"""Stopping `replaybench worker` and `replaybench serve` cleanly.

Prefect's own worker and runner, sent SIGTERM or SIGINT, stop the flow runs they started mid-config
and can leave them ``Running`` on the server. So each runs here in a process of its own session,
supervised: the first SIGINT, SIGTERM or SIGHUP freezes that process (SIGSTOP: it takes no more flow
runs, and its flow runs keep the pipes it reads their output from) and writes a stop file that its
flow runs check between configs (``stop_requested``). Each one in
progress finishes its current config, stores its run as interrupted with every finished result,
and ends ``Cancelled``; with ``--now``, or at a second signal, they are sent SIGTERM and stop at once,
the same way. The supervisor exits once they have. Killed outright (SIGKILL, the OOM killer), the
supervisor can do none of that; the kernel then kills the process it supervised (``dies_with_parent``)
instead of leaving it to take more flow runs. Flow runs it had started are left running, their
output no longer read.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

STOP_VARIABLE = "REPLAYBENCH_STOP_FILE"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_requested() -> str | None:
    """The name of the signal that asked this flow run's worker or serve process to stop, if one did."""
    path = os.environ.get(STOP_VARIABLE)
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or "a stop request"
    except OSError:
        return None


class WorkerStopping(Exception):
    """Raised between configs once the worker or serve process running this flow run is stopping."""

    def __init__(self, signal_name: str):
        super().__init__(f"stopped by {signal_name} to the worker")
        self.signal_name = signal_name


def check_stop() -> None:
    if signal_name := stop_requested():
        raise WorkerStopping(signal_name)


_PR_SET_PDEATHSIG = 1


def dies_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel sends ``sig`` to the child once the process that
    started it ends, however it ends: a child in a session of its own is out of reach of the
    signals its parent's process group gets. Linux only (None elsewhere); the parent's thread that
    starts the child must live as long as the parent, as the main thread does."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        if sig != signal.SIGKILL:  # until exec the child has the parent's Python handler, which would only note it
            signal.signal(sig, signal.SIG_DFL)
        # Best effort: should the kernel refuse, the child still starts, as it did without this.
        prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig))
        if os.getppid() != parent:  # the parent ended before the call above: nothing will send it
            os._exit(1)

    return preexec


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def supervise(command: list[str], what: str, now: bool = False) -> int:
    """Run ``command`` (a Prefect worker or serve process) until a signal, then stop as the module
    says; the exit status is the command's own where it ended by itself, else 0."""
    stop_file = Path(tempfile.mkdtemp(prefix="replaybench-stop-")) / "stop"
    received: list[int] = []
    signal_handlers = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in SIGNALS}
    process = subprocess.Popen(command, env={**os.environ, STOP_VARIABLE: str(stop_file)}, start_new_session=True,
                               preexec_fn=dies_with_parent())
    try:
        while not received:
            if process.poll() is not None:
                return process.returncode
            time.sleep(0.2)
        name = signal.Signals(received[0]).name
        stop_file.write_text(name)
        process.send_signal(signal.SIGSTOP)  # no more flow runs taken; those running go on
        flow_runs = _children(process.pid)  # the flow-run processes it started
        if not any(alive(p) for p in flow_runs):
            print(f"{what} stopped ({name})", file=sys.stderr)
            return 0
        if now:
            _kill(flow_runs, signal.SIGTERM)
        print(f"{what} stopping ({name}): {len(flow_runs)} flow run(s) "
              + ("stopping now" if now else "finish their current config (a second signal stops them now)"),
              file=sys.stderr, flush=True)
        signalled = len(received)
        while any(alive(p) for p in flow_runs):
            if len(received) > signalled:
                signalled = len(received)
                _kill(flow_runs, signal.SIGTERM if signalled == 2 else signal.SIGKILL)
            time.sleep(0.2)
        print(f"{what} stopped: its flow run(s) cancelled, their finished results stored", file=sys.stderr)
        return 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for sig, handler in signal_handlers.items():
            signal.signal(sig, handler)
        stop_file.unlink(missing_ok=True)
        stop_file.parent.rmdir()
