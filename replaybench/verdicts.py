"""Verdicts of a stored run against the nightly history: which figures are judged, what history
they are judged against, and the glue between the store and ``replaybench.history``.

Judged figures (lower is better for each): eager at standard host speed (eager throughput for
rows stored before it existed), graph replay throughput and graph GPU time, and each compile
mode's throughput. The speedup is derived from eager and graph and never the ground of a verdict;
a row's reason gives how it moved.

The history of a row is one point per earlier run of the same workload, parameters and mode,
from nightly runs that finished (completed, with or without failures), on the same GPU model and
with the same measurement settings (processes, time budget, precision target, fewest units); a
run's repeated measurements of a config (a same-night confirmation) are one point of weight two.
An ad-hoc or CLI run is judged against the nightly history and never enters it. A change of
torch, driver, CUDA, Python or replaybench is not a wall: it is judged across, and named as the
likely cause of a level that starts with it.

``replaybench compare`` and ``report --baseline`` judge two runs with ``history.compare``, on the
same run-to-run noise as the nightly verdict where the history gives it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from sqlalchemy import select, update

from .history import Judgement, Point, Verdict, across_nights, cause, compare, judge, noise, open_changes
from .storage import Result, Run, Store

HISTORY_NIGHTS = 90
# Same-night re-measures, each in fresh measuring processes, of a config whose figures look off
# tonight. benchmarks/regression_detector.py, 10% eager steps in the H200 runs' noise, seed 0: found
# by their third night in 94.7% of histories with two, 86.3% with one, 56.0% with none.
CONFIRMATIONS = 2
FINISHED = ("completed", "completed_with_failures")
SETTINGS = ("processes", "time_budget_s", "precision", "min_units")  # run parameters that shape a figure


@dataclass(frozen=True)
class Metric:
    name: str  # as the reader sees it
    column: str  # Result column of the figure
    low: str  # ... and of its interval
    high: str


EAGER = Metric("eager at standard host speed", "host_normalised", "host_normalised_ci_low", "host_normalised_ci_high")
EAGER_TIME = Metric("eager throughput", "throughput_s", "throughput_ci_low", "throughput_ci_high")
THROUGHPUT = Metric("throughput", "throughput_s", "throughput_ci_low", "throughput_ci_high")
GPU_TIME = Metric("GPU time", "gpu_s", "gpu_ci_low", "gpu_ci_high")
SPEEDUP = Metric("speedup", "speedup", "speedup_ci_low", "speedup_ci_high")  # derived: shown, never judged
NORMALISED_SPEEDUP = Metric("speedup, host's speed taken out", "normalised_speedup", "normalised_speedup_ci_low",
                            "normalised_speedup_ci_high")  # derived too: shown, with its interval across nights
ACROSS_NIGHTS = (SPEEDUP, NORMALISED_SPEEDUP)  # the figures the report gives an interval across nights


def metrics(r) -> list[Metric]:
    """The figures a row (a Result) is judged on."""
    if r.mode == "eager":
        return [EAGER if r.host_normalised is not None else EAGER_TIME]
    return [THROUGHPUT, GPU_TIME] if r.mode == "graph" else [THROUGHPUT]


def settings_key(parameters: dict | None) -> tuple:
    return tuple((parameters or {}).get(k) for k in SETTINGS)


def environment(run) -> tuple:
    """What may cause a change, as (name, value) pairs: compared night to night, never partitioned."""
    version = run.package_version or ""
    if run.git_commit:
        version += f" ({run.git_commit[:10]})"
    return (("torch", run.torch_version), ("driver", run.gpu_driver), ("CUDA", run.cuda_version),
            ("Python", run.python_version), ("replaybench", version or None))


def _key(r) -> tuple[str, str, str]:
    return (r.workload, r.params_key, r.mode)


def _measured(run: Run) -> list[Result]:
    return [r for r in run.results if r.status == "ok" and any(getattr(r, m.column) is not None for m in metrics(r))]


def _point(run, rows: list, metric: Metric) -> Point | None:
    """One run's point for ``metric``: the geometric mean of its rows' figures, weighted by their
    number, with the widest of their intervals. ``run`` and ``rows`` are ORM objects or rows of
    _RUN_COLUMNS and _RESULT_COLUMNS."""
    values = [v for r in rows if (v := getattr(r, metric.column)) is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    lows = [v for r in rows if (v := getattr(r, metric.low)) is not None]
    highs = [v for r in rows if (v := getattr(r, metric.high)) is not None]
    return Point(run.id, math.exp(sum(map(math.log, values)) / len(values)), min(lows) if lows else None,
                 max(highs) if highs else None, environment(run), weight=len(values))


# -- the nightly history -----------------------------------------------------------------------

# What a history reads: the figures and the run's facts, not whole rows (their raw blocks are large).
_METRIC_COLUMNS = sorted({c for m in (EAGER, EAGER_TIME, THROUGHPUT, GPU_TIME, SPEEDUP, NORMALISED_SPEEDUP)
                          for c in (m.column, m.low, m.high)})
_RESULT_COLUMNS = [Result.id, Result.run_id, Result.mode, *(getattr(Result, c) for c in _METRIC_COLUMNS)]
_RUN_COLUMNS = [Run.id.label("run_pk"), Run.started_at, Run.parameters, Run.torch_version, Run.gpu_driver,
                Run.cuda_version, Run.python_version, Run.package_version, Run.git_commit]


@dataclass(frozen=True)
class _RunFacts:
    id: int
    started_at: object
    parameters: dict
    torch_version: str | None
    gpu_driver: str | None
    cuda_version: str | None
    python_version: str | None
    package_version: str | None
    git_commit: str | None


def _history(store: Store, run: Run, keys: set[tuple[str, str, str]]) -> dict[tuple, list[tuple[_RunFacts, list]]]:
    """(workload, params_key, mode) -> the last HISTORY_NIGHTS comparable runs before ``run`` with
    that config measured ok, oldest first, each with its rows. One query per key, each a short range
    of the index ix_results_history."""
    mine = settings_key(run.parameters)
    history: dict[tuple, list] = {}
    with store.session() as s:
        for workload, params_key, mode in sorted(keys):
            found = s.execute(
                select(*_RESULT_COLUMNS, *_RUN_COLUMNS)
                .join(Run, Result.run_id == Run.id)
                .where(Result.workload == workload, Result.params_key == params_key, Result.mode == mode,
                       Result.run_id < run.id, Result.status == "ok", Run.trigger == "nightly",
                       Run.status.in_(FINISHED), Run.gpu_name == run.gpu_name)
                .order_by(Result.run_id.desc(), Result.id)
                .limit(HISTORY_NIGHTS * (1 + CONFIRMATIONS))
            ).all()
            by_run: dict[int, tuple] = {}
            for row in found:
                if row.run_pk not in by_run:
                    if settings_key(row.parameters) != mine:
                        continue
                    by_run[row.run_pk] = (_RunFacts(row.run_pk, row.started_at, row.parameters, row.torch_version,
                                                    row.gpu_driver, row.cuda_version, row.python_version,
                                                    row.package_version, row.git_commit), [])
                by_run[row.run_pk][1].append(row)
            history[(workload, params_key, mode)] = sorted(by_run.values(), key=lambda x: x[0].id)[-HISTORY_NIGHTS:]
    return history


def _points(nights: list[tuple], metric: Metric) -> list[Point]:
    return [p for run, rows in nights if (p := _point(run, rows, metric)) is not None]


def judge_figures(store: Store, run: Run, baseline: int | None = None, history: dict | None = None) -> dict[tuple, list[tuple[Metric, Judgement, list[Result]]]]:
    """(workload, params_key, mode) -> for each judged figure of that config in ``run``: the figure,
    its judgement (against the nightly history, or the pinned run ``baseline``) and the rows."""
    rows_by_key: dict[tuple, list[Result]] = defaultdict(list)
    for r in _measured(run):
        rows_by_key[_key(r)].append(r)
    if not rows_by_key:
        return {}
    history = _history(store, run, set(rows_by_key)) if history is None else history
    pinned = _pinned(store, baseline) if baseline is not None else {}
    out: dict[tuple, list] = {}
    for key, rows in rows_by_key.items():
        out[key] = []
        for metric in metrics(rows[0]) + ([SPEEDUP] if rows[0].mode != "eager" else []):
            tonight = _point(run, rows, metric)
            if tonight is None:
                continue
            nights = _points(history[key], metric)
            if baseline is None and metric is SPEEDUP:  # shown, not judged: against the recent nights
                recent = nights[-10:]
                level = math.exp(sum(math.log(p.value) for p in recent) / len(recent)) if recent else None
                j = Judgement(Verdict.SAME, tonight.value / level - 1 if level else None, level, "derived")
            elif baseline is None:
                j = judge(nights, tonight, higher_is_better=False)
            else:
                base = pinned.get(key)
                base_point = _point(base[0], base[1], metric) if base else None
                if base_point is None:
                    j = Judgement(Verdict.NEW, None, None, f"not measured in run {baseline}")
                elif base[0].gpu_name != run.gpu_name:
                    j = Judgement(Verdict.NEW, None, base_point.value, f"run {baseline} measured on another GPU ({base[0].gpu_name})")
                else:
                    j = compare(base_point, tonight, higher_is_better=metric is SPEEDUP,
                                sigma=noise(nights) if len(nights) >= 5 else None)
                    moved = cause([base_point, tonight], 1)
                    if moved:
                        j = replace(j, reason=f"{j.reason}; {moved} between the two runs", cause=moved)
            out[key].append((metric, j, rows))
    return out


def speedups_across_nights(store: Store, run: Run) -> dict[str, dict[int, tuple[float, float, int]]]:
    """For the speedup and the host-normalised speedup (keyed by their columns): result id -> (low,
    high, nights) for each of ``run``'s figures with enough nightly history: the interval of
    ``history.across_nights`` from the nights before the run, around the run's figure (with
    same-night confirmations, their geometric mean), given on the first measurement's row. Nights
    that did not store a figure (the host-normalised speedup before it was stored) do not count."""
    rows_by_key: dict[tuple, list[Result]] = defaultdict(list)
    for r in _measured(run):
        if r.speedup is not None or r.normalised_speedup is not None:
            rows_by_key[_key(r)].append(r)
    out: dict[str, dict[int, tuple[float, float, int]]] = {m.column: {} for m in ACROSS_NIGHTS}
    if not rows_by_key:
        return out
    history = _history(store, run, set(rows_by_key))
    for key, rows in rows_by_key.items():
        for metric in ACROSS_NIGHTS:
            nights = _points(history[key], metric)
            tonight = _point(run, rows, metric)
            found = across_nights(nights, tonight) if tonight is not None else None
            if found is not None:
                out[metric.column].update({r.id: (*found, len(nights)) for r in rows if not r.repeat})
    return out


def judge_run(store: Store, run: Run, baseline: int | None = None, history: dict | None = None) -> dict[int, Judgement]:
    """Result id -> judgement for every measured row of ``run``, judged now: against the nightly
    history, or against the pinned run ``baseline``. A config's repeated rows share one."""
    verdicts = {}
    for parts in judge_figures(store, run, baseline, history).values():
        if not parts:
            continue
        combined = combine([(m, j) for m, j, _ in parts if m is not SPEEDUP])
        speedup = next((j for m, j, _ in parts if m is SPEEDUP and j.change is not None), None)
        if speedup is not None:
            combined = replace(combined, reason=combined.reason + f"; speedup {abs(speedup.change):.1%} "
                               f"{'higher' if speedup.change > 0 else 'lower'} (derived from eager and graph, not judged)")
        for r in parts[0][2]:
            verdicts[r.id] = combined
    return verdicts


