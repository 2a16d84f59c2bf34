"""Verdicts of a stored run against the nightly history of the same workload, parameters and mode:
the glue between the store and replaybench.history. Graph and compile rows are judged on their
speedup (higher is better), eager rows on their throughput time (lower is better).

A run is judged against the history once, when it is finished (:func:`store_verdicts`, called by
``Store.finish_run``), and the verdicts are stored in its rows for its reports to read. A run
without stored verdicts (finished before they were stored, or not finished) is judged when asked;
so is a run against a pinned baseline run, which needs only the two runs."""

from __future__ import annotations

from sqlalchemy import select, update

from .history import Judgement, Point, Verdict, env_difference, judge
from .storage import Result, Run, Store


HISTORY_NIGHTS = 90

# What a row is judged on, with its run's environment: one row of a history.
_COLUMNS = (
    Result.run_id, Result.workload, Result.params_key, Result.mode,
    Result.throughput_s, Result.throughput_ci_low, Result.throughput_ci_high,
    Result.host_normalised, Result.host_normalised_ci_low, Result.host_normalised_ci_high,
    Result.speedup, Result.speedup_ci_low, Result.speedup_ci_high,
    Run.gpu_name, Run.gpu_driver, Run.cuda_version, Run.torch_version,
)


def _column(r) -> str:
    """The column a row is judged on: a graph or compile row on its speedup, an eager row on its
    host-normalised throughput (steadier across runs than eager itself: replaybench.stats), or on
    its throughput where it has none (rows stored before it existed)."""
    if r.mode != "eager":
        return "speedup"
    return "host_normalised" if r.host_normalised is not None else "throughput_s"


def _metric(r, column: str | None = None) -> tuple[float | None, float | None, float | None, bool]:
    """(value, ci_low, ci_high, higher_is_better) of the figure a row (a Result, or a row of
    ``_COLUMNS``) is judged on, or of ``column``."""
    column = column or _column(r)
    low, high = (f"{column}_ci_low", f"{column}_ci_high") if column != "throughput_s" else ("throughput_ci_low", "throughput_ci_high")
    return getattr(r, column), getattr(r, low), getattr(r, high), column == "speedup"


def env_key(run) -> tuple:
    """A Run's environment key, or a row of ``_COLUMNS``'s (its run's)."""
    return (run.gpu_name, run.gpu_driver, run.cuda_version, run.torch_version)


def _key(r) -> tuple[str, str, str, str]:
    return (r.workload, r.params_key, r.mode, _column(r))


def _measured(run: Run) -> list[Result]:
    return [r for r in run.results if r.status == "ok" and _metric(r)[0] is not None]


def run_verdicts(store: Store, run: Run, baseline: int | None = None) -> dict[int, Judgement]:
    """Result id -> judgement, for every measured row of ``run``: against the nightly history as
    stored when the run was finished (judged now if it has none stored), or against the pinned
    run ``baseline``."""
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


def store_verdicts(store: Store, run_id: int) -> None:
    """Judge run ``run_id``'s measured rows against the nightly history and store the verdicts.
    Nothing is judged while an earlier run is still running: its history is not complete yet, and
    the run's reports judge it when asked instead. Stored verdicts are what was said when the run
    finished: a later change of the detector's thresholds does not rewrite them."""
    with store.session() as s:
        if s.scalar(select(Run.id).where(Run.id < run_id, Run.status == "running").limit(1)) is not None:
            return
    verdicts = judge_run(store, store.run(run_id))
    if verdicts:
        with store.session.begin() as s:
            s.execute(update(Result), [
                {"id": result_id, "verdict": j.verdict.value, "verdict_change": j.change,
                 "verdict_baseline": j.baseline, "verdict_reason": j.reason}
                for result_id, j in verdicts.items()
            ])


