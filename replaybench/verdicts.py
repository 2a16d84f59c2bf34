"""Verdicts of a stored run against the nightly history of the same workload, parameters and mode:
the glue between the store and replaybench.history. Graph and compile rows are judged on their
speedup (higher is better), eager rows on their throughput time (lower is better)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select

from .history import Judgement, Point, Verdict, env_difference, judge
from .storage import Result, Run, Store


HISTORY_NIGHTS = 90


def _metric(r: Result) -> tuple[float | None, float | None, float | None, bool]:
    """(value, ci_low, ci_high, higher_is_better) of the figure a row is judged on."""
    if r.mode == "eager":
        return r.throughput_s, r.throughput_ci_low, r.throughput_ci_high, False
    return r.speedup, r.speedup_ci_low, r.speedup_ci_high, True


def env_key(run: Run) -> tuple:
    return (run.gpu_name, run.gpu_driver, run.cuda_version, run.torch_version)


def run_verdicts(store: Store, run: Run, baseline: int | None = None) -> dict[int, Judgement]:
    """Result id -> judgement, for every measured row of ``run``; ``baseline`` pins a run."""
    measured = [r for r in run.results if r.status == "ok" and _metric(r)[0] is not None]
    if not measured:
        return {}
    with store.session() as s:
        rows = s.execute(
            select(Result, Run)
            .join(Run, Result.run_id == Run.id)
            .where(Result.run_id < run.id, Result.status == "ok", Result.workload.in_({r.workload for r in measured}))
            .order_by(Result.run_id)
        ).all()
        pinned_rows = (
            s.execute(select(Result, Run).join(Run, Result.run_id == Run.id).where(Result.run_id == baseline)).all()
            if baseline is not None else []
        )
    history: dict[tuple, list[Point]] = defaultdict(list)
    for r, earlier in rows:
        value, lo, hi, _ = _metric(r)
        if value is not None:
            history[(r.workload, r.params_key, r.mode)].append(Point(earlier.id, value, lo, hi, env_key(earlier)))
    pinned = {}
    for r, base in pinned_rows:
        value, lo, hi, _ = _metric(r)
        if value is not None:
            pinned[(r.workload, r.params_key, r.mode)] = Point(base.id, value, lo, hi, env_key(base))
    verdicts = {}
    for r in measured:
        value, lo, hi, higher = _metric(r)
        key = (r.workload, r.params_key, r.mode)
        current = Point(run.id, value, lo, hi, env_key(run))
        if baseline is not None:
            verdicts[r.id] = compare_points(pinned.get(key), current, higher)
        else:  # the detector looks back at most a 30-night window and its levels: 90 nights suffice
            verdicts[r.id] = judge(history[key][-HISTORY_NIGHTS:], current, higher)
    return verdicts


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
