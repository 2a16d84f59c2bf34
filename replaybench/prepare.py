"""Preparing a config for timing: build the workload, warm it up eagerly, prepare every other mode
(capture a CUDA graph, or compile) and check that its output equals eager output on the same
inputs. What comes out is a :class:`Prepared`: one call per checked mode, ready to be timed by
``replaybench.engine``, and a ModeResult per mode saying why any could not be prepared. A mode whose
output was not checked equal is never timed, so a speedup always compares two computations known
to agree.

Runs inside the measuring process (``replaybench.worker``); imports torch, nothing from Prefect.
"""

from __future__ import annotations

import gc
import itertools
import time
from typing import Any, Callable

import torch

from .results import MeasureSettings, ModeResult
from .workload import BenchConfig, Built, Registry

clock = time.perf_counter
NO_CUDA = "no CUDA device"
# Graphs captured of a config in each process, replayed in turn. On the H200 one capture's replay
# ran ~3-4% faster or slower than another's of the same config in the same process, by where its
# memory pool lay (benchmarks/graph_process_effect.py): a process that times one capture carries
# that capture's luck into its figure, and a process that times several averages it out.
GRAPH_CAPTURES = 4
GRAPH_CAPTURES_MAX_BYTES = 1 << 30  # graph pools together; a larger graph is captured fewer times


class ModeFailure(Exception):
    def __init__(self, phase: str, reason: str):
        super().__init__(reason)
        self.phase = phase
        self.reason = reason


def describe(exc: BaseException) -> str:
    """One line a person understands: the exception type and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def clone_outputs(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (out.detach().clone(),)
    if isinstance(out, (tuple, list)):
        return tuple(o.detach().clone() for o in out if isinstance(o, torch.Tensor))
    raise TypeError(f"workload returned {type(out).__name__}; expected a tensor or a tuple of tensors")


def compare(expected: tuple, actual: tuple, against: str = "eager") -> tuple[str | None, float]:
    """Returns (why they differ or None, max abs difference); tolerances are torch's per dtype.
    ``against`` names where ``expected`` came from, for the reason."""
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
            return f"output {i} differs from {against}: " + "; ".join(lines[:3]), worst
    return None, worst


class Prepared:
    """One config made ready to time in this process; construct, then call ``prepare()``.

    ``calls`` maps each mode that was prepared and checked to one call of it (outputs ready after
    ``sync()``); ``results`` holds every mode's ModeResult so far (ok with its preparation costs,
    failed or skipped with the reason)."""

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
        self.eager_output: tuple | None = None  # eager's outputs on the built inputs, after warm-up

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
        start = clock()
        graph, static_out = self._capture(fn, inputs, stream, count_kernels=True)
        capture_s = clock() - start  # capture and instantiation: what a user pays once
        pool_bytes = torch.cuda.memory_reserved() - reserved_before
        start = clock()
        graph.replay()
        torch.cuda.synchronize()
        first_replay_s = clock() - start
        captured = [(graph, static_out)]
        while len(captured) < GRAPH_CAPTURES and pool_bytes * (len(captured) + 1) <= GRAPH_CAPTURES_MAX_BYTES:
            captured.append(self._capture(fn, inputs, stream))
        worst = 0.0
        for graph, static_out in captured:
            def replay_outputs(graph=graph, static_out=static_out):
                graph.replay()
                return static_out

            self.check("graph", replay_outputs)
            worst = max(worst, self.results["graph"].max_abs_diff)
        self.graphs = captured  # keep the graphs (and their pools) alive while timed
        turn = itertools.cycle(g for g, _ in captured)
        self.calls["graph"] = lambda: next(turn).replay()
        r = self.results["graph"]
        r.max_abs_diff = worst
        r.capture_s, r.first_replay_s, r.graph_pool_bytes = capture_s, first_replay_s, pool_bytes

    def _capture(self, fn, inputs, stream, count_kernels: bool = False):
        """One capture of ``fn`` on ``inputs``, in a memory pool of its own: (graph, its outputs)."""
        try:  # keep the cudaGraph_t to count its nodes (torch >= 2.7); instantiated below
            graph = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:
            graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                static_out = fn(*inputs)
            torch.cuda.synchronize()
        except Exception as exc:
            raise ModeFailure("capture", f"capture failed: {describe(exc)}") from exc
        if hasattr(graph, "raw_cuda_graph"):
            if count_kernels:
                self.kernels = graph_operations(graph.raw_cuda_graph())
            graph.instantiate()
        return graph, static_out

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

    # -- the whole config ---------------------------------------------------------------------
    def prepare(self) -> "Prepared":
        """Build, warm up, prepare and check every mode; failures are recorded, never raised."""
        s = self.settings
        torch.manual_seed(s.seed)
        try:
            self.built = self.workload.build(dict(self.config.params), self.device, self.dtype)
            if not isinstance(self.built, Built):
                raise TypeError(f"build returned {type(self.built).__name__}, not Built")
        except Exception as exc:
            for m in s.modes:
                self.fail(m, "build", f"building the workload failed: {describe(exc)}")
            return self
        with torch.inference_mode():
            try:
                self.prepare_eager()
                self.eager_output = clone_outputs(self.built.fn(*self.built.inputs))
                self.sync()
            except Exception as exc:
                for m in s.modes:
                    self.fail(m, "forward", f"eager forward failed: {describe(exc)}")
                self.context_lost("in the eager forward")
                return self
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
                    return self
        return self

    def ok_modes(self) -> list[str]:
        return [m for m in self.settings.modes if m in self.calls]

    @property
    def failed(self) -> bool:
        """Whether a mode failed or crashed here: deterministic, so not repeated elsewhere."""
        return any(r.status in ("failed", "crashed") for r in self.results.values())


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