def judge_run(store: Store, run: Run, baseline: int | None = None) -> dict[int, Judgement]:
    """Result id -> judgement, for every measured row of ``run``, judged now: against the row's
    last ``HISTORY_NIGHTS`` nights (the detector looks back at most a 30-night window and its
    levels: 90 nights suffice), or against the pinned run ``baseline``."""
    measured = _measured(run)
    if not measured:
        return {}
    verdicts = {}
    if baseline is not None:
        pinned = _pinned(store, baseline)
        for r in measured:
            value, lo, hi, higher = _metric(r)
            base = pinned.get(_key(r)[:3])
            base = _point(base, _column(r)) if base is not None and _metric(base, _column(r))[0] is not None else None
            verdicts[r.id] = compare_points(base, Point(run.id, value, lo, hi, env_key(run)), higher)
        return verdicts
    history = _history(store, run.id, {_key(r) for r in measured})
    for r in measured:
        value, lo, hi, higher = _metric(r)
        verdicts[r.id] = judge(history[_key(r)], Point(run.id, value, lo, hi, env_key(run)), higher)
    return verdicts


def _point(row, column: str | None = None) -> Point:
    value, lo, hi, _ = _metric(row, column)
    return Point(row.run_id, value, lo, hi, env_key(row))


def _history(store: Store, before: int, keys: set[tuple[str, str, str, str]]) -> dict[tuple, list[Point]]:
    """(workload, params_key, mode, column) -> the last ``HISTORY_NIGHTS`` rows measured ok with a
    value in that column in runs before run ``before``, oldest first (by run, then row). One query
    per key, each a short range of the index ix_results_history, however long the history."""
    history = {}
    with store.session() as s:
        for workload, params_key, mode, column in sorted(keys):
            value = getattr(Result, column)
            rows = s.execute(
                select(*_COLUMNS)
                .join(Run, Result.run_id == Run.id)
                .where(Result.workload == workload, Result.params_key == params_key, Result.mode == mode,
                       Result.run_id < before, Result.status == "ok", value.is_not(None))
                .order_by(Result.run_id.desc(), Result.id.desc())
                .limit(HISTORY_NIGHTS)
            ).all()
            history[(workload, params_key, mode, column)] = [_point(row, column) for row in reversed(rows)]
    return history


def _pinned(store: Store, baseline: int) -> dict[tuple, object]:
    """(workload, params_key, mode) -> the pinned run's row (the last, if repeated)."""
    with store.session() as s:
        rows = s.execute(
            select(*_COLUMNS).join(Run, Result.run_id == Run.id).where(Result.run_id == baseline).order_by(Result.id)
        ).all()
    return {(row.workload, row.params_key, row.mode): row for row in rows}


def compare_points(base: Point | None, current: Point, higher_is_better: bool, min_effect: float = 0.03) -> Judgement:
    """Two runs, each with its own 95% interval: FASTER/SLOWER when the intervals do not overlap
    and the change is at least ``min_effect``; SAME when both intervals sit within ``min_effect``
    of each other; otherwise UNCERTAIN. Intervals from one run do not carry night-to-night noise:
    the nightly history (``judge``) is the better judge where it exists."""
    if base is None:
        return Judgement(Verdict.NEW, None, None, "not measured in the baseline run")
    if base.env_key != current.env_key:
        return Judgement(Verdict.ENV_CHANGED, None, base.value, "environment changed: " + env_difference(base.env_key, current.env_key))
    change = current.value / base.value - 1
    better = change > 0 if higher_is_better else change < 0
    lo_b, hi_b = base.ci_low or base.value, base.ci_high or base.value
    lo_c, hi_c = current.ci_low or current.value, current.ci_high or current.value
    apart = hi_c < lo_b or lo_c > hi_b
    if apart and abs(change) >= min_effect:
        verdict = Verdict.FASTER if better else Verdict.SLOWER
        return Judgement(verdict, change, base.value, f"{change:+.1%} against run {base.run_id}; intervals do not overlap")
    if max(hi_c, hi_b) / min(lo_c, lo_b) - 1 < min_effect:
        return Judgement(Verdict.SAME, change, base.value, f"within {min_effect:.0%} of run {base.run_id}")
    return Judgement(Verdict.UNCERTAIN, change, base.value, f"{change:+.1%} against run {base.run_id}, within the noise")


def compare_runs(store: Store, base_id: int, run_id: int) -> list[tuple[Result, Judgement]]:
    run = store.run(run_id)
    store.run(base_id)  # exists
    verdicts = run_verdicts(store, run, baseline=base_id)
    return [(r, verdicts[r.id]) for r in run.results if r.id in verdicts]
