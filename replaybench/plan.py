"""Capture plans for serving: which batch sizes to capture as CUDA graphs, and what they cost.

A server cannot capture a graph for every batch size: it captures a set of sizes and runs a batch of
``b`` as the smallest captured size at or above ``b``, its inputs padded, or eagerly when ``b`` is
above every captured size. Given each candidate size's measured time per call (eager and replayed),
graph memory, and a traffic (how often each batch size comes), this module finds the capture set
with the least expected time per call within a graph-memory budget, exactly, by dynamic programming
over the sizes in increasing order, and prices the common schedules beside it.

Graph memory of a set, as serving engines capture it (every graph in one shared memory pool, the
largest first): the memory the largest graph takes alone, plus what each smaller graph keeps
allocated after its capture (its outputs); the intermediate tensors of the smaller graphs reuse the
largest one's. That is the model the plan is found under; the set's memory is then measured, and a
set that measures over the budget is planned again under a budget lowered by the excess.

Pure Python and numpy: the measuring happens in ``replaybench.plan_measure``, in a measuring process.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .workload import MAX_BATCH_SIZE

MiB = 1 << 20
MAX_CANDIDATES = 512
MAX_TRAFFIC_TEXT = 4000
MAX_TRAFFIC_FILE_BYTES = 64 * MiB
MEMORY_UNITS = 20000  # the budget's resolution in the search: memory is rounded up to budget/units
MIN_UNIT_BYTES = 512  # the CUDA caching allocator rounds every allocation to 512 bytes
PRESETS = ("zipf", "uniform")
MAX_TRAFFIC_SIZES = 1024  # distinct batch sizes: each is built and timed eagerly


class PlanError(ValueError):
    """Input a plan cannot be made from; the message says which and why, in one line."""


# -- inputs ------------------------------------------------------------------------------------
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_sizes(text: str) -> list[int]:
    """Candidate batch sizes: ``1-256``, ``1,2,4,8-64:8`` (a range with a step), sorted, unique."""
    if not isinstance(text, str) or not text.strip() or len(text) > 1000:
        raise PlanError("candidate sizes: give a range such as 1-256 or a list such as 1,2,4,8-64:8")
    sizes: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = _RANGE.match(part)
        if not m:
            raise PlanError(f"candidate sizes: {part!r} is not a size, a range a-b or a stepped range a-b:step")
        low = int(m[1])
        high = int(m[2]) if m[2] else low
        step = int(m[3]) if m[3] else 1
        if low < 1 or high < low or step < 1:
            raise PlanError(f"candidate sizes: {part!r} must run upwards from 1 or more, with a step of 1 or more")
        if high > MAX_BATCH_SIZE:
            raise PlanError(f"candidate sizes: {high} is above the limit of {MAX_BATCH_SIZE}")
        sizes.update(range(low, high + 1, step))
        if len(sizes) > MAX_CANDIDATES:
            raise PlanError(f"candidate sizes: more than {MAX_CANDIDATES} sizes; use a stepped range such as 64-1024:16")
    return sorted(sizes)


@dataclass
class Traffic:
    """How often each batch size comes: size -> probability (summing to 1)."""

    probabilities: dict[int, float]
    source: str

    @property
    def largest(self) -> int:
        return max(self.probabilities)

    def trace(self, calls: int, seed: int = 0) -> list[int]:
        """``calls`` batch sizes drawn from the traffic, reproducibly."""
        sizes = sorted(self.probabilities)
        p = np.array([self.probabilities[s] for s in sizes])
        return [int(x) for x in np.random.default_rng(seed).choice(sizes, size=calls, p=p / p.sum())]


def _normalise(weights: dict[int, float], source: str) -> Traffic:
    total = sum(weights.values())
    if not weights or total <= 0:
        raise PlanError(f"traffic {source}: no batch has a positive weight")
    if len(weights) > MAX_TRAFFIC_SIZES:
        raise PlanError(f"traffic {source[:40]}: {len(weights)} distinct batch sizes, more than {MAX_TRAFFIC_SIZES}; "
                        f"give weights to fewer sizes")
    return Traffic({s: w / total for s, w in sorted(weights.items()) if w > 0}, source)


def parse_traffic(text: str, largest: int) -> Traffic:
    """A traffic over batch sizes 1..``largest``: a preset (``zipf``: weight 1/b, most batches small;
    ``uniform``) or weights such as ``1:40,2-8:30,9-256:30`` (a range's weight spread evenly)."""
    if not isinstance(text, str) or not text.strip():
        raise PlanError("traffic: give a preset (zipf, uniform) or weights such as 1:40,2-8:30,9-256:30")
    if len(text) > MAX_TRAFFIC_TEXT:
        raise PlanError(f"traffic: longer than {MAX_TRAFFIC_TEXT} characters; give a file of observed batch sizes instead")
    text = text.replace(" ", "")
    if text == "zipf":
        return _normalise({b: 1.0 / b for b in range(1, largest + 1)}, "zipf")
    if text == "uniform":
        return _normalise({b: 1.0 for b in range(1, largest + 1)}, "uniform")
    weights: dict[int, float] = {}
    for part in text.split(","):
        sizes, sep, weight = part.partition(":")
        m = re.match(r"^(\d+)(?:-(\d+))?$", sizes)
        try:
            w = float(weight)
        except ValueError:
            w = float("nan")
        if not m or not sep or not math.isfinite(w) or w < 0:
            raise PlanError(f"traffic: {part!r} is not SIZE:WEIGHT or LOW-HIGH:WEIGHT with a weight of 0 or more "
                            f"(presets: {', '.join(PRESETS)})")
        low, high = int(m[1]), int(m[2] or m[1])
        if low < 1 or high < low:
            raise PlanError(f"traffic: {sizes!r} must run upwards from 1 or more")
        if high > largest:
            raise PlanError(f"traffic: batch size {high} is above the largest candidate size, {largest}")
        if high - low >= MAX_TRAFFIC_SIZES:
            raise PlanError(f"traffic: {sizes!r} holds more than {MAX_TRAFFIC_SIZES} batch sizes")
        for b in range(low, high + 1):
            weights[b] = weights.get(b, 0.0) + w / (high - low + 1)
    return _normalise(weights, text)


def read_traffic_file(path: str | Path, largest: int) -> Traffic:
    """Observed batch sizes, one or more per line, separated by spaces or commas (``#`` starts a comment)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TRAFFIC_FILE_BYTES + 1)  # bounded by reading, not by stat: a pipe or a device has no size
        if len(data) > MAX_TRAFFIC_FILE_BYTES:
            raise PlanError(f"traffic file {path}: larger than {MAX_TRAFFIC_FILE_BYTES // MiB} MiB")
        text = data.decode()
    except OSError as exc:
        raise PlanError(f"traffic file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"traffic file {path}: not text") from None
    counts: Counter[int] = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        for token in line.split("#", 1)[0].replace(",", " ").split():
            if not token.isdigit() or int(token) < 1:
                raise PlanError(f"traffic file {path}, line {number}: {token!r} is not a batch size")
            if int(token) > largest:
                raise PlanError(f"traffic file {path}, line {number}: batch size {token} is above the largest candidate size, {largest}")
            counts[int(token)] += 1
    if not counts:
        raise PlanError(f"traffic file {path}: no batch size in it")
    return _normalise(dict(counts), f"{path.name} ({sum(counts.values())} batches)")


# -- costs and schedules ---------------------------------------------------------------------
@dataclass
class Costs:
    """What was measured, per batch size: seconds per call eager (every size the traffic holds) and
    replayed (every candidate), graph memory alone and what a graph keeps allocated (bytes)."""

    eager_s: dict[int, float]
    graph_s: dict[int, float]
    alone_bytes: dict[int, int]
    held_bytes: dict[int, int]
    capture_s: dict[int, float] = field(default_factory=dict)

    @property
    def candidates(self) -> list[int]:
        return sorted(self.graph_s)

    def memory(self, sizes) -> int:
        """Graph memory of a set captured into one pool, largest first (the module's model)."""
        sizes = sorted(sizes)
        if not sizes:
            return 0
        return self.alone_bytes[sizes[-1]] + sum(self.held_bytes[c] for c in sizes[:-1])


def covering(sizes: list[int], batch: int) -> int | None:
    """The captured size a batch runs as: the smallest at or above it; None (eager) above them all."""
    for c in sorted(sizes):
        if c >= batch:
            return c
    return None


def expected(costs: Costs, traffic: Traffic, sizes) -> dict:
    """A capture set priced under a traffic: expected seconds per call, the expected share of rows
    computed for padding, the share of batches run eagerly, graph memory (model) and capture time."""
    sizes = sorted(sizes)
    time_s = waste = eager = 0.0
    for b, p in traffic.probabilities.items():
        c = covering(sizes, b)
        if c is None:
            time_s += p * costs.eager_s[b]
            eager += p
        else:
            time_s += p * costs.graph_s[c]
            waste += p * (c - b) / c
    return {"sizes": sizes, "time_s": time_s, "padding": waste, "eager_share": eager,
            "memory_bytes": costs.memory(sizes), "capture_s": sum(costs.capture_s.get(c, 0.0) for c in sizes)}


def trace_prediction(costs: Costs, sizes, trace: list[int]) -> float:
    """Mean seconds per call predicted for exactly these batches."""
    counts = Counter(trace)
    total = 0.0
    for b, n in counts.items():
        c = covering(sizes, b)
        total += n * (costs.eager_s[b] if c is None else costs.graph_s[c])
    return total / len(trace)


def common_schedules(largest: int) -> dict[str, list[int]]:
    """The rules of thumb serving engines use, up to ``largest``."""
    powers = [1 << k for k in range(largest.bit_length()) if 1 << k <= largest]
    eights = sorted({s for s in (1, 2, 4) if s <= largest} | set(range(8, largest + 1, 8)))
    return {"powers of two": powers, "1, 2, 4 and multiples of 8": eights}


# -- the search -------------------------------------------------------------------------------
class Planner:
    """The exact search over capture sets (dynamic programming over memory in steps of ``unit``:
    what a graph keeps is rounded to the nearest step, a set found over the budget by its exact
    bytes is searched again under a budget lowered by the excess).

    Candidates c_1 < ... < c_n; f[j, m] is the least expected time of the batches up to c_j over
    sets whose largest size so far is c_j and whose graphs keep m units allocated; a set ending at
    c_j then costs its eager tail (batches above c_j) and takes memory m - held(c_j) + alone(c_j)."""

    def __init__(self, costs: Costs, traffic: Traffic, max_budget_bytes: int | None = None):
        missing = sorted(b for b in traffic.probabilities if b not in costs.eager_s)
        if missing:
            raise PlanError(f"no eager time measured for batch size(s) {', '.join(map(str, missing[:5]))}")
        self.costs, self.traffic = costs, traffic
        self.sizes = costs.candidates
        n = len(self.sizes)
        top = max_budget_bytes if max_budget_bytes is not None else costs.memory(self.sizes)
        self.unit = max(MIN_UNIT_BYTES, math.ceil(max(top, 1) / MEMORY_UNITS))
        self.held = [round(costs.held_bytes[c] / self.unit) for c in self.sizes]
        self.alone = [math.ceil(costs.alone_bytes[c] / self.unit) for c in self.sizes]
        self.units = math.floor(top / self.unit) if max_budget_bytes is not None else sum(self.held) + max(self.alone, default=0)
        # probability mass of the batches in (c_{i-1}, c_j], as prefix sums over batch sizes
        largest = max(self.sizes[-1] if self.sizes else 0, traffic.largest)
        p = np.zeros(largest + 1)
        tail = np.zeros(largest + 2)  # tail[b]: expected eager time of batches >= b
        for b, q in traffic.probabilities.items():
            p[b] = q
        eager = np.zeros(largest + 1)
        for b in traffic.probabilities:
            eager[b] = costs.eager_s[b] * p[b]
        tail[: largest + 1] = np.cumsum(eager[::-1])[::-1]
        cum = np.cumsum(p)
        edges = np.array([0] + self.sizes)
        mass = cum[np.minimum(edges, largest)]
        self.tail_after = [float(tail[c + 1]) if c + 1 <= largest else 0.0 for c in self.sizes]
        self.all_eager = float(tail[1])
        inf = np.inf
        width = self.units + 1
        f = np.full((n, width), inf)
        back = np.full((n, width), -1, dtype=np.int32)  # previous candidate's index, -1: none
        for j in range(n):
            g = costs.graph_s[self.sizes[j]]
            h = self.held[j]
            if h >= width:
                continue
            first = (mass[j + 1] - mass[0]) * g
            f[j, h] = first
            if j:
                shifted = f[:j, : width - h] + ((mass[j + 1] - mass[1 : j + 1]) * g)[:, None]
                best = shifted.argmin(axis=0)
                value = shifted[best, np.arange(width - h)]
                better = value < f[j, h:]
                f[j, h:][better] = value[better]
                back[j, h:][better] = best[better]
        self.f, self.back = f, back

    def best(self, budget_bytes: int | None = None) -> list[int]:
        """The capture set with the least expected time per call whose memory (the module's model)
        is within ``budget_bytes`` (no limit: None); the empty set when nothing fits."""
        limit = self.units if budget_bytes is None else min(self.units, math.floor(budget_bytes / self.unit))
        while True:
            chosen = self._search(limit)
            excess = 0 if budget_bytes is None else self.costs.memory(chosen) - budget_bytes
            if excess <= 0:
                return chosen
            limit -= max(1, math.ceil(excess / self.unit))

    def _search(self, limit: int) -> list[int]:
        best_value, best_at = self.all_eager, None
        for j in range(len(self.sizes)):
            allowed = limit - self.alone[j] + self.held[j]  # m - held + alone <= limit
            if allowed < 0:
                continue
            row = self.f[j, : min(allowed, self.units) + 1]
            m = int(row.argmin())
            value = row[m] + self.tail_after[j]
            if value < best_value - 1e-18:
                best_value, best_at = value, (j, m)
        chosen: list[int] = []
        while best_at is not None:
            j, m = best_at
            chosen.append(self.sizes[j])
            i = int(self.back[j, m])
            best_at = (i, m - self.held[j]) if i >= 0 else None
        return sorted(chosen)


def brute_force(costs: Costs, traffic: Traffic, budget_bytes: int | None) -> tuple[float, list[int]]:
    """Every subset priced (small candidate lists only): the reference the search is tested against."""
    sizes = costs.candidates
    best = (expected(costs, traffic, [])["time_s"], [])
    for mask in range(1, 1 << len(sizes)):
        subset = [c for i, c in enumerate(sizes) if mask >> i & 1]
        if budget_bytes is not None and costs.memory(subset) > budget_bytes:
            continue
        t = expected(costs, traffic, subset)["time_s"]
        if t < best[0]:
            best = (t, subset)
    return best
