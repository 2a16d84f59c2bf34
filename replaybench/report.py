"""Markdown reports: stored rows in, a Jinja2 template out. All presentation lives in the template;
this module only groups rows and offers formatting filters.

Templates are looked up first in a user's directory (``--templates`` or ``REPLAYBENCH_TEMPLATES``),
then in the project's ``templates/``, so a user overrides ``report.md.j2`` by placing their own.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, TemplateError

from .analysis import STANDARD_REFERENCE_S
from .history import MIN_HISTORY
from .params import MIN_EFFECT
from .results import MODE_LABELS, MODES
from .storage import Result, Run, Store
from .verdicts import ACROSS_NIGHTS, report_regressions, run_verdicts, speedups_across_nights

TEMPLATES_VARIABLE = "REPLAYBENCH_TEMPLATES"
REPORTS_VARIABLE = "REPLAYBENCH_REPORTS_DIR"
BUILTIN_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


class ReportError(RuntimeError):
    pass


def reports_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get(REPORTS_VARIABLE) or "reports")


def check_writable(directory: Path, create: bool = True) -> Path:
    """Prove a report can be written in ``directory``. With ``create`` false nothing is left on
    disk: the nearest existing ancestor must be a directory one can make a directory in (tried, and
    removed again: permission bits alone pass anything for root, even /proc)."""
    if not create:
        existing = directory.absolute()
        while not existing.exists():
            existing = existing.parent
        try:
            if not existing.is_dir():
                raise NotADirectoryError
            tempfile.TemporaryDirectory(dir=existing, prefix=".probe-").cleanup()
        except OSError:
            raise ReportError(f"report directory {str(directory)!r} is not writable: {existing} is not a writable directory") from None
        return directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ReportError(f"report directory {str(directory)!r} is not writable: {exc.strerror or exc}") from None
    return directory


# -- filters ---------------------------------------------------------------------------------
def md_cell(text) -> str:
    """Text from workloads or errors, made safe for one markdown table cell: it cannot end the
    cell, start a new row, inject HTML, or make a link or an image (no bracket survives)."""
    if text is None:
        return ""
    s = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    s = s.replace("[", "\\[").replace("]", "\\]")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(s.split())


def us(seconds, digits: int = 1) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "n/a"
    return f"{seconds * 1e6:,.{digits}f}"


def times(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}x"


def pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def ms(seconds, digits: int = 2) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:,.{digits}f}"


def mib(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f}"


def verdict(j) -> str:
    """'SLOWER (+6.1%)': the verdict and the relative change of the judged figure."""
    if j is None:
        return "n/a"
    change = f" ({j.change:+.1%})" if j.change is not None and j.verdict.value in ("FASTER", "SLOWER", "SAME", "UNCERTAIN") else ""
    return f"**{j.verdict.value}**{change}" if j.verdict.value in ("FASTER", "SLOWER") else f"{j.verdict.value}{change}"


def params_label(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


# -- view model ------------------------------------------------------------------------------
@dataclass
class ConfigRows:
    params: dict
    results: list[Result] = field(default_factory=list)

    def mode(self, name: str) -> Result | None:
        return next((r for r in self.results if r.mode == name), None)


@dataclass
class WorkloadSection:
    name: str
    configs: list[ConfigRows] = field(default_factory=list)


def group(results: list[Result]) -> list[WorkloadSection]:
    sections: dict[str, WorkloadSection] = {}
    def order(r: Result):  # numbers as numbers: depth 2, 8, 32 rather than 2, 32, 8
        return (r.workload, tuple(sorted((k, str(type(v)), v) for k, v in r.params.items())),
                MODES.index(r.mode) if r.mode in MODES else 99)

    for r in sorted(results, key=order):
        section = sections.setdefault(r.workload, WorkloadSection(r.workload))
        if not section.configs or section.configs[-1].params != r.params:
            section.configs.append(ConfigRows(r.params))
        section.configs[-1].results.append(r)
    return list(sections.values())


def geometric_mean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def context(run: Run, store: Store | None = None, baseline: int | None = None) -> dict:
    results = list(run.results)
    first = [r for r in results if not r.repeat]  # a config once, without its same-night confirmations
    speedups = [r.speedup for r in first if r.mode == "graph" and r.status == "ok"]
    verdicts = run_verdicts(store, run, baseline) if store is not None else {}
    counts = Counter(verdicts[r.id].verdict.value for r in first if r.id in verdicts)
    return {
        "open_regressions": report_regressions(store, run) if store is not None else [],
        "verdicts": verdicts,
        "across_nights": speedups_across_nights(store, run) if store is not None else {m.column: {} for m in ACROSS_NIGHTS},
        "min_history": MIN_HISTORY,
        "verdict_counts": counts,
        "baseline": baseline,
        "run": run,
        "sections": group(results),
        "failures": [r for r in results if r.status in ("failed", "crashed")],
        "skipped": [r for r in results if r.status == "skipped"],
        "flagged": [r for r in results if r.status == "ok" and r.flags],
        "graph_speedup_geomean": geometric_mean(speedups),
        "graph_configs": len(speedups),
        "mode_labels": MODE_LABELS,
        "environment": run.environment or {},
        "gpus": sorted({r.gpu for r in results if r.gpu}),
    }


AB_FIGURES = {"time per call": "throughput_s", "GPU time": "gpu_s", "speedup": "speedup"}


DIFFERENCES = ("slower", "faster", "lower", "higher")


def ab_rows(store: Store, run: Run) -> list[dict]:
    """An A/B run's comparisons, each with A's and B's own figures: what `replaybench compare RUN`,
    JSON output and the A/B report show. ``below_min_effect``: a difference whose whole interval lies
    within +/- the run's minimum effect: real in this run, smaller than what the user asked to hear of
    (with identical variants about one interval in twenty excludes no change, by tiny amounts)."""
    figures = {(r.workload, r.params_key, r.mode, r.variant): r for r in run.results}
    min_effect = (run.parameters or {}).get("min_effect", MIN_EFFECT)
    rows = []
    for c in store.comparisons(run.id):
        column = AB_FIGURES[c.metric]
        a, b = (figures.get((c.workload, c.params_key, c.mode, v)) for v in ("A", "B"))
        rows.append({
            "workload": c.workload, "params": c.params, "mode": c.mode, "metric": c.metric,
            "a": getattr(a, column, None), "b": getattr(b, column, None),
            "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "pairs": c.pairs, "verdict": c.verdict, "text": c.text,
            "below_min_effect": c.verdict in DIFFERENCES and 1 - min_effect < c.ci_low and c.ci_high < 1 + min_effect,
        })
    return rows


def ab_context(run: Run, store: Store) -> dict:
    rows = ab_rows(store, run)
    return {
        "run": run,
        "rows": rows,
        "verdict_counts": Counter(r["verdict"] for r in rows),
        "below_min_effect": Counter(r["verdict"] for r in rows if r["below_min_effect"]),
        "variants": (run.environment or {}).get("variants", {}),
        "parameters": run.parameters or {},
        "failures": [r for r in run.results if r.status in ("failed", "crashed")],
        "skipped": [r for r in run.results if r.status == "skipped"],
        "mode_labels": MODE_LABELS,
        "environment": run.environment or {},
    }


def environment(template_dir: str | os.PathLike | None = None) -> Environment:
    dirs = [d for d in (template_dir, os.environ.get(TEMPLATES_VARIABLE)) if d]
    for d in dirs:
        if not Path(d).is_dir():
            raise ReportError(f"template directory {str(d)!r} {'is not a directory' if Path(d).exists() else 'does not exist'}")
    env = Environment(
        loader=FileSystemLoader([*map(str, dirs), str(BUILTIN_TEMPLATES)]),  # first match wins
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # markdown, not HTML: untrusted text goes through md_cell instead
    )
    env.filters.update(cell=md_cell, us=us, times=times, pct=pct, ms=ms, mib=mib, params=params_label, verdict=verdict)
    env.globals["standard_reference_ms"] = STANDARD_REFERENCE_S * 1e3
    return env


TEMPLATES = ("report.md.j2", "ab.md.j2", "plan.md.j2")


def check_output(reports=None, templates=None, create: bool = True) -> Path:
    """The report directory and the templates, proven before anything is measured: a directory a
    report can be written in (made, with ``create``), and templates that parse. Returns the directory."""
    env = environment(templates)
    for name in TEMPLATES:
        _load(env, name)
    return check_writable(reports_dir(reports), create=create)


def _load(env: Environment, name: str):
    """A template, parsed; a user's that does not parse or is not text is one line naming it."""
    try:
        return env.get_template(name)
    except TemplateError as exc:
        where = getattr(exc, "filename", None) or name
        raise ReportError(_template_error(where, getattr(exc, "lineno", None), exc.message or type(exc).__name__)) from None
    except UnicodeDecodeError as exc:
        found = next((Path(d) / name for d in env.loader.searchpath if (Path(d) / name).is_file()), name)
        raise ReportError(_template_error(str(found), None, f"not UTF-8 text ({exc.reason} at byte {exc.start})")) from None


