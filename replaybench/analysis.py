"""From measured series to the figures a user reads: results of several measuring processes
combined, speedups with intervals, break-even points and flags. Torch-free: runs in the
orchestrating process."""

from __future__ import annotations

import statistics

from .results import ConfigResult, ModeResult, Series
from .stats import speedup_ci, summarize, summarize_groups

# Process-to-process spread of a mode's median that is flagged, relative to the median over processes.
PROCESS_SPREAD_FLAG = 0.05
IQR_FLAG = 0.10


def pooled(series: list[Series | None], precision: float) -> Series | None:
    """One series from the same metric measured in several processes."""
    if any(s is None for s in series):
        return None
    groups = [b for s in series for b in s.groups()]
    summary = summarize_groups(groups)
    return Series(
        **summary.__dict__,
        precision_met=all(s.precision_met for s in series),
        blocks=[x for g in groups for x in g],
        per_process=[len(g) for g in groups],
    )


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def combine(results: list[ConfigResult], precision: float) -> ConfigResult:
    """Results of one config from several measuring processes, as one result."""
    if len(results) == 1:
        result = results[0]
        result.cpu_cores = result.cpu_cores or [result.cpu_core]
        return result
    first, last = results[0], results[-1]
    modes = []
    for name in [m.mode for m in first.modes]:
        parts = [r.mode(name) for r in results]
        bad = next((m for m in parts if m.status != "ok"), None)
        if bad is not None:  # a failure in any process is the result: never pool around it
            modes.append(bad)
            continue
        modes.append(
            ModeResult(
                mode=name,
                status="ok",
                throughput=pooled([m.throughput for m in parts], precision),
                latency=pooled([m.latency for m in parts], precision),
                gpu=pooled([m.gpu for m in parts], precision),
                host_enqueue=pooled([m.host_enqueue for m in parts], precision),
                iters_per_block=parts[0].iters_per_block,
                kernels_per_iter=parts[0].kernels_per_iter,
                capture_s=_median(m.capture_s for m in parts),
                first_replay_s=_median(m.first_replay_s for m in parts),
                graph_pool_bytes=parts[0].graph_pool_bytes,
                compile_s=_median(m.compile_s for m in parts),
                graphs_used=parts[0].graphs_used,
                max_abs_diff=max((m.max_abs_diff for m in parts if m.max_abs_diff is not None), default=None),
                flags=list(dict.fromkeys(f for m in parts for f in m.flags)),
            )
        )
    return ConfigResult(
        workload=first.workload,
        params=first.params,
        device=first.device,
        modes=modes,
        cpu_core=first.cpu_core,
        cpu_cores=[r.cpu_core for r in results],
        host_calibration_s=_median(r.host_calibration_s for r in results),
        load_average=first.load_average,
        health_before=first.health_before,
        health_after=last.health_after,
        measuring_s=sum(r.measuring_s or 0 for r in results),
        attempts=max(r.attempts for r in results),
    )


def derive(result: ConfigResult) -> ConfigResult:
    """Speedups with their intervals, break-even points and flags, from the measured series."""
    eager = result.mode("eager")
    for r in result.modes:
        if r.status != "ok" or r.throughput is None:
            continue
        t = r.throughput
        groups = t.groups()
        if not t.precision_met:
            # The target applies in each process; name the least precise one.
            worst = max((summarize(g) for g in groups), key=lambda g: g.rel_halfwidth)
            where = f" in one of {len(groups)} measuring processes" if len(groups) > 1 else ""
            r.flags.append(f"precision target not met{where}: median +/- {worst.rel_halfwidth:.1%} after {worst.n} blocks")
        if t.iqr / t.median > IQR_FLAG:
            r.flags.append(f"high spread: IQR {t.iqr / t.median:.0%} of the median")
        if len(groups) > 1:
            medians = [statistics.median(g) for g in groups]
            spread = (max(medians) - min(medians)) / t.median
            if spread > PROCESS_SPREAD_FLAG:
                r.flags.append(
                    f"medians differ by {spread:.0%} between {len(groups)} measuring processes "
                    f"({min(medians) * 1e6:.1f} to {max(medians) * 1e6:.1f} us): host noise"
                )
        for when, h in (("before", result.health_before), ("after", result.health_after)):
            if h and h.get("throttled"):
                r.flags.append(f"GPU throttled {when} measuring: {', '.join(h.get('throttle_reasons', []))}")
        if r.mode == "eager" or not (eager and eager.status == "ok" and eager.throughput):
            continue
        r.speedup, r.speedup_ci_low, r.speedup_ci_high = speedup_ci(eager.throughput.groups(), groups)
        if r.mode == "graph" and r.capture_s is not None:
            saved = eager.throughput.median - t.median
            r.break_even_replays = (r.capture_s + r.first_replay_s) / saved if saved > 0 else None
    return result
