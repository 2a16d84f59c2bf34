"""PNG plots of a stored run, written beside its report.

Plots of the CUDA graph replay speedup over eager (``mode == 'graph'`` rows measured ``ok``):

* ``<run id>-speedup-vs-batch.png``: speedup against batch size (log2 axis), one line per workload
  (per workload and other parameters where several configs of a workload share a batch size),
  with the rows' 95% intervals as error bars.
* ``<run id>-speedup-vs-kernels.png``: speedup against the kernels launched per iteration (log
  axis), one marker and colour per workload, a line at 1x (no gain).
* ``<run id>-eager-trend.png``, only where the run measured no speedup (a host without CUDA):
  each config's eager time per call over the store's runs, drawn as the trend below.
* ``<run id>-trend.png``: each config's speedup over the store's runs up to this one, by the run's
  start date, with the verdicts stored for its graph rows (``replaybench.verdicts``, judged on graph
  replay time and GPU time): FASTER nights marked by green up-triangles, SLOWER nights by red
  down-triangles, changes of GPU driver, CUDA or torch by grey dotted vertical lines. The
  ``TREND_LIMIT`` configs with the longest history are drawn.
* ``<run id>-normalised-trend.png``: the same configs' speedup with the host's speed taken out
  (``normalised_speedup``), drawn and marked as the trend, where any of their nights stored it: the
  speedup moves with the host's speed from night to night (eager does, graph replay does not), and
  this figure far less (README, "Passes").

A plot with nothing to draw is not written. The data behind each plot comes from a small pure
helper (:func:`batch_series`, :func:`kernel_series`, :func:`trend_series`,
:func:`normalised_series`), so that it can be checked without looking at pixels.

Figures are built as ``matplotlib.figure.Figure`` objects on the Agg canvas, never through pyplot's
global figure registry: nothing is left open, and plots can be written from several threads.

Cost: the trend counts each config's nights in one SELECT, then reads only the configs it draws,
each one range of the index ix_results_history; each plot is drawn once (see
_save). With a year of nightly runs of 200 results each (benchmarks/report_history.py), the whole
report of the last run, verdicts and plots included, rendered in 0.84 to 1.07 s on a 2-core box
with three plots, and in 1.9 to 2.2 s with the normalised trend as a fourth (README).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import matplotlib

matplotlib.use("Agg")  # no display; must precede any pyplot import in this process

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.image  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from sqlalchemy import distinct, func, select  # noqa: E402

from .history import Verdict  # noqa: E402
from .storage import Result, Run, Store  # noqa: E402

__all__ = ["write_plots"]

FIGSIZE = (8, 5)  # inches
DPI = 100
TREND_LIMIT = 12  # configs drawn on the trend plot: those with the most history
MARKERS = "os^DvPX*<>hp"
SPEEDUP_LABEL = "speedup: eager time / graph time (×)"
NORMALISED_LABEL = "speedup, host's speed taken out (×)"
EAGER_LABEL = "eager time per call (us)"


class BatchPoint(NamedTuple):
    batch_size: float
    speedup: float
    ci_low: float | None
    ci_high: float | None


class KernelPoint(NamedTuple):
    kernels_per_iter: float
    speedup: float
    ci_low: float | None
    ci_high: float | None
    label: str  # the config, "batch_size=8, dtype=float16, width=128"


class TrendPoint(NamedTuple):
    run_id: int
    value: float  # the graph speedup (the host-normalised one, on its trend), or eager seconds per call (an eager trend)
    verdict: Verdict | None  # as stored for the row; None where none was
    started_at: datetime | None
    ci_low: float | None = None
    ci_high: float | None = None
    reason: str = ""
    env_changed: bool = False  # driver, CUDA or torch differ from the config's previous night
    normalised: float | None = None  # the graph row's host-normalised speedup, where it stored one
    normalised_low: float | None = None
    normalised_high: float | None = None


# -- data ----------------------------------------------------------------------------------------


def _params_text(params: dict[str, Any], keys: Iterable[str] | None = None) -> str:
    keys = sorted(params) if keys is None else [k for k in sorted(params) if k in set(keys)]
    return ", ".join(f"{k}={params[k]}" for k in keys)


def _varying(params_list: list[dict[str, Any]]) -> set[str]:
    """The parameters whose value is not the same in every one of ``params_list``."""
    keys = set().union(*params_list) if params_list else set()
    return {k for k in keys if len({repr(p.get(k)) for p in params_list}) > 1}


def _config_labels(configs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """'workload' where a workload has one config, else 'workload (the parameters that differ
    between its configs)': unique for distinct configs, and short."""
    by_workload: dict[str, list[dict]] = defaultdict(list)
    for workload, params in configs:
        by_workload[workload].append(params)
    varying = {w: _varying(ps) for w, ps in by_workload.items()}
    labels = []
    for workload, params in configs:
        if len(by_workload[workload]) == 1 or not varying[workload]:
            labels.append(workload)
        else:
            labels.append(f"{workload} ({_params_text(params, varying[workload])})")
    return labels