def _template_error(file: str, line: int | None, what: str) -> str:
    return f"template {file}" + (f", line {line}" if line else "") + f": {what}"


def _render(env: Environment, name: str, **context) -> str:
    template = _load(env, name)
    try:
        return template.render(**context)
    except Exception as exc:  # a user's template may name nothing, divide by zero or give a filter the wrong type
        # Where it failed: a syntax error of an included template says so itself; otherwise the last
        # template frame (jinja maps its frames to template files and lines), which may be an include.
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith(".py")]
        if isinstance(exc, TemplateError) and getattr(exc, "filename", None) and getattr(exc, "lineno", None):
            file, line = exc.filename, exc.lineno
        elif frames:
            file, line = frames[-1].filename, frames[-1].lineno
        else:
            file, line = template.filename or name, None
        ours = not template.filename or Path(file).resolve().is_relative_to(BUILTIN_TEMPLATES)
        if ours and not isinstance(exc, TemplateError):
            raise  # a fault of replaybench's own: its traceback is wanted
        what = exc.message if isinstance(exc, TemplateError) and exc.message else f"{type(exc).__name__}: {exc}"
        raise ReportError(_template_error(file, line, what)) from None


def render(
    run: Run, template_dir=None, template: str = "report.md.j2", store: Store | None = None,
    baseline: int | None = None, plots: dict[str, str] | None = None,
) -> str:
    return _render(environment(template_dir), template, **context(run, store, baseline), plots=plots or {})