_ORDER = (Verdict.SLOWER, Verdict.FASTER, Verdict.UNCERTAIN, Verdict.SAME, Verdict.NEW)


def combine(parts: list[tuple[Metric, Judgement]]) -> Judgement:
    """One row's verdict from its figures': the most telling of theirs (SLOWER, then FASTER, then
    UNCERTAIN, SAME, NEW), its reason naming every figure, and the speedup's move beside it."""
    if not parts:
        return Judgement(Verdict.UNCERTAIN, None, None, "no figure to judge")
    metric, lead = min(parts, key=lambda mj: _ORDER.index(mj[1].verdict) if mj[1].verdict in _ORDER else 99)
    reason = "; ".join(f"{m.name}: {j.verdict.value} {'' if j.change is None else f'{j.change:+.1%} '}({j.reason})"
                       for m, j in parts)
    return Judgement(lead.verdict, lead.change, lead.baseline, reason, lead.cause, lead.since)


# -- storing and reading -----------------------------------------------------------------------


def run_verdicts(store: Store, run: Run, baseline: int | None = None) -> dict[int, Judgement]:
    """Result id -> judgement for every measured row of ``run``: as stored when the run was
    finished (judged now if none is stored), or against the pinned run ``baseline``."""
    if baseline is None:
        stored = stored_verdicts(run)
        if stored is not None:
            return stored
    return judge_run(store, run, baseline)