def _usable(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _graph_rows(run: Run, mode: str = "graph") -> list[Result]:
    """The run's graph rows measured ok with a speedup (eager rows with a time per call, for
    ``mode='eager'``), one per config (the last if repeated)."""
    rows: dict[tuple[str, str], Result] = {}
    for r in sorted(run.results, key=lambda r: r.id or 0):
        if r.mode == mode and r.status == "ok" and _usable(r.speedup if mode == "graph" else r.throughput_s):
            rows[(r.workload, r.params_key)] = r
    return sorted(rows.values(), key=lambda r: (r.workload, r.params_key))


def batch_series(run: Run) -> dict[str, list[BatchPoint]]:
    """Label -> the graph speedup at each batch size, ascending: one series per workload, or per
    workload and other parameters where several configs of a workload share a batch size."""
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in _graph_rows(run):
        if _usable((r.params or {}).get("batch_size")):
            groups[r.workload].append(r)
    series: dict[str, list[BatchPoint]] = {}
    for workload, rows in groups.items():
        sizes = [r.params["batch_size"] for r in rows]
        if len(set(sizes)) == len(sizes):
            lines = {workload: rows}
        else:
            others = [{k: v for k, v in r.params.items() if k != "batch_size"} for r in rows]
            varying = _varying(others)
            lines = defaultdict(list)
            for r, other in zip(rows, others):
                lines[f"{workload} ({_params_text(other, varying)})"].append(r)
        for label, line in lines.items():
            series[label] = sorted(
                (BatchPoint(r.params["batch_size"], r.speedup, r.speedup_ci_low, r.speedup_ci_high) for r in line),
                key=lambda p: p.batch_size,
            )
    return series


def kernel_series(run: Run) -> dict[str, list[KernelPoint]]:
    """Workload -> (kernels per iteration, graph speedup) of each of its configs. The kernel count
    is the graph row's, else the eager row's of the same config; configs without one are left out."""
    eager_kernels = {
        (r.workload, r.params_key): r.kernels_per_iter for r in run.results if r.mode == "eager" and _usable(r.kernels_per_iter)
    }
    series: dict[str, list[KernelPoint]] = defaultdict(list)
    for r in _graph_rows(run):
        kernels = r.kernels_per_iter if _usable(r.kernels_per_iter) else eager_kernels.get((r.workload, r.params_key))
        if kernels is not None:
            series[r.workload].append(KernelPoint(kernels, r.speedup, r.speedup_ci_low, r.speedup_ci_high, _params_text(r.params or {})))
    return {w: sorted(ps) for w, ps in sorted(series.items())}


def trend_series(store: Store, run: Run, limit: int | None = TREND_LIMIT, mode: str = "graph") -> dict[str, list[TrendPoint]]:
    """Label -> each night's graph speedup (and host-normalised speedup) of one config measured ok
    in ``run`` (its eager time per call, for ``mode='eager'``), over the store's runs with id <=
    ``run.id`` (ordered by run id), with the verdict stored for that night's row. Only the ``limit`` configs with the most nights
    (ties: spread over the workloads), in order of workload and parameters key."""
    return _trend(store, run, limit, mode)[0]


def _longest(nights: dict[tuple[str, str], int], limit: int | None) -> list[tuple[str, str]]:
    """The ``limit`` configs with the most nights, in order of workload and parameters key. Among
    equally long histories, one config of each workload before a second of any (a nightly run's
    configs all share the history: the plot then spans the workloads)."""
    rank, seen = {}, defaultdict(int)
    for c in sorted(nights):
        rank[c], seen[c[0]] = seen[c[0]], seen[c[0]] + 1
    chosen = sorted(nights, key=lambda c: (-nights[c], rank[c], c))
    return sorted(chosen if limit is None else chosen[:limit])


def _trend(store: Store, run: Run, limit: int | None, mode: str = "graph") -> tuple[dict[str, list[TrendPoint]], int]:
    """trend_series, and the number of configs there were before the limit."""
    current = _graph_rows(run, mode)
    if not current:
        return {}, 0
    configs = {(r.workload, r.params_key): r.params or {} for r in current}
    value, low, high = ((Result.speedup, Result.speedup_ci_low, Result.speedup_ci_high) if mode == "graph" else
                        (Result.throughput_s, Result.throughput_ci_low, Result.throughput_ci_high))
    # Rows measured ok, up to this run, with a finite positive figure (_usable, in SQL: NULL fails
    # both comparisons, NaN at least one: PostgreSQL sorts it above infinity).
    graph_ok = (Result.run_id <= run.id, Result.mode == mode, Result.status == "ok", value > 0, value < math.inf)
    with store.session() as s:
        counted = s.execute(
            select(Result.workload, Result.params_key, func.count(distinct(Result.run_id)))
            .where(*graph_ok, Result.workload.in_(sorted({w for w, _ in configs})))
            .group_by(Result.workload, Result.params_key)
        ).all()
        nights = {(workload, key): n for workload, key, n in counted if (workload, key) in configs}
        chosen = _longest(nights, limit)
        # One night per run and config: a repeated row replaces the earlier one of its run.
        history: dict[tuple[str, str], dict[int, tuple]] = {}
        for workload, key in chosen:  # each a short range of the index ix_results_history
            rows = s.execute(
                select(Result.run_id, value, low, high, Result.normalised_speedup, Result.normalised_speedup_ci_low,
                       Result.normalised_speedup_ci_high, Run.started_at,
                       Result.verdict, Result.verdict_reason, Run.gpu_driver, Run.cuda_version, Run.torch_version)
                .join(Run, Result.run_id == Run.id)
                .where(*graph_ok, Result.workload == workload, Result.params_key == key)
                .order_by(Result.run_id, Result.id)
            ).all()
            history[(workload, key)] = {run_id: (v, lo, hi, (n, n_lo, n_hi), started_at, verdict, reason, tuple(env))
                                        for run_id, v, lo, hi, n, n_lo, n_hi, started_at, verdict, reason, *env in rows}
    # Labelled among all the run's configs, so that a label means the same on every plot.
    every = sorted(configs)
    labels = dict(zip(every, _config_labels([(w, configs[(w, k)]) for w, k in every])))
    series: dict[str, list[TrendPoint]] = {}
    for config in chosen:
        label = labels[config]
        ordered = list(history[config].items())  # by run: the query's order
        envs = [env for _, (*_, env) in ordered]
        series[label] = [
            TrendPoint(run_id, v, Verdict(verdict) if verdict else None, started_at, lo, hi, reason or "",
                       i > 0 and envs[i] != envs[i - 1], *(x if _usable(x) else None for x in normalised))
            for i, (run_id, (v, lo, hi, normalised, started_at, verdict, reason, _)) in enumerate(ordered)
        ]
    return series, len(nights)


# -- drawing -------------------------------------------------------------------------------------


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    return fig, fig.add_subplot()


def _title(run: Run, what: str) -> str:
    env = ", ".join(str(x) for x in (run.gpu_name, run.started_at and f"{run.started_at:%Y-%m-%d}") if x)
    return f"Run {run.id}: {what}" + (f"\n{env}" if env else "")


def _yerr(points) -> list[list[float]]:
    """Asymmetric error bars from the intervals; none (0) where an interval is missing."""
    low = [max(p.speedup - p.ci_low, 0.0) if p.ci_low is not None else 0.0 for p in points]
    high = [max(p.ci_high - p.speedup, 0.0) if p.ci_high is not None else 0.0 for p in points]
    return [low, high]


def _legend(ax, n: int, title: str | None = None) -> None:
    if n:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title=title, title_fontsize=8, frameon=False)