def plan_context(run, store: Store, directory: Path) -> dict:
    """A plan run's template context; its plot written beside the report."""
    from .plots import plot_plan

    data = store.plan(run.id)
    plot = None
    if data and any(s.get("eager") for s in data["sizes"]):
        plot = f"{run.id}-plan.png"
        plot_plan(run, data, Path(directory) / plot)
    return {"run": run, "plan": data, "plot": plot, "environment": run.environment or {}}


STAGING = ".plots-"


def _remove_stale_staging(directory: Path, age_s: float = 3600) -> None:
    """Staging directories that a killed report writer left (none is in use for an hour)."""
    for stale in directory.glob(f"{STAGING}*"):
        try:
            if time.time() - stale.stat().st_mtime > age_s:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # another writer removed it first


def write_report(store: Store, run_id: int, directory=None, template_dir=None, baseline: int | None = None) -> tuple[Path, str]:
    """Render run ``run_id`` to ``<dir>/<run id>.md``, and to ``<dir>/latest.md`` unless ``<dir>`` holds
    a newer run's report (an older run's report printed again does not pass for the latest, and a newer
    run that ended without a report does not keep the latest from this one); returns (path, text).
    Judged against a pinned ``baseline``, it is ``<run id>-against-<baseline>.md`` and never the latest:
    the run's own report, judged against the nightly history, stays as it was."""
    directory = reports_dir(directory)
    made = [d for d in (directory, *directory.absolute().parents) if not d.exists()]  # the deepest first
    check_writable(directory)
    try:
        return _write_report(store, store.run(run_id), directory, template_dir, baseline)
    except BaseException:
        for d in made:  # a report that failed leaves no directory of its own behind (one another writer filled stays)
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _write_report(store: Store, run: Run, directory: Path, template_dir, baseline: int | None) -> tuple[Path, str]:
    from .plots import write_plots

    run_id = run.id
    # Plots are drawn aside and join the report only once it rendered: a template that fails leaves
    # the directory as it was (an earlier report of this run keeps its own plots). A report against a
    # pinned baseline adds the plots the run's own report lacks and replaces none of them.
    _remove_stale_staging(directory)
    with tempfile.TemporaryDirectory(dir=directory, prefix=STAGING) as staging:
        staging = Path(staging)
        if run.trigger == "ab":
            text = _render(environment(template_dir), "ab.md.j2", **ab_context(run, store))
        elif run.trigger == "plan":
            text = _render(environment(template_dir), "plan.md.j2", **plan_context(run, store, staging))
        else:
            plots = write_plots(store, run, staging)  # PNGs beside the markdown, linked from it
            text = render(run, template_dir, store=store, baseline=baseline, plots=plots)
        for drawn in staging.iterdir():
            if baseline is None or not (directory / drawn.name).exists():
                os.replace(drawn, directory / drawn.name)
        if baseline is not None:
            path, latest = directory / f"{run_id}-against-{baseline}.md", False
        else:
            path = directory / f"{run_id}.md"
            # Reports of this store's runs only: the directory may hold another database's, or old ones.
            newer = {int(p.stem) for p in directory.glob("*.md") if re.fullmatch("[0-9]{1,18}", p.stem) and int(p.stem) > run_id}
            latest = not (newer and newer & store.run_ids_after(run_id))
        for target in (path, *([directory / "latest.md"] if latest else [])):
            # Drafted in this writer's own staging directory: readers never see a half-written report,
            # and two writers of the same report never move each other's draft away.
            draft = staging / target.name
            draft.write_text(text, encoding="utf-8")
            os.replace(draft, target)
    return path, text