def stored_verdicts(run: Run) -> dict[int, Judgement] | None:
    """The verdicts stored in the run's measured rows; None unless every one of them has one."""
    measured = _measured(run)
    if any(r.verdict is None for r in measured):
        return None
    return {r.id: Judgement(Verdict(r.verdict), r.verdict_change, r.verdict_baseline, r.verdict_reason) for r in measured}


def store_verdicts(store: Store, run_id: int) -> dict[int, Judgement]:
    """Judge run ``run_id``'s measured rows against the nightly history and store the verdicts, and
    its configs' open regressions: what was said when the run finished, which a later change of the
    method does not rewrite, and which its reports read."""
    run = store.run(run_id)
    history = _history(store, run, {_key(r) for r in _measured(run)})
    verdicts = judge_run(store, run, history=history)
    regressions = [_as_json(o) for o in open_regressions(store, run, history)]
    with store.session.begin() as s:
        if verdicts:
            s.execute(update(Result), [
                {"id": result_id, "verdict": j.verdict.value, "verdict_change": j.change,
                 "verdict_baseline": j.baseline, "verdict_reason": j.reason}
                for result_id, j in verdicts.items()
            ])
        s.get(Run, run_id).open_regressions = regressions
    return verdicts


def _pinned(store: Store, baseline: int) -> dict[tuple, tuple[Run, list]]:
    """(workload, params_key, mode) -> the pinned run and its rows measured ok for that config."""
    run = store.run(baseline)
    rows: dict[tuple, list] = defaultdict(list)
    for r in run.results:
        if r.status == "ok":
            rows[_key(r)].append(r)
    return {k: (run, v) for k, v in rows.items()}


