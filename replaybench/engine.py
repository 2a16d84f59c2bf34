"""The measuring engine: one workload config in, one ConfigResult out.

For each config: build the workload, warm up eagerly, prepare every other mode (capture a CUDA
graph, or compile) and check that its output equals eager output on the same inputs, then time all
checked modes in interleaved blocks (eager, graph, eager, graph, ...) until the stopping rule is met.
A mode whose output was not checked equal is never timed, so a speedup always compares two
computations known to agree.

This module imports torch but nothing from Prefect; it is meant to run inside the measuring process
(see ``replaybench.worker``), never in the orchestrating process.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from typing import Any, Callable

import torch

from . import health
from .results import ConfigResult, MeasureSettings, ModeResult, Series
from .stats import StoppingRule, interleave, summarize
from .workload import BenchConfig, Built, Registry

clock = time.perf_counter
NO_CUDA = "no CUDA device"

# Kernel launches the GPU's queue takes before the host blocks; a GPU-time block enqueues fewer.
LAUNCH_QUEUE_BUDGET = 600


class ModeFailure(Exception):
    def __init__(self, phase: str, reason: str):
        super().__init__(reason)
        self.phase = phase
        self.reason = reason


def describe(exc: BaseException) -> str:
    """One line a person understands: the exception type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def gc_paused():
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def clone_outputs(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (out.detach().clone(),)
    if isinstance(out, (tuple, list)):
        return tuple(o.detach().clone() for o in out if isinstance(o, torch.Tensor))
    raise TypeError(f"workload returned {type(out).__name__}; expected a tensor or a tuple of tensors")


def compare(expected: tuple, actual: tuple) -> tuple[str | None, float]:
    """Returns (why they differ or None, max abs difference); tolerances are torch's per dtype."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}", float("inf")
    worst = 0.0
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e.shape == a.shape and e.dtype == a.dtype and e.numel():
            worst = max(worst, float((e.double() - a.double()).abs().max()))
        try:
            torch.testing.assert_close(a, e)
        except AssertionError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return f"output {i} differs from eager: " + "; ".join(lines[:3]), worst
    return None, worst


class Measurement:
    """Measures one config; construct, then call ``run()``."""

    def __init__(self, config: BenchConfig, settings: MeasureSettings, registry: Registry):
        self.config = config
        self.settings = settings
        self.workload = registry.get(config.workload)
        self.cuda = torch.cuda.is_available() and not settings.force_cpu
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = getattr(torch, config.params["dtype"])
        self.results: dict[str, ModeResult] = {}
        self.calls: dict[str, Callable[[], Any]] = {}  # mode -> one call, outputs ready after sync
        self.lost_context: str | None = None
        self.kernels: float | None = None  # GPU operations per call, counted in the captured graph

    # -- helpers -------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def fail(self, mode: str, phase: str, reason: str) -> None:
        self.results[mode] = ModeResult(mode=mode, status="failed", phase=phase, reason=reason)

    def skip(self, mode: str, reason: str) -> None:
        self.results[mode] = ModeResult(mode=mode, status="skipped", reason=reason)

    def context_lost(self, where: str) -> bool:
        """After a sticky CUDA error nothing more can run in this process: mark what is left."""
        if self.lost_context is None:
            if not self.cuda or not _cuda_broken():
                return False
            self.lost_context = f"CUDA context lost {where} (sticky CUDA error)"
        for mode in self.settings.modes:
            if mode not in self.results or self.results[mode].status == "ok":
                self.fail(mode, "cuda", self.lost_context)
        self.calls.clear()
        return True

    def check(self, mode: str, run_candidate: Callable[[], Any]) -> None:
        """Candidate output must equal eager output, on the captured inputs and on fresh ones."""
        built = self.built
        worst = 0.0
        for trial in range(2):
            if trial:
                for x in built.inputs:
                    if isinstance(x, torch.Tensor) and x.is_floating_point():
                        x.copy_(torch.randn_like(x))
            if built.reset:
                built.reset()
            expected = clone_outputs(built.fn(*built.inputs))
            self.sync()
            if built.reset:
                built.reset()
            actual = clone_outputs(run_candidate())
            self.sync()
            why, diff = compare(expected, actual)
            worst = max(worst, diff)
            if why:
                raise ModeFailure("check", why)
        self.results[mode] = ModeResult(mode=mode, status="ok", max_abs_diff=worst)

    # -- preparing each mode ------------------------------------------------------------------
    def prepare_eager(self) -> None:
        fn, inputs = self.built.fn, self.built.inputs
        for _ in range(self.settings.warmup_iters):
            fn(*inputs)
        self.sync()
        self.calls["eager"] = lambda: fn(*inputs)
        self.results["eager"] = ModeResult(mode="eager", status="ok")

    def prepare_graph(self) -> None:
        if not self.cuda:
            return self.skip("graph", NO_CUDA)
        if not self.workload.capturable:
            return self.skip("graph", self.workload.not_capturable_reason or "workload declares it cannot be captured")
        fn, inputs = self.built.fn, self.built.inputs
        # A host synchronisation inside capture invalidates it, and on torch 2.11 an .item() during
        # capture hung the process (seen on an H200): find it with one eager call first.
        sync = find_host_sync(fn, inputs)
        if sync:
            raise ModeFailure("capture", f"cannot be captured: the call synchronizes with the host ({sync})")
        # Warm up on the stream we capture on: cuBLAS handles and workspaces are made per stream.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved()
        try:  # keep the cudaGraph_t to count its nodes (torch >= 2.7); instantiated below
            graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:
            graph = torch.cuda.CUDAGraph()
        start = clock()
        try:
            with torch.cuda.graph(graph, stream=stream):
                static_out = fn(*inputs)
            torch.cuda.synchronize()
        except Exception as exc:
            raise ModeFailure("capture", f"capture failed: {describe(exc)}") from exc
        if hasattr(graph, "raw_cuda_graph"):
            self.kernels = graph_operations(graph.raw_cuda_graph())
            graph.instantiate()
        capture_s = clock() - start  # capture and instantiation: what a user pays once
        pool_bytes = torch.cuda.memory_reserved() - reserved_before
        start = clock()
        graph.replay()
        torch.cuda.synchronize()
        first_replay_s = clock() - start

        def replay_outputs():
            graph.replay()
            return static_out

        self.check("graph", replay_outputs)
        self.graph = graph  # keep the graph (and its pool) alive while it is timed
        self.calls["graph"] = graph.replay
        r = self.results["graph"]
        r.capture_s, r.first_replay_s, r.graph_pool_bytes = capture_s, first_replay_s, pool_bytes

    def prepare_compiled(self, mode: str) -> None:
        fn, inputs = self.built.fn, self.built.inputs
        kwargs = {"mode": "reduce-overhead"} if mode == "compile_cudagraphs" else {}
        if mode == "compile_cudagraphs" and not self.cuda:
            return self.skip(mode, NO_CUDA)
        try:
            compiled = torch.compile(fn, **kwargs)
            skips_before = _cudagraph_skips()
            start = clock()
            compiled(*inputs)
            self.sync()
            compile_s = clock() - start
            for _ in range(self.settings.warmup_iters):
                compiled(*inputs)
            self.sync()
        except Exception as exc:
            raise ModeFailure("compile", f"torch.compile failed: {describe(exc)}") from exc
        self.check(mode, lambda: compiled(*inputs))
        r = self.results[mode]
        r.compile_s = compile_s
        if mode == "compile_cudagraphs":
            skips = _cudagraph_skips()
            r.graphs_used = None if skips is None else skips == skips_before
            if r.graphs_used is False:
                r.flags.append("torch.compile skipped CUDA graphs for this workload")
        self.calls[mode] = lambda: compiled(*inputs)

    # -- timing -------------------------------------------------------------------------------
    def iterations_per_block(self, call: Callable[[], Any], target_s: float, per_call_sync: bool) -> int:
        n = 1
        while True:
            seconds = self.time_block(call, n, per_call_sync) * n
            if seconds >= target_s or n >= 1 << 20:
                return n
            n = max(n * 2, int(n * target_s / max(seconds, 1e-9) * 1.2))

    def time_block(self, call: Callable[[], Any], n: int, per_call_sync: bool) -> float:
        """Seconds per iteration over n back-to-back calls and one synchronize (throughput), or
        with a synchronize after every call (latency)."""
        sync = self.sync
        if per_call_sync:
            sync()
            start = clock()
            for _ in range(n):
                call()
                sync()
            return (clock() - start) / n
        sync()
        start = clock()
        for _ in range(n):
            call()
        sync()
        return (clock() - start) / n

    def timed_series(self, per_call_sync: bool, budget_s: float) -> dict[str, list[float]]:
        timers = {}
        for mode, call in self.calls.items():
            n = self.iterations_per_block(call, self.settings.block_s, per_call_sync)
            if not per_call_sync:
                self.results[mode].iters_per_block = n
            timers[mode] = lambda call=call, n=n: self.time_block(call, n, per_call_sync)
        rule = StoppingRule(self.settings.precision, self.settings.min_blocks, budget_s=budget_s * len(timers))
        with gc_paused():
            return interleave(rule, timers, clock)

    def gpu_series(self, throughput: dict[str, float], kernels: float | None) -> dict[str, tuple[list, list]]:
        """GPU time and host enqueue time per iteration, with launch gaps removed.

        The stream is held by a spin kernel while n iterations are enqueued behind it; CUDA events
        then time the iterations back to back. A block counts only if the hold outlasted the
        enqueue (otherwise the GPU caught up with the host and launch gaps crept in).
        """
        cycles_per_s = _sleep_rate()
        n = max(1, min(200, LAUNCH_QUEUE_BUDGET // max(int(kernels or 1), 1)))
        out: dict[str, tuple[list, list]] = {}
        for mode, call in self.calls.items():
            gpu, enqueue = [], []
            hold_s = max(2 * n * throughput[mode], 0.002)
            # A call that waits for the GPU (.item() in forward) waits out any hold: stop doubling.
            max_hold_s = max(4 * n * throughput[mode], MAX_HOLD_S)
            attempts = 0
            while len(gpu) < self.settings.min_blocks and attempts < 4 * self.settings.min_blocks:
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

    # -- the whole config ---------------------------------------------------------------------
    def run(self) -> ConfigResult:
        s = self.settings
        result = ConfigResult(
            workload=self.config.workload,
            params=self.config.params,
            device=torch.cuda.get_device_name() if self.cuda else "cpu",
            modes=[],
            cpu_core=health.current_core(),
            load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            host_calibration_s=health.host_calibration(),
            health_before=health.gpu_health() if self.cuda else None,
        )
        started = clock()
        torch.manual_seed(s.seed)
        self.measure_modes()
        self.context_lost("after measuring")
        result.measuring_s = clock() - started
        result.process_unusable = self.lost_context is not None
        result.health_after = health.gpu_health() if self.cuda else None
        result.modes = [self.results[m] for m in s.modes]
        return result

    def measure_modes(self) -> None:
        s = self.settings
        try:
            self.built = self.workload.build(dict(self.config.params), self.device, self.dtype)
            if not isinstance(self.built, Built):
                raise TypeError(f"build returned {type(self.built).__name__}, not Built")
        except Exception as exc:
            for m in s.modes:
                self.fail(m, "build", f"building the workload failed: {describe(exc)}")
            return
        with torch.inference_mode():
            try:
                self.prepare_eager()
                clone_outputs(self.built.fn(*self.built.inputs))
                self.sync()
            except Exception as exc:
                for m in s.modes:
                    self.fail(m, "forward", f"eager forward failed: {describe(exc)}")
                self.context_lost("in the eager forward")
                return
            for mode in s.modes:
                if mode == "eager":
                    continue
                try:
                    if mode == "graph":
                        self.prepare_graph()
                    else:
                        self.prepare_compiled(mode)
                except ModeFailure as exc:
                    self.fail(mode, exc.phase, exc.reason)
                except Exception as exc:
                    self.fail(mode, "prepare", describe(exc))
                if self.context_lost(f"while preparing {mode}"):
                    return
            try:
                self.time_modes()
            except Exception as exc:
                for mode in self.calls:
                    self.fail(mode, "measure", f"timing failed: {describe(exc)}")

    def time_modes(self) -> None:
        s = self.settings
        throughput = self.timed_series(per_call_sync=False, budget_s=s.time_budget_s)
        latency = self.timed_series(per_call_sync=True, budget_s=s.time_budget_s / 2)
        for mode, blocks in throughput.items():
            r = self.results[mode]
            r.throughput = _series(blocks, s)
            r.latency = _series(latency[mode], s)
        if not self.cuda:
            return
        medians = {m: self.results[m].throughput.median for m in self.calls}
        for mode, (gpu, enqueue) in self.gpu_series(medians, self.kernels).items():
            r = self.results[mode]
            if mode in ("eager", "graph"):
                r.kernels_per_iter = self.kernels
            if gpu:
                r.gpu = _series(gpu, s)
                r.host_enqueue = _series(enqueue, s)
            else:
                r.flags.append(
                    "GPU time not measured: enqueueing outlasted every hold of the stream "
                    "(does the call wait for the GPU?)"
                )


# Operators that make the host wait for the GPU: none may run while a graph is captured.
_HOST_SYNC_OPS = {
    "aten::item": ".item(), or a Python number taken from a tensor",
    "aten::_local_scalar_dense": ".item(), or a Python number taken from a tensor",
    "aten::is_nonzero": "a tensor used as a Python bool",
    "aten::equal": "torch.equal",
    "aten::nonzero": "nonzero (output shape depends on the data)",
    "aten::masked_select": "boolean-mask selection (output shape depends on the data)",
    "aten::_unique2": "unique (output shape depends on the data)",
    "aten::unique_consecutive": "unique_consecutive (output shape depends on the data)",
}


def find_host_sync(fn: Callable[..., Any], inputs: tuple) -> str | None:
    """Run ``fn(*inputs)`` once and name the first operation that would wait on the host, or None.

    A dispatch mode sees every operator the call runs, which torch's sync debug mode does not
    (it missed an .item() on torch 2.11).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Finder(TorchDispatchMode):
        found: str | None = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._schema.name
            if self.found is None:
                if name in _HOST_SYNC_OPS:
                    self.found = f"{name}: {_HOST_SYNC_OPS[name]}"
                elif name == "aten::index" and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
                ):
                    self.found = "aten::index: boolean-mask indexing (output shape depends on the data)"
                elif name in ("aten::_to_copy", "aten::copy_") and _to_host(name, args, kwargs):
                    self.found = f"{name}: a copy from the GPU to the CPU (.cpu(), .tolist(), .numpy())"
            return func(*args, **kwargs)

    finder = Finder()
    with finder:
        fn(*inputs)
    return finder.found