def _log_ticks(axis, values: list[float], at: list[float] | None = None) -> None:
    """Ticks of a log axis as plain numbers (2, 5, 10, 20; not 10^1), enough of them to read a
    value off an axis that spans less than a decade: at ``at``, else at nice numbers."""
    lo, hi = min(values), max(values)
    if at is not None:
        axis.set_major_locator(FixedLocator(at))
    elif hi / lo > 1000:
        return  # several decades: matplotlib's powers of ten read best
    else:
        subs = (1.0, 2.0, 5.0) if hi / lo > 30 else (1.0, 2.0, 3.0, 5.0, 7.0) if hi / lo > 3 else tuple(range(1, 10))
        axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _style(i: int) -> dict[str, Any]:
    colors = matplotlib.colormaps["tab10"].colors
    return {"color": colors[i % 10], "marker": MARKERS[i % len(MARKERS)], "linestyle": "-" if i < 10 else "--"}


def _save(fig: Figure, path: Path) -> None:
    """The PNG that ``fig.savefig(path, dpi=DPI)`` writes (byte for byte, with matplotlib's default
    savefig settings), drawn once instead of twice: savefig lays a constrained-layout figure out
    in a drawing pass of its own, then draws it again."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # lays out, then draws
        matplotlib.image.imsave(tmp, canvas.buffer_rgba(), format="png", origin="upper", dpi=DPI)
        os.replace(tmp, path)  # a reader never sees a half-written image
    finally:
        tmp.unlink(missing_ok=True)


def _plot_batch(run: Run, series: dict[str, list[BatchPoint]], path: Path) -> None:
    fig, ax = _figure()
    sizes = sorted({p.batch_size for ps in series.values() for p in ps})
    for i, (label, ps) in enumerate(series.items()):
        st = _style(i)
        ax.errorbar([p.batch_size for p in ps], [p.speedup for p in ps], yerr=_yerr(ps), label=label, capsize=3,
                    markersize=5, linewidth=1.5, **st)
    ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    _log_ticks(ax.xaxis, sizes, at=sizes)
    if len(sizes) == 1:
        ax.set_xlim(sizes[0] / 2, sizes[0] * 2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (samples per iteration, log2 scale)")
    ax.set_ylabel(SPEEDUP_LABEL)
    fig.suptitle(_title(run, "CUDA graph replay speedup vs batch size (95% CI)"), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, len(series), "workload")
    _save(fig, path)


def _plot_kernels(run: Run, series: dict[str, list[KernelPoint]], path: Path) -> None:
    fig, ax = _figure()
    for i, (workload, ps) in enumerate(series.items()):
        st = _style(i)
        ax.errorbar([p.kernels_per_iter for p in ps], [p.speedup for p in ps], yerr=_yerr(ps), label=workload,
                    linestyle="none", marker=st["marker"], color=st["color"], capsize=3, markersize=6)
    ax.axhline(1.0, color="0.3", linewidth=1, linestyle="--", label="1× (no gain)")
    ax.set_xscale("log")
    kernels = [p.kernels_per_iter for ps in series.values() for p in ps]
    _log_ticks(ax.xaxis, kernels)
    if max(kernels) == min(kernels):
        ax.set_xlim(min(kernels) / 2, max(kernels) * 2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("kernels launched per iteration (count, log scale)")
    ax.set_ylabel(SPEEDUP_LABEL)
    fig.suptitle(_title(run, "CUDA graph replay speedup vs kernels per iteration (95% CI)"), fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax, len(series) + 1, "workload")
    _save(fig, path)


def normalised_series(series: dict[str, list[TrendPoint]]) -> dict[str, list[TrendPoint]]:
    """The trend's nights that stored a host-normalised speedup, with it as their value; configs
    with none left out. An environment change on a night left out is marked on the next one kept."""
    out = {}
    for label, ps in series.items():
        kept, changed = [], False
        for p in ps:
            changed |= p.env_changed
            if p.normalised is not None:
                kept.append(p._replace(value=p.normalised, ci_low=p.normalised_low, ci_high=p.normalised_high,
                                       env_changed=changed))
                changed = False
        if kept:
            out[label] = kept
    return out


# What each trend plot shows: its y label and its title.
TRENDS = {
    "speedup": (SPEEDUP_LABEL, "nightly CUDA graph replay speedup"),
    "normalised": (NORMALISED_LABEL, "nightly speedup, host's speed taken out"),
    "eager": (EAGER_LABEL, "eager time per call (no CUDA graph measured)"),
}


def _plot_trend(run: Run, series: dict[str, list[TrendPoint]], path: Path, limited: bool, kind: str = "speedup") -> None:
    """A trend of ``kind`` (TRENDS): the speedup, the host-normalised speedup, or eager time per
    call in microseconds, where lower is better."""
    eager = kind == "eager"
    if eager:
        series = {label: [p._replace(value=p.value * 1e6) for p in ps] for label, ps in series.items()}
    fig, ax = _figure()
    undated = any(p.started_at is None for ps in series.values() for p in ps)
    x = (lambda p: p.run_id) if undated else (lambda p: p.started_at)
    env_changes, marked = set(), set()
    for i, (label, ps) in enumerate(series.items()):
        st = _style(i)
        ax.plot([x(p) for p in ps], [p.value for p in ps], label=label, color=st["color"], linestyle=st["linestyle"],
                marker="." if len(ps) > 1 else "o", markersize=4 if len(ps) > 1 else 6, linewidth=1.2)
        for verdict, marker, color in ((Verdict.FASTER, "^", "tab:green"), (Verdict.SLOWER, "v", "tab:red")):
            hits = [p for p in ps if p.verdict is verdict]
            if hits:
                marked.add(verdict)
                ax.scatter([x(p) for p in hits], [p.value for p in hits], marker=marker, s=70, color=color,
                           edgecolors="black", linewidths=0.6, zorder=5)
        env_changes.update(x(p) for p in ps if p.env_changed)
    for at in sorted(env_changes):
        ax.axvline(at, color="0.5", linestyle=":", linewidth=1.2, zorder=0)
    values = [p.value for ps in series.values() for p in ps]
    xs = [x(p) for ps in series.values() for p in ps]
    if min(xs) == max(xs):  # one night: a day either side, not matplotlib's default of years
        ax.set_xlim(xs[0] - (1 if undated else timedelta(days=1)), xs[0] + (1 if undated else timedelta(days=1)))
    low, high = ax.get_ylim()
    if not eager and low <= 1.0 <= high:  # the line of no gain, where it falls within the data's range
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--", zorder=0)
    label, what = TRENDS[kind]
    if max(values) / min(values) > 3:  # figures far apart: relative steps look alike on a log axis
        ax.set_yscale("log")
        _log_ticks(ax.yaxis, values)
        ylabel = label.replace(")", ", log scale)")
    else:
        ylabel = label
    if undated:
        ax.set_xlabel("run id")
    else:
        # minticks 3, not 5: over four or five nights the default finds no interval and warns.
        locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.set_xlabel("run start date (UTC)")
    ax.set_ylabel(ylabel)
    if limited:
        what += f" ({len(series)} configs with the longest history)"
    fig.suptitle(_title(run, what), fontsize=11)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    keys = [
        (Verdict.FASTER in marked, Line2D([], [], linestyle="none", marker="^", markersize=8, color="tab:green",
                                          markeredgecolor="black"), "FASTER (step confirmed)"),
        (Verdict.SLOWER in marked, Line2D([], [], linestyle="none", marker="v", markersize=8, color="tab:red",
                                          markeredgecolor="black"), "SLOWER (step confirmed)"),
        (bool(env_changes), Line2D([], [], color="0.5", linestyle=":"), "environment changed"),
    ]
    for shown, handle, text in keys:
        if shown:
            handles.append(handle)
            labels.append(text)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _save(fig, path)


def write_plots(store: Store, run: Run, directory: Path) -> dict[str, str]:
    """Write PNG plots for run `run` beside its report, return {kind: file name relative to directory}.

    Kinds: ``speedup_vs_batch``, ``speedup_vs_kernels``, ``trend``, ``normalised_trend``, and
    ``eager_trend`` where no speedup was measured (a host without CUDA); a plot with nothing to draw
    is not written and not returned."""
    directory = Path(directory)
    written: dict[str, str] = {}
    batches = batch_series(run)
    kernels = kernel_series(run)
    trend, configs = _trend(store, run, TREND_LIMIT)
    limited = configs > len(trend)
    # No speedup to follow (a host without CUDA): eager time per call instead.
    eager, eager_configs = ({}, 0) if trend else _trend(store, run, TREND_LIMIT, "eager")
    if not (batches or kernels or trend or eager):
        return written
    directory.mkdir(parents=True, exist_ok=True)
    for kind, data, draw, suffix in (
        ("speedup_vs_batch", batches, _plot_batch, "speedup-vs-batch"),
        ("speedup_vs_kernels", kernels, _plot_kernels, "speedup-vs-kernels"),
        ("trend", trend, lambda r, d, p: _plot_trend(r, d, p, limited), "trend"),
        ("normalised_trend", normalised_series(trend), lambda r, d, p: _plot_trend(r, d, p, limited, "normalised"),
         "normalised-trend"),
        ("eager_trend", eager, lambda r, d, p: _plot_trend(r, d, p, eager_configs > len(eager), "eager"), "eager-trend"),
    ):
        if data:
            name = f"{run.id}-{suffix}.png"
            draw(run, data, directory / name)
            written[kind] = name
    return written


def plot_plan(run: Run, data: dict[str, Any], path: Path) -> None:
    """A capture plan (``replaybench.planning``): time per call against batch size, eager and
    replayed at every measured size, and each set's step: the time a batch takes when it runs as
    the smallest captured size at or above it (eager above them all)."""
    from .plan import covering

    eager = {s["size"]: s["eager"]["s"] for s in data["sizes"] if s.get("eager")}
    graph = {s["size"]: s["graph"]["s"] for s in data["sizes"] if s.get("graph") and not s.get("failed")}
    batches = sorted(b for b, _ in data["traffic"]["probabilities"])
    fig, ax = _figure()
    ax.plot(sorted(eager), [eager[b] * 1e6 for b in sorted(eager)], color="0.6", linewidth=1, label="eager")
    ax.plot(sorted(graph), [graph[c] * 1e6 for c in sorted(graph)], color="0.3", linewidth=0.8, linestyle=":",
            label="replayed at its own size")
    shown = [e for e in data["schedules"] if e["kind"] != "reference"]
    for i, e in enumerate(shown):
        steps = [covering(e["sizes"], b) for b in batches]
        ys = [(eager[b] if c is None else graph[c]) * 1e6 for b, c in zip(batches, steps)]
        style = _style(i)
        ax.step(batches, ys, where="post", color=style["color"], linewidth=1.4 if e["kind"] == "plan" else 1.0,
                label=f"{e['name']} ({len(e['sizes'])} graphs)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("batch size (log scale)")
    ax.set_ylabel("time per call (us)")
    ax.grid(True, alpha=0.3)
    fig.suptitle(_title(run, f"capture plan for {data['label']}"), fontsize=11)
    _legend(ax, len(shown) + 2)
    _save(fig, path)