MISSING = "MISSING"  # compare_runs: a figure run A has and run B does not


def compare_runs(store: Store, base_id: int, run_id: int) -> list[dict]:
    """Run ``run_id`` against run ``base_id``, one entry per config, mode and judged figure of
    either: NEW where only ``run_id`` has it, MISSING where only ``base_id`` does."""
    run, base = store.run(run_id), store.run(base_id)
    base_rows = _pinned(store, base_id)
    out = []
    judged = judge_figures(store, run, baseline=base_id)
    for key, parts in judged.items():
        for metric, j, rows in parts:
            if metric is SPEEDUP:
                continue
            before = base_rows.get(key)
            base_point = _point(base, before[1], metric) if before else None
            out.append({"workload": key[0], "params": rows[0].params, "mode": key[2], "figure": metric.name,
                        "column": metric.column, "baseline": base_point.value if base_point else None,
                        "value": _point(run, rows, metric).value, "change": j.change, "verdict": j.verdict.value,
                        "reason": j.reason})
    for key, (_, rows) in sorted(base_rows.items()):
        in_b = {metric.name for metric, _, _ in judged.get(key, ())}
        for metric in metrics(rows[0]):
            if metric.name not in in_b and (point := _point(base, rows, metric)) is not None:
                out.append({"workload": key[0], "params": rows[0].params, "mode": key[2], "figure": metric.name,
                            "column": metric.column, "baseline": point.value, "value": None, "change": None,
                            "verdict": MISSING, "reason": f"{'no such figure' if in_b else 'not measured'} in run {run_id}"})
    return out


