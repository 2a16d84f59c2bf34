"""The measuring process's main: ``python -m replaybench.child SETTINGS_JSON``.

Started by ``replaybench.worker.MeasuringProcess`` with one end of a pipe inherited as a file
descriptor; answers one request with one reply (``replaybench.engine.handle``) until the pipe closes.
A plain subprocess rather than a multiprocessing child, so that a variant of an A/B run can be
another interpreter, with its own torch and nothing of this one's packages.

Imports torch and the engine, nothing from Prefect, numpy or scipy.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import threading
from multiprocessing.connection import Connection


def end_with(parent: int) -> None:
    """End this process as soon as ``parent``, its orchestrating process, is gone, also when it was
    killed with no chance to kill us: the closed pipe would tell us only after the request in hand
    (a config, a hang up to its timeout), all the while holding the GPU. A thread blocked on the
    parent's pidfd wakes only then, so timing never shares the interpreter with it. Only where the
    parent started us itself (not through a wrapper, or from another PID namespace, where its pid
    names another process or none), on Linux 5.3+ with Python 3.9+; elsewhere the closed pipe is
    the only sign."""
    if os.getppid() != parent:
        return
    try:
        parent_fd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        return

    def wait() -> None:
        if hasattr(signal, "SIGUSR1"):  # the parent's "where are you stuck?" is for the main thread
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        poll = select.poll()
        poll.register(parent_fd, select.POLLIN)
        while not poll.poll():
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="replaybench-parent-watch", daemon=True).start()


def serve(conn, core: int | None, workload_paths: list[str], shadowing: list[str], trace_path: str | None = None) -> None:
    from . import health

    if trace_path and hasattr(signal, "SIGUSR1"):
        # On a timeout the parent asks where we are stuck before it kills us.
        faulthandler.register(signal.SIGUSR1, file=open(trace_path, "w"), all_threads=False)

    pinned = health.pin_to_core(core)
    import torch

    if pinned is not None:
        torch.set_num_threads(1)  # one core: more threads only contend for it
    from .engine import handle, warm_up

    # One-time start-up costs (CUDA context, cuBLAS handles and kernels, graph capture, NVML) paid
    # now, while every process of the pool starts at once, rather than in the first config, one
    # process after the other: on an H200 the first config took 31.8 s against 7.4-9.0 s for the
    # others with a pool of six.
    warm_up()
    from .workload import load_registry

    registry = load_registry(workload_paths, shadowing=shadowing)
    facts = health.torch_facts()
    facts["cpu_core"] = pinned
    facts["workloads_broken"] = registry.broken
    facts["executable"] = sys.executable
    conn.send(("ready", facts))
    session = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        session, reply = handle(session, message, registry)
        conn.send(reply)
        if reply.get("process_unusable"):
            return  # a fresh process is the only way back to a usable CUDA context


def main() -> None:
    # The orchestrating process owns this one: a Ctrl-C to the terminal, or a SIGTERM to the
    # process group, is for it to act on (it stops and kills its measuring processes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = json.loads(sys.argv[1])
    if settings.get("parent"):
        end_with(settings["parent"])
    conn = Connection(settings["fd"])
    serve(conn, settings["core"], settings["workload_paths"], settings["shadowing"], settings["trace_path"])


if __name__ == "__main__":
    main()
