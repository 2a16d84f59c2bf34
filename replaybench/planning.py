"""A capture plan from start to end, in the orchestrating process: measure the candidate sizes in a
measuring process, search the plan (``replaybench.plan``), capture and replay it beside the common
schedules, and return everything the store, the report and the JSON output show.

Every set is priced from the per-size times (under the traffic, and for the replayed trace), and
measured by replaying the trace through its graphs, every set in turn; each size is timed again in
those passes, and the trace predicted from those times too, so that the model's error (padding,
one call after another) shows apart from the host's drift since the sizes were first timed. A set whose graphs or padded
batches did not match eager output is reported failed, never timed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .params import MAX_RUN_VARIABLE, PlanParameters, max_run_s
from .plan import MiB, Costs, PlanError, Planner, Traffic, common_schedules, expected, parse_sizes, parse_traffic, trace_prediction
from .worker import Died, Stuck
from .workload import Registry

class PlanFailed(RuntimeError):
    """The measuring went wrong (no CUDA device, a workload error): the run fails saying why.
    ``partial`` holds what was measured before, once every size was (the plan's data with only the
    sets already captured, no plan claimed), so that minutes of measuring are kept with the failure."""

    partial: dict[str, Any] | None = None


REPLANS = 3  # a plan measured over its budget is searched again, at most this many times
SEED = 0


def sizes_label(sizes: list[int]) -> str:
    """1,2,3,4,8,16,24,32 -> '1-4, 8-32:8'."""
    parts, i = [], 0
    sizes = sorted(sizes)
    while i < len(sizes):
        j = i
        step = sizes[i + 1] - sizes[i] if i + 1 < len(sizes) else 1
        while j + 1 < len(sizes) and sizes[j + 1] - sizes[j] == step:
            j += 1
        if j - i >= 2:
            parts.append(f"{sizes[i]}-{sizes[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(sizes[i]))
            i += 1
    return ", ".join(parts) or "none (eager only)"


def resolve_traffic(parameters: PlanParameters, traffic: Traffic | None) -> tuple[list[int], Traffic]:
    """The candidate sizes and the traffic, checked (``PlanError`` before anything starts)."""
    candidates = parse_sizes(parameters.candidates)
    traffic = traffic or parse_traffic(parameters.traffic, candidates[-1])
    if traffic.largest > candidates[-1]:
        raise PlanError(f"traffic holds batch size {traffic.largest}, above the largest candidate size {candidates[-1]}")
    return candidates, traffic


def make_plan(parameters: PlanParameters, registry: Registry, request: Callable[[tuple, float], dict],
              traffic: Traffic | None = None, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Measure, plan and check; ``request(message, deadline)`` asks a measuring process."""
    config = parameters.config(registry)
    candidates, traffic = resolve_traffic(parameters, traffic)
    largest = candidates[-1]
    schedules = common_schedules(largest)
    measured_sizes = sorted(set(candidates).union(*schedules.values()))
    eager_sizes = sorted(traffic.probabilities)
    limit_s = min(parameters.timeout_s, max_run_s())
    deadline = time.monotonic() + limit_s

    def ask(message: tuple) -> dict:
        try:
            answer = request(message, deadline)
        except Stuck as exc:
            raise PlanFailed(f"{config.label}: no answer within {limit_s:g} s (the plan's timeout, or ${MAX_RUN_VARIABLE}); "
                             f"the measuring process was killed{exc}") from None
        except Died as exc:
            raise PlanFailed(f"{config.label}: {exc}") from None
        if not answer.get("ok"):
            raise PlanFailed(f"{config.label}: {answer.get('reason')}")
        return answer

    options = {"calls": 200, "passes": parameters.passes, "seed": SEED}
    say(f"measuring {len(measured_sizes)} batch sizes (capture, check, replay) and {len(eager_sizes)} eagerly")
    reply = ask(("plan_sizes", config.workload, config.params, measured_sizes, eager_sizes, options))
    failed = {int(k): v for k, v in reply["failed"].items()}
    per_size = {int(k): v for k, v in reply["sizes"].items()}
    eager = {int(k): v for k, v in reply["eager"].items()}
    ok = sorted(c for c in per_size if c not in failed)
    costs = Costs(
        eager_s={b: eager[b]["s"] for b in eager},
        graph_s={c: per_size[c]["graph"]["s"] for c in ok if c in candidates},
        alone_bytes={c: per_size[c]["alone_bytes"] for c in ok},
        held_bytes={c: per_size[c]["held_bytes"] for c in ok},
        capture_s={c: per_size[c]["capture_s"] for c in ok},
    )
    schedule_costs = Costs(costs.eager_s, {c: per_size[c]["graph"]["s"] for c in ok}, costs.alone_bytes,
                           costs.held_bytes, costs.capture_s)
    budget = None if parameters.memory_budget_mib is None else int(parameters.memory_budget_mib * MiB)
    trace = traffic.trace(parameters.calls, SEED)

    def entry(name: str, kind: str, sizes: list[int], budget_bytes: int | None = None) -> dict:
        priced = expected(schedule_costs, traffic, sizes)
        return {"name": name, "kind": kind, "sizes": sizes, "label": sizes_label(sizes), "budget_bytes": budget_bytes,
                "expected": priced, "predicted_trace_s": trace_prediction(schedule_costs, sizes, trace), "measured": None}

    def plan_within(name: str, budget_bytes: int | None, model_budget: int | None = None) -> dict:
        """The plan whose measured memory is to stay within ``budget_bytes``, searched under
        ``model_budget`` of the module's memory model (default: the budget itself)."""
        model_budget = budget_bytes if model_budget is None else model_budget
        say(f"searching the plan{'' if budget_bytes is None else f' within {budget_bytes / MiB:.1f} MiB'}")
        found = entry(name, "plan", Planner(costs, traffic, model_budget).best(model_budget), budget_bytes)
        return {**found, "model_budget_bytes": model_budget}

    beside: dict[str, dict] = {}  # each size's time measured in the passes that replay the trace

    def capture(todo: list[dict], timed: bool = False) -> None:
        """Capture and check the sets of ``todo`` not yet captured (all of them when ``timed``),
        and with ``timed`` replay the trace through them, in turns."""
        todo = [e for e in todo if timed or e["measured"] is None]
        if not todo:
            return
        say(f"capturing {len(todo)} set(s)" + (f" and replaying a trace of {len(trace)} batches through each" if timed else ""))
        sets = {str(i): e["sizes"] for i, e in enumerate(todo)}
        answer = ask(("plan_sets", sets, trace, timed))
        for i, e in enumerate(todo):
            e["measured"] = answer["sets"][str(i)]
        if timed:
            beside.update(answer["beside"])

    def record(entries: list[dict]) -> dict[str, Any]:
        return {
            "workload": config.workload, "params": config.params, "label": config.label,
            "candidates": candidates, "traffic": {"source": traffic.source, "probabilities": sorted(traffic.probabilities.items())},
            "budget_bytes": budget, "calls": parameters.calls, "passes": parameters.passes, "seed": SEED,
            "sizes": [{"size": c, **per_size.get(c, {}), "eager": eager.get(c), "failed": failed.get(c),
                       "graph_beside": beside.get("graph", {}).get(c), "eager_beside": beside.get("eager", {}).get(c)}
                      for c in sorted(set(per_size) | set(eager) | set(failed))],
            "schedules": entries,
        }

    entries = [plan_within("plan", budget)]
    for name, sizes in schedules.items():
        broken = [c for c in sizes if c in failed]
        e = entry(name, "common", [c for c in sizes if c not in failed])
        if broken:
            e["measured"] = {"status": "failed", "reason": f"size {broken[0]}: {failed[broken[0]]}"}
        entries.append(e)
    entries.append(entry("every candidate", "reference", [c for c in ok if c in candidates]))

    try:  # only the measuring process fails from here on: what it had measured goes with the failure
        capture(entries)
        # The search runs on the memory model, which can put a set above its measured memory: it is
        # given at least the schedule's own modelled memory, so that the schedule itself is a candidate.
        for e in [e for e in entries if e["kind"] == "common" and e["measured"].get("status") == "ok"]:
            measured = e["measured"]["memory_bytes"]
            entries.append(plan_within(f"plan within {e['name']}'s memory", measured, max(measured, e["expected"]["memory_bytes"])))
        capture(entries)
        for e in entries:  # a plan measured over its budget is searched again under less
            for _ in range(REPLANS):
                m = e["measured"]
                if e["kind"] != "plan" or e["budget_bytes"] is None or m.get("status") != "ok" or m["memory_bytes"] <= e["budget_bytes"]:
                    break
                # Below the set's own modelled memory, or the search could find the same set again.
                lower = min(e["model_budget_bytes"], e["expected"]["memory_bytes"]) - (m["memory_bytes"] - e["budget_bytes"])
                say(f"{e['name']}: {m['memory_bytes'] / MiB:.1f} MiB measured, over its budget; searching again")
                e.update(plan_within(e["name"], e["budget_bytes"], max(lower, 0)))
                capture([e])
        capture([e for e in entries if e["measured"].get("status") == "ok"], timed=True)
        # The trace predicted again from each size's time measured beside it: the model's own error,
        # without the host's drift since the sizes were first timed.
        beside_costs = Costs({**costs.eager_s, **{b: t["s"] for b, t in beside.get("eager", {}).items()}},
                             {c: t["s"] for c, t in beside.get("graph", {}).items()}, costs.alone_bytes, costs.held_bytes)
        for e in entries:
            m = e["measured"]
            e["within_budget"] = e["budget_bytes"] is None or (m.get("status") == "ok" and m["memory_bytes"] <= e["budget_bytes"])
            replayed = m.get("replay", {}).get("s")
            e["predicted_beside_s"] = trace_prediction(beside_costs, e["sizes"], trace) if replayed else None
            e["agreement"] = replayed / e["predicted_beside_s"] - 1 if replayed else None
            e["drift"] = replayed / e["predicted_trace_s"] - 1 if replayed else None
    except PlanFailed as exc:
        exc.partial = {**record([e for e in entries if e["measured"]]), "incomplete": str(exc)}
        raise
    return record(entries)
