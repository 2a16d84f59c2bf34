"""Measuring capture plans on the GPU, inside a measuring process (``replaybench plan``).

Two requests of the measuring protocol (``replaybench.engine.handle``):

- ``("plan_sizes", workload, params, sizes, eager_sizes, options)`` builds the workload once for the
  largest size (``Workload.build_sizes``), captures each candidate size alone in a memory pool of its
  own (capture time, the pool's memory, what the graph keeps allocated), checks each replay against
  eager output, then times every size's replay and every size's eager call, in passes over all sizes
  so that a drift of the host touches every size alike;
- ``("plan_sets", sets, trace, timed)`` captures each named set of sizes into one shared memory
  pool, largest first, as serving engines do, measures its memory, checks every graph against eager
  and every padded batch of the trace against eager at its own size; with ``timed``, then replays
  the trace through each set: each batch copied into the first rows of its graph's static inputs
  and replayed (eagerly above the largest size), ``passes`` times, the sets taking turns.

A call is timed from its launch to its outputs being ready (synchronised after every call, as a
decode loop that reads its tokens back does), so that the times of a trace's calls add up.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

import torch

from .prepare import clone_outputs, compare, describe
from .workload import Built, Registry

clock = time.perf_counter


def _tensors(out) -> tuple:
    return (out,) if isinstance(out, torch.Tensor) else tuple(o for o in out if isinstance(o, torch.Tensor))


def _summary(samples: list[float]) -> dict[str, float]:
    median = statistics.median(samples)
    return {"s": median, "min": min(samples), "max": max(samples), "passes": len(samples)}


class PlanSession:
    def __init__(self, registry: Registry, workload: str, params: dict, largest: int, options: dict):
        if not torch.cuda.is_available():
            raise RuntimeError("a capture plan needs a CUDA device")
        self.options = options
        self.device = torch.device("cuda")
        self.dtype = getattr(torch, params["dtype"])
        w = registry.get(workload)
        torch.manual_seed(options.get("seed", 0))
        if w.build_sizes is not None:
            self.at_size: Callable[[int], Built] = w.build_sizes(params, self.device, self.dtype, largest)
        else:
            def at_size(b: int) -> Built:
                torch.manual_seed(options.get("seed", 0))
                return w.build({**params, "batch_size": b}, self.device, self.dtype)
            self.at_size = at_size
        self.built: dict[int, Built] = {}
        self.graphs: dict[int, tuple] = {}
        self.held_sets: list[dict] = []

    def at(self, b: int) -> Built:
        if b not in self.built:
            self.built[b] = self.at_size(b)
        return self.built[b]

    def reset(self, b: int) -> None:
        if self.at(b).reset:
            self.at(b).reset()

    def eager_output(self, b: int) -> tuple:
        built = self.at(b)
        self.reset(b)
        out = clone_outputs(built.fn(*built.inputs))
        torch.cuda.synchronize()
        return out

    def capture(self, c: int, pool) -> tuple:
        """(graph, its output tensors) of size ``c`` captured into ``pool``."""
        built = self.at(c)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = built.fn(*built.inputs)
        torch.cuda.synchronize()
        return graph, _tensors(out)

    def check_graph(self, c: int, graph, outputs) -> str | None:
        expected = self.eager_output(c)
        self.reset(c)
        graph.replay()
        torch.cuda.synchronize()
        why, _ = compare(expected, tuple(o.clone() for o in outputs))
        return why

    def padded_copies(self, b: int, c: int) -> list[tuple]:
        """(destination, source) pairs that put batch ``b`` into the first rows of size ``c``'s inputs."""
        pairs = []
        for dst, src in zip(self.at(c).inputs, self.at(b).inputs):
            if not isinstance(dst, torch.Tensor):
                continue
            if dst.dim() == 0 or src.shape[1:] != dst.shape[1:] or src.shape[0] != b or dst.shape[0] != c:
                raise ValueError(f"input of shape {tuple(src.shape)} at batch {b} cannot be padded into "
                                 f"{tuple(dst.shape)} at batch {c}: inputs must be batch-first")
            pairs.append((dst[:b], src))
        return pairs

    # -- requests ------------------------------------------------------------------------------
    def sizes(self, sizes: list[int], eager_sizes: list[int]) -> dict[str, Any]:
        failed: dict[int, str] = {}
        facts: dict[int, dict] = {}
        for c in sorted(set(sizes) | set(eager_sizes), reverse=True):
            built = self.at(c)
            for _ in range(3):  # warm-up: lazy initialisation, cuBLAS handles, allocator
                built.fn(*built.inputs)
            torch.cuda.synchronize()
        # A first capture allocates what captures on this stream keep for good (cuBLAS's workspace):
        # made now, in a throwaway capture, so that it is counted in no size's memory.
        self.first_capture = self.capture(max(sizes), torch.cuda.graph_pool_handle())
        for c in sorted(sizes, reverse=True):
            gc.collect()
            torch.cuda.empty_cache()  # as a capture does first: what it frees is not the graph's
            reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
            start = clock()
            try:
                graph, outputs = self.capture(c, torch.cuda.graph_pool_handle())
            except Exception as exc:
                failed[c] = f"capture failed: {describe(exc)}"
                continue
            capture_s = clock() - start
            # Never below zero: a capture may free a tensor that was allocated before it.
            facts[c] = {"capture_s": capture_s, "alone_bytes": max(torch.cuda.memory_reserved() - reserved, 0),
                        "held_bytes": max(torch.cuda.memory_allocated() - allocated, 0)}
            if why := self.check_graph(c, graph, outputs):
                failed[c] = f"replay differs from eager: {why}"
                continue
            copies = [(x, x.clone()) for x in self.at(c).inputs if isinstance(x, torch.Tensor)]
            self.graphs[c] = (graph, outputs, copies)
        calls, passes = self.options["calls"], self.options["passes"]
        graph_samples: dict[int, list[float]] = {c: [] for c in self.graphs}
        eager_samples: dict[int, list[float]] = {b: [] for b in eager_sizes}
        for _ in range(passes):
            for c, (graph, _, copies) in sorted(self.graphs.items()):
                graph_samples[c].append(_time_graph(graph, copies, calls))
            for b in sorted(eager_sizes):
                eager_samples[b].append(_time_eager(self.at(b), max(calls // 4, 5)))
        for c in self.graphs:
            facts[c]["graph"] = _summary(graph_samples[c])
        self.graphs.clear()
        gc.collect()
        torch.cuda.empty_cache()
        return {"sizes": facts, "eager": {b: _summary(s) for b, s in eager_samples.items()}, "failed": failed}

    def sets(self, sets: dict[str, list[int]], trace: list[int], timed: bool) -> dict[str, Any]:
        """Capture and check every set (each in a pool of its own, all held at once); with ``timed``,
        replay the trace through each in passes that visit every set in turn, so that a drift of
        the host during the passes touches every set alike."""
        results, plans = {}, {}
        for name, sizes in sets.items():
            results[name], steps = self._one_set(sizes, trace)
            if steps is not None:
                plans[name] = [steps[b] for b in trace]
        beside: dict[str, dict] = {"graph": {}, "eager": {}}
        if timed and plans:
            # Each size's own time, measured in the same passes: what the trace is predicted from.
            graphs = {}
            for held in self.held_sets:
                for c, (graph, outputs) in held.items():
                    graphs.setdefault(c, (graph, [(x, x.clone()) for x in self.at(c).inputs if isinstance(x, torch.Tensor)]))
            eager = sorted({b for name in plans for b in set(trace) if max(sets[name], default=0) < b})
            samples: dict[str, list[float]] = {name: [] for name in plans}
            size_samples: dict[int, list[float]] = {c: [] for c in graphs}
            eager_samples: dict[int, list[float]] = {b: [] for b in eager}
            names = list(plans)
            calls = max(self.options["calls"] // 4, 5)
            for p in range(self.options["passes"]):
                for name in names[p % len(names):] + names[: p % len(names)]:
                    samples[name].append(_time_trace(plans[name]))
                for c, (graph, copies) in graphs.items():
                    size_samples[c].append(_time_graph(graph, copies, calls))
                for b in eager:
                    eager_samples[b].append(_time_eager(self.at(b), max(calls // 4, 3)))
            for name, times in samples.items():
                results[name]["replay"] = _summary(times)
            beside = {"graph": {c: _summary(t) for c, t in size_samples.items()},
                      "eager": {b: _summary(t) for b, t in eager_samples.items()}}
        plans.clear()
        self.held_sets.clear()
        gc.collect()
        torch.cuda.empty_cache()
        return {"sets": results, "beside": beside}

    def _one_set(self, sizes: list[int], trace: list[int]) -> tuple[dict[str, Any], dict | None]:
        """Capture one set into a shared pool, largest first, and check it: (its result, the step
        of each batch size of the trace), the steps None where it failed."""
        gc.collect()
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
        graphs: dict[int, tuple] = {}
        pool = torch.cuda.graph_pool_handle()
        start = clock()
        try:
            for c in sorted(sizes, reverse=True):  # the largest first: the smaller ones reuse its memory
                graphs[c] = self.capture(c, pool)
        except Exception as exc:
            return {"status": "failed", "reason": f"capture of size {c} failed: {describe(exc)}"}, None
        result: dict[str, Any] = {"capture_s": clock() - start, "memory_bytes": torch.cuda.memory_reserved() - reserved}
        try:
            for c, (graph, outputs) in graphs.items():
                if why := self.check_graph(c, graph, outputs):
                    return {**result, "status": "failed", "reason": f"size {c} in a shared pool: replay differs from eager: {why}"}, None
            steps = {}
            for b in sorted(set(trace)):
                c = min((s for s in graphs if s >= b), default=None)
                if c is None:
                    steps[b] = (None, None, self.at(b))
                    continue
                graph, outputs = graphs[c]
                copies = self.padded_copies(b, c)
                if c != b:
                    expected = self.eager_output(b)
                    self.reset(c)
                    for dst, src in copies:
                        dst.copy_(src)
                    graph.replay()
                    torch.cuda.synchronize()
                    why, _ = compare(expected, tuple(o[:b].clone() for o in outputs))
                    if why:
                        return {**result, "status": "failed", "reason": f"batch {b} padded to {c}: {why}"}, None
                steps[b] = (graph, copies, None)
        except Exception as exc:
            return {**result, "status": "failed", "reason": describe(exc)}, None
        self.held_sets.append(graphs)  # replayed later, in passes over every set
        return {**result, "status": "ok"}, steps


def _time_graph(graph, copies, calls: int) -> float:
    sync = torch.cuda.synchronize
    start = clock()
    for _ in range(calls):
        for dst, src in copies:
            dst.copy_(src)
        graph.replay()
        sync()
    return (clock() - start) / calls


def _time_eager(built: Built, calls: int) -> float:
    fn, inputs, sync = built.fn, built.inputs, torch.cuda.synchronize
    start = clock()
    for _ in range(calls):
        fn(*inputs)
        sync()
    return (clock() - start) / calls


def _time_trace(steps: list[tuple]) -> float:
    sync = torch.cuda.synchronize
    start = clock()
    for graph, copies, eager in steps:
        if graph is None:
            eager.fn(*eager.inputs)
        else:
            for dst, src in copies:
                dst.copy_(src)
            graph.replay()
        sync()
    return (clock() - start) / len(steps)


def handle(session: PlanSession | None, message: tuple, registry: Registry) -> tuple[PlanSession | None, dict[str, Any]]:
    kind, args = message[0], message[1:]
    try:
        if kind == "plan_sizes":
            workload, params, sizes, eager_sizes, options = args
            session = PlanSession(registry, workload, params, max([*sizes, *eager_sizes]), options)
            return session, {"ok": True, **session.sizes(sizes, eager_sizes)}
        if kind == "plan_sets":
            sets, trace, timed = args
            return session, {"ok": True, **session.sets(sets, trace, timed)}
    except Exception as exc:
        from .prepare import _cuda_broken

        return None, {"ok": False, "reason": describe(exc), "process_unusable": torch.cuda.is_available() and _cuda_broken()}
    return None, {}
