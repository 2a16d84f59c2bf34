"""Timing a prepared config, in the measuring process.

A measuring process holds one :class:`Session` per config: ``prepare`` builds and checks every
mode (``replaybench.prepare``), then the orchestrating side asks for ``round``s, in turn with the
other measuring processes, until the stopping rule over the reported figures is met
(``replaybench.worker``), and ``finish`` adds latency, GPU time and host enqueue time and releases
the config. Nothing here decides when to stop or computes a reported figure: that happens where
every process's blocks meet (``replaybench.analysis``).

A round is ``units`` units; a unit is one block of each checked mode back to back (eager, graph,
...), each block many calls timed as one, and every unit is bracketed by a fixed CPU reference
block, so that a unit timed while the host's core ran slow can be told and set aside.

Imports torch but nothing from Prefect.
"""

from __future__ import annotations

import gc
import os
import pickle
import time
from contextlib import contextmanager
from typing import Any, Callable

import torch

from . import health
from .prepare import Prepared, compare, describe
from .results import MeasureSettings
from .workload import BenchConfig, Registry

clock = time.perf_counter

# Kernel launches the GPU's queue takes before the host blocks; a GPU-time block enqueues fewer.
LAUNCH_QUEUE_BUDGET = 600
MAX_HOLD_S = 0.25  # longest stream hold tried for GPU time, unless a block's iterations take longer
REFERENCE_ADDS = 300  # one-element CPU additions in the host reference block (0.2-0.3 ms on an H200 host)
LATENCY_UNITS = 4  # latency units per process (a synchronize after every call)
GPU_BLOCKS = 4  # GPU-time blocks per process and mode (steady: within 0.5% in one process)