# -- open regressions --------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenRegression:
    workload: str
    params: dict
    params_key: str
    mode: str
    metric: str
    change: float
    first_run_id: int
    first_result_id: int  # the config's row in its first run
    first_night: object  # when its first run started
    cause: str | None
    baseline: float
    current: float

    @property
    def ident(self) -> str:
        """What ``replaybench ack`` takes: the first night's row and the figure, e.g. '4512:gpu_time'."""
        return f"{self.first_result_id}:{slug(self.metric)}"


def slug(metric_name: str) -> str:
    return metric_name.replace(" ", "_")


def open_regressions(store: Store, run: Run, history: dict | None = None) -> list[OpenRegression]:
    """Slower levels of ``run``'s configs that still hold in the nightly history up to and
    including ``run`` (if it is a finished nightly run) and that nobody has acknowledged, biggest
    first."""
    measured = _measured(run)
    keys = {_key(r) for r in measured}
    history = _history(store, run, keys) if history is None else history
    acknowledged = store.acknowledged()
    out = []
    for key in sorted(keys):
        nights = list(history[key])
        mine = [r for r in measured if _key(r) == key]
        if run.trigger == "nightly" and run.status in FINISHED:
            nights.append((run, mine))
        rows_of = {r.id: rows for r, rows in nights}
        starts = {r.id: r.started_at for r, _ in nights}
        for metric in metrics(mine[0]):
            points = _points(nights, metric)
            for c in open_changes(points):
                if c.change <= 0 or (*key, metric.name, c.first_run) in acknowledged:
                    continue
                workload, params_key, mode = key
                out.append(OpenRegression(workload, mine[0].params, params_key, mode, metric.name, c.change, c.first_run,
                                          rows_of[c.first_run][0].id, starts[c.first_run], c.cause,
                                          math.exp(c.before.mean), points[-1].value))
    return sorted(out, key=lambda o: -o.change)


def report_regressions(store: Store, run: Run) -> list[OpenRegression]:
    """The open regressions a report of ``run`` lists: as stored when it was judged (computed now
    for a run judged before they were stored), less those acknowledged since."""
    if run.open_regressions is None:
        return open_regressions(store, run)
    acknowledged = store.acknowledged()
    found = [_from_json(d) for d in run.open_regressions]
    return [o for o in found if (o.workload, o.params_key, o.mode, o.metric, o.first_run_id) not in acknowledged]


def _as_json(o: OpenRegression) -> dict:
    d = asdict(o)
    d["first_night"] = o.first_night.isoformat() if o.first_night else None
    return d


def _from_json(d: dict) -> OpenRegression:
    night = datetime.fromisoformat(d["first_night"]) if d.get("first_night") else None
    return OpenRegression(**{**d, "first_night": night})


def acknowledge(store: Store, ident: str, note: str | None = None) -> OpenRegression:
    """Acknowledge the open regression ``ident`` (OpenRegression.ident) of the latest run that has
    it; ValueError naming what is wrong with ``ident`` otherwise."""
    first_id, sep, metric = ident.partition(":")
    if not (sep and first_id.isdigit() and len(first_id) <= 12 and metric and len(metric) <= 64):
        raise ValueError(f"not a regression id: {ident!r}; `replaybench regressions` lists them")
    with store.session() as s:
        row = s.get(Result, int(first_id))
        latest = row and s.scalar(select(Result.run_id).join(Run, Result.run_id == Run.id).where(
            Result.workload == row.workload, Result.params_key == row.params_key, Result.mode == row.mode,
            Run.trigger == "nightly", Run.status.in_(FINISHED)).order_by(Result.run_id.desc()).limit(1))
    if row is None or latest is None:
        raise ValueError(f"no open regression {ident!r}; `replaybench regressions` lists them")
    for regression in open_regressions(store, store.run(latest)):
        if regression.ident == ident:
            store.acknowledge(regression.workload, regression.params_key, regression.mode, regression.metric,
                              regression.first_run_id, note)
            return regression
    raise ValueError(f"no open regression {ident!r}; `replaybench regressions` lists them")