def _to_host(name: str, args, kwargs) -> bool:
    source = args[1] if name == "aten::copy_" else args[0]
    if not (isinstance(source, torch.Tensor) and source.is_cuda):
        return False
    if name == "aten::copy_":
        return args[0].device.type == "cpu"
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu"


def _series(blocks: list[float], s: MeasureSettings) -> Series:
    summary = summarize(blocks)
    met = summary.n >= s.min_blocks and summary.rel_halfwidth <= s.precision
    return Series(**summary.__dict__, precision_met=met, blocks=list(blocks))


def _cuda_broken() -> bool:
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


_GRAPH_OPERATION_TYPES = (0, 1, 2)  # cudaGraphNodeType: kernel, memcpy, memset


def graph_operations(raw_graph: int) -> int | None:
    """Kernels, copies and memsets in a captured cudaGraph_t, through the CUDA runtime that torch
    loaded (found in this process's memory map); None where it cannot be found."""
    import ctypes

    try:
        paths = {line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line}
        runtime = ctypes.CDLL(sorted(paths)[0])
        count = ctypes.c_size_t(0)
        graph = ctypes.c_void_p(raw_graph)
        if runtime.cudaGraphGetNodes(graph, None, ctypes.byref(count)) != 0:
            return None
        nodes = (ctypes.c_void_p * count.value)()
        if runtime.cudaGraphGetNodes(graph, nodes, ctypes.byref(count)) != 0:
            return None
        kinds = []
        for node in nodes:
            kind = ctypes.c_int(-1)
            runtime.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
            kinds.append(kind.value)
    except (OSError, IndexError, AttributeError):
        return None
    return sum(k in _GRAPH_OPERATION_TYPES for k in kinds)


def _cudagraph_skips() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:
        return None


_SLEEP_RATE: float | None = None


MAX_HOLD_S = 0.25  # longest stream hold tried for GPU time, unless a block's iterations take longer


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


def measure(config: BenchConfig, settings: MeasureSettings, registry: Registry) -> ConfigResult:
    """Measure one config in this process; ``process_unusable`` is set after a sticky CUDA error.
    Speedups and flags are derived afterwards (``replaybench.analysis.derive``), once the results of
    every measuring process are combined."""
    return Measurement(config, settings, registry).run()