@contextmanager
def gc_paused():
    """No garbage collection while timing; ``Session.prepare`` collects once before the rounds
    (a collection costs about 0.1 s with torch loaded: far more than a round)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_REF_TENSORS: tuple | None = None


def reference_block() -> float:
    """Seconds for a fixed number of in-place additions of one-element CPU tensors: the dispatcher
    path an eager launch takes too, without the GPU. On the H200 VMs it ran about 2x slower while
    a core was disturbed, in step with eager (correlation 0.75-0.87; benchmarks/host_noise.py)."""
    global _REF_TENSORS
    if _REF_TENSORS is None:
        _REF_TENSORS = (torch.zeros(1), torch.ones(1))
    a, b = _REF_TENSORS
    start = clock()
    for _ in range(REFERENCE_ADDS):
        a.add_(b)
    return clock() - start


def time_block(call: Callable[[], Any], n: int, sync: Callable[[], None], per_call_sync: bool) -> float:
    """Seconds per iteration over n back-to-back calls and one synchronize (throughput), or with a
    synchronize after every call (latency)."""
    sync()
    start = clock()
    if per_call_sync:
        for _ in range(n):
            call()
            sync()
    else:
        for _ in range(n):
            call()
        sync()
    return (clock() - start) / n


def iterations_per_block(call, sync, target_s: float, per_call_sync: bool) -> int:
    """Calls per block so that a block lasts about ``target_s``."""
    n = 1
    while True:
        seconds = time_block(call, n, sync, per_call_sync) * n
        if seconds >= target_s or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * target_s / max(seconds, 1e-9) * 1.2))


def timed_units(calls: dict, iters: dict, sync, units: int, per_call_sync: bool) -> dict[str, list[float]]:
    """``units`` units, each one block of every call in turn, each bracketed by reference blocks:
    {"ref": units + 1 reference times, mode: units block times (seconds per iteration)}."""
    out: dict[str, list[float]] = {"ref": [], **{mode: [] for mode in calls}}
    with gc_paused():
        out["ref"].append(reference_block())
        for _ in range(units):
            for mode, call in calls.items():
                out[mode].append(time_block(call, iters[mode], sync, per_call_sync))
            out["ref"].append(reference_block())
    return out


def warm_up() -> None:
    """Run once what the first config of a process would otherwise pay for: a small MLP eagerly
    and captured as a graph on a side stream, the stream-holding spin kernel, NVML, the reference
    block. Without CUDA, only the reference block."""
    reference_block()
    if not torch.cuda.is_available():
        return
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128)).cuda().eval()
    x = torch.randn(1, 128, device="cuda")
    with torch.inference_mode():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            model(x)
        graph.replay()
    _sleep_rate()
    health.gpu_health()
    torch.cuda.synchronize()
    del graph, model, x
    torch.cuda.empty_cache()


class Session:
    """One config in one measuring process: prepare, rounds, finish."""

    def __init__(self, config: BenchConfig, settings: MeasureSettings, registry: Registry, outputs: dict | None = None):
        """``outputs`` (A/B runs): {"send": True} to reply with eager's outputs, {"expected": those
        outputs} to check this process's eager outputs against them."""
        self.outputs = outputs or {}
        self.settings = settings
        self.started = clock()
        self.prepared = Prepared(config, settings, registry)
        self.throughput_iters: dict[str, int] = {}
        self.latency_iters: dict[str, int] = {}

    def prepare(self) -> dict[str, Any]:
        """Prepare every mode; returns what the orchestrating side needs to go on: the modes'
        results so far, the modes that can be timed, and facts of this process and GPU."""
        p = self.prepared.prepare()
        cuda = p.cuda
        outputs: dict[str, Any] = {}
        # Outputs travel as plain pickles (a multiprocessing pipe would share tensors through file
        # descriptors): bytes the orchestrating process hands on to the other variant unread.
        if p.eager_output is not None and self.outputs.get("send"):
            outputs["output"] = pickle.dumps(tuple(t.cpu() for t in p.eager_output))
        if p.eager_output is not None and self.outputs.get("expected") is not None:
            try:
                expected = pickle.loads(self.outputs["expected"])
                why, _ = compare(tuple(t.to(p.device) for t in expected), p.eager_output, against="A's")
            except Exception as exc:  # another torch's tensors, say: not comparable here
                why = f"cannot compare with A's outputs: {describe(exc)}"
            outputs["output_differs"] = why
        health_before = health.gpu_health() if cuda else None
        try:
            with torch.inference_mode():
                for mode, call in p.calls.items():
                    self.throughput_iters[mode] = iterations_per_block(call, p.sync, self.settings.block_s, False)
                    self.latency_iters[mode] = iterations_per_block(call, p.sync, self.settings.block_s, True)
                    p.results[mode].iters_per_block = self.throughput_iters[mode]
                reference_block()  # warm
            gc.collect()
        except Exception as exc:
            self._timing_failed(exc)
        return {
            "modes": dict(p.results),
            "timed": p.ok_modes(),
            "failed": p.failed,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "cpu_core": health.current_core(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "health_before": health_before,
            "process_unusable": p.lost_context is not None,
            **outputs,
        }

    def _timing_failed(self, exc: BaseException) -> None:
        p = self.prepared
        for mode in list(p.calls):
            p.fail(mode, "measure", f"timing failed: {describe(exc)}")
        p.calls.clear()
        p.context_lost("while timing")

    def calls(self, modes: list[str] | None) -> dict[str, Callable[[], Any]]:
        calls = self.prepared.calls
        return {m: calls[m] for m in modes if m in calls} if modes is not None else dict(calls)

    def round(self, units: int, modes: list[str] | None = None) -> dict[str, Any]:
        """``units`` timed units of ``modes`` (default: every checked mode)."""
        p = self.prepared
        try:
            with torch.inference_mode():
                return {"units": timed_units(self.calls(modes), self.throughput_iters, p.sync, units, False)}
        except Exception as exc:
            self._timing_failed(exc)
            return {"modes": dict(p.results), "process_unusable": p.lost_context is not None}

    def finish(self, modes: list[str] | None = None) -> dict[str, Any]:
        """Latency units, GPU time and host enqueue time of ``modes`` (default: every checked mode)."""
        p = self.prepared
        calls = self.calls(modes)
        out: dict[str, Any] = {"latency": None, "gpu": {}}
        try:
            with torch.inference_mode():
                if calls:
                    out["latency"] = timed_units(calls, self.latency_iters, p.sync, LATENCY_UNITS, True)
                if p.cuda and calls:
                    out["gpu"] = gpu_series(calls, self.throughput_iters, self.settings.block_s, p.kernels, GPU_BLOCKS)
        except Exception as exc:
            self._timing_failed(exc)
        out["kernels"] = p.kernels
        out["modes"] = dict(p.results)
        out["health_after"] = health.gpu_health() if p.cuda else None
        out["measuring_s"] = clock() - self.started
        out["process_unusable"] = p.context_lost("after measuring") or p.lost_context is not None
        return out


def handle(session: Session | None, message: tuple, registry: Registry) -> tuple[Session | None, dict[str, Any]]:
    """One request of the measuring protocol (``replaybench.worker``): the session afterwards and
    the reply. ``("prepare", config, settings[, outputs])`` starts a session; ``("round", units, modes)`` and
    ``("finish", modes)`` time it, finish releasing it; ``("release",)`` drops it unfinished."""
    kind, args = message[0], message[1:]
    if kind.startswith("plan_"):
        from .plan_measure import handle as handle_plan

        return handle_plan(session, message, registry)
    if kind == "prepare":
        config, settings, *outputs = args
        session = Session(config, settings, registry, *outputs)
        return session, session.prepare()
    if kind == "round":
        return session, session.round(*args)
    reply = session.finish(*args) if kind == "finish" else {}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None, reply


class InProcess:
    """Measures in this very process, through the same protocol as a measuring process: for tests
    and benchmarks that need to look inside, never for a run (no isolation, no timeout)."""

    core = None
    alive = True

    def __init__(self, registry: Registry):
        self.registry = registry
        self.session: Session | None = None

    def request(self, message: tuple, deadline: float) -> dict[str, Any]:
        self.session, reply = handle(self.session, message, self.registry)
        return reply


def measure(config: BenchConfig, settings: MeasureSettings, registry: Registry):
    """One config measured in this process (see InProcess): a ConfigResult."""
    from .worker import measure_in

    return measure_in([InProcess(registry)], config, settings, timeout_s=float("inf"))


def gpu_series(calls: dict, iters: dict, block_s: float, kernels: float | None, blocks: int) -> dict[str, tuple[list, list]]:
    """GPU time and host enqueue time per iteration, with launch gaps removed: mode -> (GPU times,
    enqueue times), empty where it could not be measured.

    The stream is held by a spin kernel while n iterations are enqueued behind it; CUDA events
    then time the iterations back to back. A block counts only if the hold outlasted the
    enqueue (otherwise the GPU caught up with the host and launch gaps crept in).
    """
    cycles_per_s = _sleep_rate()
    n = max(1, min(200, LAUNCH_QUEUE_BUDGET // max(int(kernels or 1), 1)))
    out: dict[str, tuple[list, list]] = {}
    for mode, call in calls.items():
        per_iter = block_s / iters[mode]
        gpu, enqueue = [], []
        hold_s = max(2 * n * per_iter, 0.002)
        # A call that waits for the GPU (.item() in forward) waits out any hold: stop doubling.
        max_hold_s = max(4 * n * per_iter, MAX_HOLD_S)
        attempts = 0
        while len(gpu) < blocks and attempts < 4 * blocks:
            attempts += 1
            start, held, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda.synchronize()
            with gc_paused():
                start.record()
                torch.cuda._sleep(int(hold_s * cycles_per_s))
                held.record()
                t0 = clock()
                for _ in range(n):
                    call()
                enqueue_s = clock() - t0
                end.record()
            end.synchronize()
            hold_measured = start.elapsed_time(held) / 1e3
            if enqueue_s >= 0.9 * hold_measured:
                if hold_s >= max_hold_s:
                    break
                hold_s = min(2 * hold_s, max_hold_s)  # the GPU caught up: hold longer and try again
                continue
            gpu.append(held.elapsed_time(end) / 1e3 / n)
            enqueue.append(enqueue_s / n)
        out[mode] = (gpu, enqueue)
    return out


_SLEEP_RATE: float | None = None


def _sleep_rate() -> float:
    """Cycles per second of torch.cuda._sleep on this GPU, measured once per process."""
    global _SLEEP_RATE
    if _SLEEP_RATE is None:
        cycles = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_RATE = cycles / (start.elapsed_time(end) / 1e3)
    return _SLEEP_RATE
