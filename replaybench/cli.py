"""The ``replaybench`` command.

    replaybench run [--workload NAME ...] [--batch-size N ...] [--dtype D ...] [--mode M ...]
    replaybench ab A B [--variants FILE] [the selection options of run]
    replaybench report [RUN] [--baseline RUN]
    replaybench compare A B [--format table|markdown|json]
    replaybench compare RUN            (an A/B run: B against A)
    replaybench runs [--format table|json]
    replaybench workloads

Every option is validated before anything is measured or written; a bad one ends the command with
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
from collections import Counter
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Callable

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .report import REPORTS_VARIABLE, TEMPLATES_VARIABLE, ReportError, check_output, check_writable, reports_dir, write_report
from .results import MODE_LABELS, MODES
from .storage import URL_VARIABLE, Store, StoreError, without_password
from .plan import PlanError
from .variants import DEFAULT_FILE, VARIANTS_VARIABLE, VariantError
from .workload import DTYPES, WorkloadError, load_registry

console = Console(stderr=True)


def _tables() -> Console:
    """Standard output, for tables: a terminal's width (or $COLUMNS); into a pipe or a file, wide
    enough that no name or figure is cut short (rich would fit it to 80 columns)."""
    return Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=1000)


class UsageError(Exception):
    pass


def _size(text: str) -> tuple[str, list]:
    """``key=v1,v2`` -> (key, [v1, v2]) with numbers parsed."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise argparse.ArgumentTypeError(f"expected KEY=V1[,V2...], got {text!r}")

    def parse(v: str):
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    return key, [parse(v) for v in values.split(",")]


ID_MAX = 2**63 - 1  # the largest integer the stores hold


def _count(text: str) -> int:
    """A whole number from 1 to ID_MAX: a run id or a limit (a negative SQL limit would list
    everything; a larger number than the store's integers is an overflow, not a miss)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= n <= ID_MAX:
        raise argparse.ArgumentTypeError(f"expected 1 to {ID_MAX}, got {n}")
    return n


def _given(text: str) -> str:
    """A value that must say something: an empty path (--db, --reports, --templates, --variants,
    --traffic-file) would quietly mean the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty one")
    return text


def _matching(pattern: str, what: str):
    """An argparse type for a name or index the Prefect server or CUDA takes: refused here in one
    line, not by the server in a traceback (or quietly: an empty --device hides every GPU)."""
    def check(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text
    return check


_gpu_index = _matching(r"[0-9]{1,3}", "a GPU index such as 0")
# Prefect's own rule for names (none of / % & > <), less blanks: a pool made in the UI keeps working.
_pool_name = _matching(r"(?=.*[^\s'\"])[^/%&><]{1,100}", "a work pool name without '/', '%', '&', '<' or '>'")
_gpu_label = _matching(r"[^/%&><\s]{1,100}", "a GPU index or label without spaces, '/', '%', '&', '<' or '>' (it names a limit)")
_block_name = _matching(r"[a-z0-9][a-z0-9-]{0,99}", "a name of lowercase letters, digits and '-' (Prefect's rule for blocks)")
_devices = _matching(r"\S{1,256}", "CUDA_VISIBLE_DEVICES such as 0, 0,1 or a GPU's UUID")  # empty would hide every GPU


def _gpu_indices(text: str) -> list[str]:
    """``0,1`` -> ["0", "1"]; empty: none (the pool only)."""
    return [_gpu_index(g.strip()) for g in text.split(",") if g.strip()]


class _Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr, naming the command (its usage is in --help), as every other refusal is."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="replaybench", description="Does CUDA Graph capture pay off for this model?")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, report=True):
        p.add_argument("--db", metavar="URL", type=_given, help=f"SQLAlchemy database URL (env {URL_VARIABLE}; default sqlite:///replaybench.db)")
        if report:
            p.add_argument("--reports", type=_given, metavar="DIR", help=f"report directory (env {REPORTS_VARIABLE}; default reports)")
            p.add_argument("--templates", type=_given, metavar="DIR", help=f"your own template directory (env {TEMPLATES_VARIABLE})")

    def selection(p, budget: str, processes: str):
        p.add_argument("-w", "--workload", action="append", default=[], metavar="NAME", help="repeat for several; default: all")
        p.add_argument("-b", "--batch-size", action="append", default=[], type=int, metavar="N",
                       help="repeat for several; default: the grid's")
        p.add_argument("--dtype", action="append", default=[], metavar="DTYPE", help=", ".join(DTYPES))
        p.add_argument("--mode", action="append", default=[], metavar="MODE", help=", ".join(MODES) + " (default: eager, graph)")
        p.add_argument("--set", action="append", default=[], type=_size, metavar="KEY=V1,V2", help="narrow another grid key")
        p.add_argument("--full-grid", action="store_true", help="each workload's full grid, not its default grid")
        p.add_argument("--precision", type=float, help="stop once every reported 95%% interval is within +/- this (default 0.02)")
        p.add_argument("--time-budget", type=float, metavar="SECONDS", help=f"seconds of timed rounds per config ({budget})")
        p.add_argument("--processes", type=int, metavar="N", help=processes)
        p.add_argument("--timeout", type=float, metavar="SECONDS", help="per-config limit; a hung config is killed (default 600)")

    run = sub.add_parser("run", help="measure workloads through the Prefect flow and write a report")
    selection(run, "at most; from half of it on, rounds stop once every interval is within 4x the precision; default 6", "measuring processes per GPU, each config timed in all (default 6)")
    run.add_argument("--confirm-limit", type=int, metavar="N",
                     help="configs measured twice more the same night when they look off (default 5; 0: never)")
    run.add_argument("--trigger", choices=("cli", "adhoc", "nightly"), default="cli",
                     help="what the run is stored as; nightly runs are the history that verdicts judge against")
    common(run)

    ab = sub.add_parser("ab", help="measure two variants of the code under test side by side: B against A, per config")
    ab.add_argument("a", metavar="A", help="the baseline variant: a name declared in the variants file")
    ab.add_argument("b", metavar="B", help="the variant compared against A")
    ab.add_argument("--variants", type=_given, metavar="FILE", help=f"the variants file (env {VARIANTS_VARIABLE}; default {DEFAULT_FILE})")
    selection(ab, "both variants together; default 6", "measuring processes per variant, a pair per core (default 12, at least 2)")
    ab.add_argument("--min-effect", type=float, metavar="F",
                    help="an interval holding no change and narrower than +/- this reads 'no difference' (default 0.05)")
    ab.add_argument("--format", choices=("table", "json"), default="table", help="of the comparison printed at the end")
    common(ab)

    plan = sub.add_parser("plan", help="which batch sizes to capture for serving a workload, within a graph-memory budget")
    plan.add_argument("workload", nargs="?", default="gpt_decode_step", help="default: gpt_decode_step")
    plan.add_argument("--dtype", help="default float32")
    plan.add_argument("--set", action="append", default=[], type=_size, metavar="KEY=V", help="another grid key's value")
    plan.add_argument("--candidates", metavar="SIZES", help="candidate batch sizes, e.g. 1-256 (default) or 1,2,4,8-256:8")
    traffic = plan.add_mutually_exclusive_group()
    traffic.add_argument("--traffic", metavar="SPEC", help="zipf (default: weight 1/b), uniform, or weights such as 1:40,2-8:30,9-256:30")
    traffic.add_argument("--traffic-file", type=_given, metavar="FILE", help="observed batch sizes, whitespace or comma separated")
    plan.add_argument("--memory-budget", type=float, metavar="MIB", help="graph memory the plan may take (default: no limit)")
    plan.add_argument("--calls", type=int, metavar="N", help="batches in the replayed trace (default 2000)")
    plan.add_argument("--passes", type=int, metavar="N", help="times each size and the trace are timed (default 5)")
    plan.add_argument("--timeout", type=float, metavar="SECONDS", help="limit for the whole plan (default 1800)")
    plan.add_argument("--format", choices=("table", "json"), default="table", help="of the plan printed at the end")
    common(plan)

    report = sub.add_parser("report", help="print a stored run's report (and write it to the report directory)")
    report.add_argument("run_id", nargs="?", type=_count, metavar="RUN", help="run id; default: the latest run")
    common(report)

    report.add_argument("--baseline", type=_count, metavar="RUN", help="judge against this pinned run instead of the history")

    runs = sub.add_parser("runs", help="list stored runs")
    runs.add_argument("--limit", type=_count, default=20, metavar="N", help="the newest this many (default 20)")
    runs.add_argument("--format", choices=("table", "json"), default="table", help="default table")
    common(runs, report=False)

    compare = sub.add_parser("compare", help="compare run B against run A, with verdicts; or an A/B run's B against its A")
    compare.add_argument("base", type=_count, metavar="A", help="the baseline run's id; alone: an A/B run's id")
    compare.add_argument("run", type=_count, metavar="B", nargs="?", help="the run compared against A")
    compare.add_argument("--format", choices=("table", "markdown", "json"), default="table", help="default table")
    common(compare, report=False)

    regressions = sub.add_parser("regressions", help="list open regressions: slower levels that still hold, not acknowledged")
    regressions.add_argument("--format", choices=("table", "json"), default="table", help="default table")
    common(regressions, report=False)

    ack = sub.add_parser("ack", help="acknowledge an open regression, so that reports stop listing it")
    ack.add_argument("ident", metavar="ID", help="as `replaybench regressions` lists it, e.g. 4512:GPU_time")
    ack.add_argument("--note", help="why (kept with the acknowledgement)")
    common(ack, report=False)

    alerts = sub.add_parser("alerts", help="send each regression a run's verdicts find to a webhook (a Prefect automation)")
    alerts.add_argument("--webhook", required=True, metavar="URL", help="an incoming webhook taking {\"text\": ...} (Slack, Mattermost)")
    alerts.add_argument("--name", default="replaybench-regressions", type=_block_name, help="of the automation and its notification block")
    alerts.add_argument("--allow-private-url", action="store_true", help="allow a webhook on a private network or this host")

    sub.add_parser("workloads", help="list the registered workloads")

    serve = sub.add_parser("serve", help="serve the deployments (nightly, adhoc, shard, ack, ab, plan) from this process")
    serve.add_argument("--cron", default=None, help="nightly schedule (env REPLAYBENCH_NIGHTLY_CRON; default '0 2 * * *')")
    serve.add_argument("--timezone", default=None, help="timezone of the schedule (env REPLAYBENCH_TIMEZONE; default UTC)")
    serve.add_argument("--gpu", default=os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() or "0", type=_gpu_label,
                       help="GPU index of this box, which names its concurrency limit (default: $CUDA_VISIBLE_DEVICES, else 0)")
    serve.add_argument("--now", action="store_true",
                       help="on SIGINT or SIGTERM, stop the flow runs in progress at once, not after their current config")
    serve.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)  # the supervised runner itself
    common(serve)

    setup = sub.add_parser("setup", help="create the work pool and one concurrency limit per GPU (idempotent)")
    setup.add_argument("--pool", default="gpu", type=_pool_name, help="work pool name (default gpu)")
    setup.add_argument("--gpus", default="0", type=_gpu_indices, help="comma-separated GPU indices of this host (empty: the pool only)")

    worker = sub.add_parser("worker", help="start a Prefect process worker pinned to one GPU")
    worker.add_argument("--pool", default="gpu", type=_pool_name, help="work pool to poll (default gpu)")
    worker.add_argument("--gpu", required=True, type=_gpu_index,
                        help="GPU index on this host: names its concurrency limit and queue (with $REPLAYBENCH_HOST, "
                             "else the hostname) and picks the measuring processes' cores")
    worker.add_argument("--device", default=None, type=_devices,
                        help="CUDA_VISIBLE_DEVICES of its flow runs (default: --gpu); 0 in a container that sees only its GPU")
    worker.add_argument("--now", action="store_true",
                        help="on SIGINT or SIGTERM, stop the flow runs in progress at once, not after their current config")
    common(worker)
    return parser


# The options that fill each parameter field: a refusal names what the user typed.
OPTIONS = {"workloads": "-w/--workload", "batch_sizes": "-b/--batch-size", "dtypes": "--dtype", "dtype": "--dtype",
           "modes": "--mode", "sizes": "--set", "precision": "--precision", "time_budget_s": "--time-budget",
           "timeout_s": "--timeout", "processes": "--processes", "confirm_limit": "--confirm-limit",
           "min_effect": "--min-effect", "a": "A", "b": "B", "workload": "WORKLOAD", "candidates": "--candidates",
           "traffic": "--traffic", "calls": "--calls", "passes": "--passes", "memory_budget_mib": "--memory-budget"}


def _reason(err: dict) -> str:
    """A pydantic error's message without the prefix pydantic puts before a validator's own words."""
    return err["msg"].removeprefix("Value error, ")


def _invalid(exc: ValidationError) -> UsageError:
    """A parameter model's refusal as argparse words it: the option, what is wrong, what was given."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    option = OPTIONS.get(loc[0], loc[0]) if loc else None
    if loc[:1] == ["sizes"] and len(loc) > 1:
        option = f"--set {loc[1]}"
    message = f"{_reason(err)} (got {err.get('input')!r})"
    return UsageError(f"argument {option}: {message}" if option else message)


def _sizes(pairs: list[tuple[str, list]]) -> dict[str, list]:
    """--set KEY=V1,V2 options as one dict: a key given twice would have its first values dropped."""
    sizes: dict[str, list] = {}
    for key, values in pairs:
        if key in sizes:
            raise UsageError(f"argument --set: {key} is given twice; give it once")
        sizes[key] = values
    return sizes


def _parameters(args, model=None, **more):
    from .params import RunParameters

    fields = {
        "workloads": args.workload,
        "batch_sizes": args.batch_size,
        "dtypes": args.dtype,
        "sizes": _sizes(args.set),
        "full_grid": args.full_grid,
        "precision": args.precision,
        "time_budget_s": args.time_budget,
        "timeout_s": args.timeout,
        "processes": args.processes,
        **more,
    }
    if args.mode:
        fields["modes"] = args.mode
    try:
        return (model or RunParameters)(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise _invalid(exc) from None


def _store(args, create: bool = True) -> Store:
    """The results store; ``create`` false for commands that only read it."""
    store = Store(args.db, create=create)
    store.mark_dead_local_runs()  # a run killed on this host shows as such at the next command
    return store


def cmd_run(args) -> int:
    parameters = _parameters(args, confirm_limit=args.confirm_limit)
    configs = parameters.configs(load_registry())
    check_output(args.reports, args.templates, create=False)
    _store(args)  # reachable and migrated, before any measuring
    _settings_to_environment(args)  # the flow reads them from there, as it does on a worker
    _prefect_defaults()
    modes = ["eager", *(m for m in parameters.modes if m != "eager")]  # eager is always measured: the reference
    console.print(f"measuring {len(configs)} config(s), modes: {', '.join(modes)}")
    import flows.benchmark as flows_benchmark

    def finished(run_id: int) -> int:
        run = Store(args.db).run(run_id)
        path = reports_dir(args.reports) / f"{run_id}.md"
        latest = path.parent / "latest.md"
        also = f" (also {latest})" if latest.is_file() and path.is_file() and latest.read_bytes() == path.read_bytes() else ""
        print(f"run {run_id} {run.status.replace('_', ' ')}: report {path}{also}")
        if run.error:
            console.print(f"run {run_id}: {run.error}", soft_wrap=True, markup=False, highlight=False)
        return 0 if run.status == "completed" else 1

    flows_benchmark.cli_trigger = args.trigger
    with _measuring(args.db, len(configs), finished):
        run_id = flows_benchmark.benchmark(parameters=flows_benchmark.FlowParameters(**parameters.model_dump()))
    return finished(run_id)


@contextmanager
def _progress(total: int):
    """A progress bar on stderr, advanced by the flow as each config is stored."""
    import flows.benchmark as flows_benchmark

    with Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=False,
    ) as progress:
        bar = progress.add_task("measuring", total=total)

        def advance(done: int, total: int, line: str) -> None:
            progress.update(bar, completed=done, description=line.split(":")[0])

        flows_benchmark.progress_hook = advance
        try:
            yield progress
        finally:
            flows_benchmark.progress_hook = None


class Interrupted(Exception):
    """A run stopped by SIGINT or SIGTERM; the message is the one line the user reads."""

    def __init__(self, line: str, status: int):
        super().__init__(line)
        self.status = status


@contextmanager
def _measuring(store_url: str | None, total: int, finished: Callable[[int], int]):
    """Around a run's flow: a progress bar, a temporary Prefect server of our own where none is
    set, a watch on the server, and signals. The first SIGINT, SIGTERM or SIGHUP stops the run (the
    flow stores it as interrupted, keeping what it measured; measuring processes are killed, the
    server stopped in order), and ends in ``Interrupted``; a second one kills everything and exits
    at once. A server that stops answering is said once; the run goes on measuring and storing, and
    once it is stored (finished or interrupted) the command ends with ``finished(run_id)``'s status
    (or the interruption's), without the calls to the dead server that Prefect would retry for
    minutes."""
    import logging
    import signal

    import flows.benchmark as flows_benchmark
    from flows.local_server import ServerWatch, kill_server, quiet_prefect, temporary_server
    from prefect.exceptions import TerminationSignal

    from .worker import kill_all

    received: list[int] = []  # signals that reached the handler below
    stopped_by: list[int] = []  # the signal a run was stored as interrupted by (Prefect may take SIGTERM first)
    since = datetime.now(timezone.utc)
    ended: list[Callable[[], int]] = []  # once the run is stored: what ends the command, and its status
    progress: list[Progress] = []
    watching: list[ServerWatch] = []

    def interrupted_line() -> str:
        store = Store(store_url)
        mine = [r for r in store.runs(20) if r.pid == os.getpid() and r.host == socket.gethostname()
                and r.started_at.replace(tzinfo=r.started_at.tzinfo or timezone.utc) >= since]
        if mine:
            return f"interrupted: run {mine[0].id} kept {store.configs_kept(mine[0].id)} of {total} configs"
        return "interrupted before a run was stored"

    def exit_now(end: Callable[[], int]) -> None:
        """The run is stored and its server gone: say what there is to say, and leave at once."""
        for bar in progress:
            bar.stop()
        status = end()
        kill_server()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    def on_lost() -> None:
        quiet_prefect()  # Prefect's errors about the dead server: said once, below
        console.print(f"the Prefect server at {api_url} stopped answering: the run goes on and stores what it "
                      "measures; Prefect will not see the rest of it", soft_wrap=True)
        if ended:  # stored already, and waiting on the server
            exit_now(ended[0])

    def on_signal(signum, frame):
        if received:
            kill_all()
            kill_server()
            os._exit(128 + signum)
        received.append(signum)
        logging.disable(logging.CRITICAL)  # what remains to say is one line
        stop = KeyboardInterrupt()
        stop.signum = signum  # which signal, for the stored run (flows.benchmark.interruption)
        raise stop

    def interruption_stored(signal_name: str) -> None:
        signum = signal.Signals[signal_name]
        stopped_by.append(signum)
        logging.disable(logging.CRITICAL)
        ended.append(lambda: print(interrupted_line(), file=sys.stderr) or 128 + signum)
        if watching and watching[0].lost:
            exit_now(ended[0])

    def run_stored(run_id: int) -> None:
        ended.append(lambda: finished(run_id))
        if watching and watching[0].lost:
            exit_now(ended[0])

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    raise_exceptions = logging.raiseExceptions  # quiet_prefect() clears it once the server is lost
    flows_benchmark.interrupt_hook, flows_benchmark.finished_hook = interruption_stored, run_stored
    try:
        with temporary_server() as server, _progress(total) as bar:
            progress.append(bar)
            api_url = server.api_url if server else os.environ["PREFECT_API_URL"]
            with ServerWatch(api_url, on_lost, process=getattr(server, "server_process", None)) as watch:
                watching.append(watch)
                yield
    except (KeyboardInterrupt, TerminationSignal) as exc:
        signum = (received or stopped_by or [getattr(exc, "signal", signal.SIGINT)])[0]
        raise Interrupted(interrupted_line(), 128 + signum) from None
    finally:
        flows_benchmark.interrupt_hook = flows_benchmark.finished_hook = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.disable(logging.NOTSET)
        if not (watching and watching[0].lost):  # a lost server's queued logs stay quiet to the end
            logging.raiseExceptions = raise_exceptions


def _prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def cmd_ab(args) -> int:
    from .params import ABParameters
    from .variants import VariantError, load_variants, pick, variants_file
    from .worker import check_interpreter

    parameters = _parameters(args, model=ABParameters, a=args.a, b=args.b, min_effect=args.min_effect)
    file = variants_file(args.variants).absolute()
    try:
        a, b = pick(load_variants(file), parameters.a, parameters.b)
        for variant in (a, b):
            check_interpreter(variant)
    except VariantError as exc:
        raise UsageError(str(exc)) from None
    configs = parameters.configs(load_registry(shadowing=[a.workloads] if a.workloads else []))
    check_output(args.reports, args.templates, create=False)
    _store(args)
    _settings_to_environment(args)
    os.environ[VARIANTS_VARIABLE] = str(file)  # the flow reads the variants where it runs, as a worker does
    _prefect_defaults()
    console.print(f"measuring {len(configs)} config(s) with {parameters.a} (A) and {parameters.b} (B), "
                  f"{parameters.processes} process pair(s)")
    import flows.ab as flows_ab

    def finished(run_id: int) -> int:
        store = Store(args.db)
        _print_ab(store, run_id, args.format)
        run = store.run(run_id)
        path = reports_dir(args.reports) / f"{run_id}.md"
        console.print(f"run {run_id} {run.status.replace('_', ' ')}: report {path}")
        if run.error:
            console.print(f"run {run_id}: {run.error}", soft_wrap=True, markup=False, highlight=False)
        return 0 if run.status == "completed" else 1

    with _measuring(args.db, len(configs), finished):
        run_id = flows_ab.ab(parameters=flows_ab.ABFlowParameters(**parameters.model_dump()))
    return finished(run_id)


def cmd_plan(args) -> int:
    from .params import PlanParameters, max_run_s
    from .plan import read_traffic_file
    from .planning import resolve_traffic

    sizes = {}
    for key, values in _sizes(args.set).items():
        if len(values) != 1:
            raise UsageError(f"--set {key}: a plan is for one config: give one value")
        sizes[key] = values[0]
    fields = {"workload": args.workload, "dtype": args.dtype, "sizes": sizes, "candidates": args.candidates,
              "traffic": args.traffic, "calls": args.calls, "passes": args.passes, "timeout_s": args.timeout,
              "memory_budget_mib": args.memory_budget}
    try:
        parameters = PlanParameters(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise _invalid(exc) from None
    config = parameters.config(load_registry())
    max_run_s()  # the operator's cap, checked before anything starts
    candidates, _ = resolve_traffic(parameters, None)
    traffic = read_traffic_file(args.traffic_file, candidates[-1]) if args.traffic_file else None
    check_output(args.reports, args.templates, create=False)
    _store(args)
    _settings_to_environment(args)
    _prefect_defaults()
    console.print(f"planning captures for {config.label}: candidate sizes {parameters.candidates}, "
                  f"traffic {traffic.source if traffic else parameters.traffic}")
    import flows.plan as flows_plan

    def finished(run_id: int) -> int:
        store = Store(args.db)
        run = store.run(run_id)
        data = store.plan(run_id)
        if args.format == "json":
            print(json.dumps({"run": run_id, "status": run.status, "error": run.error, "plan": data}, indent=2))
        elif data:
            _print_plan(data)
        path = reports_dir(args.reports) / f"{run_id}.md"
        print(f"run {run_id} {run.status.replace('_', ' ')}" + (f": {run.error}" if run.error else "") + f"; report {path}",
              file=sys.stderr if args.format == "json" else sys.stdout)  # stdout holds the JSON alone
        return 0 if run.status == "completed" else 1

    flows_plan.cli_traffic = traffic
    with _measuring(args.db, 1, finished):
        run_id = flows_plan.plan(parameters=flows_plan.PlanFlowParameters(**parameters.model_dump()))
    return finished(run_id)


def _print_plan(data: dict) -> None:
    table = Table("set", "graphs", "sizes", "expected us/call", "memory MiB", "replayed us/call", "vs predicted")
    for e in data["schedules"]:
        m = e["measured"] or {}
        ok = m.get("status") == "ok"
        table.add_row(e["name"], str(len(e["sizes"])), e["label"] if len(e["label"]) < 40 else e["label"][:37] + "...",
                      f"{e['expected']['time_s'] * 1e6:.2f}", f"{m['memory_bytes'] / 2**20:.1f}" if ok else "n/a",
                      f"{m['replay']['s'] * 1e6:.2f}" if ok else f"failed: {m.get('reason')}",
                      f"{e['agreement']:+.1%}" if e.get("agreement") is not None else "n/a",
                      style="bold" if e["kind"] == "plan" else None)
    _tables().print(table)


def _print_ab(store: Store, run_id: int, form: str) -> None:
    from .report import ab_rows, params_label

    run = store.run(run_id)
    rows = ab_rows(store, run)
    # What was not compared is part of the answer: a mode skipped on this host, a variant that failed.
    apart = {status: [{"workload": r.workload, "params": r.params, "variant": r.variant, "mode": r.mode, "phase": r.phase,
                       "reason": r.reason} for r in run.results if r.status in statuses]
             for status, statuses in (("failures", ("failed", "crashed")), ("skipped", ("skipped",)))}
    if form == "json":
        print(json.dumps({"run": run.id, "status": run.status, "error": run.error, "comparisons": rows, **apart}, indent=2))
        return
    table = Table("workload", "config", "mode", "figure", "A", "B", "B against A [95% CI]",
                  caption="A, B: each variant's own figure over its processes. B against A: within pairs of processes, "
                          "one of each variant timed one right after the other, the figure to judge by (it can differ "
                          "from B over A).")
    for row in rows:
        style = "dim" if row["below_min_effect"] else \
            {"slower": "red", "lower": "red", "faster": "green", "higher": "green"}.get(row["verdict"])
        fmt = (lambda v: "n/a" if v is None else f"{v:.2f}x") if row["metric"] == "speedup" else \
            (lambda v: "n/a" if v is None else f"{v * 1e6:.2f} us")
        table.add_row(row["workload"], params_label(row["params"]), row["mode"], row["metric"], fmt(row["a"]), fmt(row["b"]),
                      row["text"] + (", below the minimum effect" if row["below_min_effect"] else ""), style=style)
    _tables().print(table)
    skipped = Counter((MODE_LABELS.get(r["mode"], r["mode"]), r["reason"]) for r in apart["skipped"])
    for (mode, reason), n in skipped.items():
        console.print(f"skipped: {mode} ({reason}), {n} measurement(s)", soft_wrap=True, markup=False, highlight=False)
    if apart["failures"]:
        console.print(f"{len(apart['failures'])} measurement(s) failed: replaybench report {run.id} lists them", soft_wrap=True)


def _judgeable(store: Store, ident: int, why: str) -> None:
    """A run that exists and whose configs can be judged against another run's: not an A/B run or a plan."""
    kind = {"ab": "an A/B run", "plan": "a capture plan"}.get(store.run(ident).trigger)
    if kind:
        raise UsageError(f"run {ident} is {kind}: {why}")


def cmd_report(args) -> int:
    check_output(args.reports, args.templates, create=False)  # before the store is opened or made
    store = _store(args, create=False)
    run_id = store.run(args.run_id).id
    if args.baseline is not None:
        for ident in (run_id, args.baseline):
            _judgeable(store, ident, "--baseline judges one run's configs against another's")
    _, text = write_report(store, run_id, args.reports, args.templates, baseline=args.baseline)
    sys.stdout.write(text)
    return 0


def cmd_runs(args) -> int:
    runs = _store(args, create=False).runs(args.limit)
    if args.format == "json":
        fields = ("id", "trigger", "status", "host", "gpu_name", "gpu_driver", "cuda_version", "torch_version", "git_commit", "error")
        rows = [{**{f: getattr(r, f) for f in fields}, "started_at": r.started_at.isoformat(),
                 "ended_at": r.ended_at.isoformat() if r.ended_at else None} for r in runs]
        print(json.dumps(rows, indent=2))
        return 0
    table = Table("run", "trigger", "started (UTC)", "status", "GPU", "torch", "commit")
    for run in runs:
        table.add_row(str(run.id), run.trigger, run.started_at.strftime("%Y-%m-%d %H:%M"), run.status,
                      run.gpu_name or "none", run.torch_version or "", (run.git_commit or "")[:10])
    _tables().print(table)
    return 0


def cmd_compare(args) -> int:
    from .report import md_cell, params_label
    from .verdicts import compare_runs

    store = _store(args, create=False)
    if args.run is None:
        if store.run(args.base).trigger != "ab":
            _judgeable(store, args.base, f"its report is replaybench report {args.base}")  # a plan: compared with nothing
            raise UsageError(f"run {args.base} is not an A/B run: compare it with another run (replaybench compare A B)")
        if args.format == "markdown":
            raise UsageError("an A/B run's markdown is its report: replaybench report " + str(args.base))
        _print_ab(store, args.base, args.format)
        return 0
    if "ab" in (store.run(args.base).trigger, store.run(args.run).trigger):
        raise UsageError("an A/B run holds two variants: compare its B against its A with replaybench compare RUN")
    for ident in (args.base, args.run):
        _judgeable(store, ident, f"its report is replaybench report {ident}")
    rows = compare_runs(store, args.base, args.run)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    header = ("workload", "config", "mode", "figure", f"run {args.base}", f"run {args.run}", "change", "verdict")

    def fmt(v):
        return "n/a" if v is None else f"{v * 1e6:.2f} us"

    def cells(row):
        change = "n/a" if row["change"] is None else f"{row['change']:+.1%}"
        return (row["workload"], params_label(row["params"]), row["mode"], row["figure"], fmt(row["baseline"]),
                fmt(row["value"]), change, row["verdict"])

    if args.format == "markdown":
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(md_cell(c) for c in cells(row)) + " |")
        return 0
    table = Table(*header)
    for row in rows:
        style = {"SLOWER": "red", "FASTER": "green"}.get(row["verdict"])
        table.add_row(*cells(row), style=style)
    _tables().print(table)
    count = Counter(row["verdict"] for row in rows)
    apart = {f"only in run {args.base}": count["MISSING"],
             f"only in run {args.run}": sum(r["verdict"] == "NEW" and r["baseline"] is None for r in rows),
             "measured on another GPU": sum(r["verdict"] == "NEW" and r["baseline"] is not None for r in rows)}
    console.print(f"{count['SLOWER']} slower, {count['FASTER']} faster of {len(rows) - sum(apart.values())} compared"
                  + "".join(f"; {n} {why}" for why, n in apart.items() if n))
    return 0


def _latest_nightly(store: Store):
    nightly = [r for r in store.runs(200) if r.trigger == "nightly" and r.status in ("completed", "completed_with_failures")]
    return store.run(nightly[0].id) if nightly else None


def cmd_regressions(args) -> int:
    from .report import params_label
    from .verdicts import report_regressions

    store = _store(args, create=False)
    run = _latest_nightly(store)
    found = report_regressions(store, run) if run is not None else []
    if args.format == "json":
        print(json.dumps([{"id": o.ident, "workload": o.workload, "params": o.params, "mode": o.mode, "figure": o.metric,
                           "change": o.change, "first_run_id": o.first_run_id, "cause": o.cause} for o in found], indent=2))
        return 0
    if run is None:
        console.print("no finished nightly run yet")
        return 0
    table = Table("ID", "workload", "config", "mode", "figure", "change", "since run", "likely cause")
    for o in found:
        table.add_row(o.ident, o.workload, params_label(o.params), o.mode, o.metric, f"{o.change:+.1%}", str(o.first_run_id),
                      o.cause or "")
    _tables().print(table)
    console.print(f"{len(found)} open regression(s) as of nightly run {run.id}")
    return 0


def cmd_ack(args) -> int:
    from .verdicts import acknowledge

    try:
        o = acknowledge(_store(args, create=False), args.ident, args.note)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    console.print(f"acknowledged: {o.workload} {o.mode} {o.metric} {o.change:+.1%} since run {o.first_run_id}")
    return 0


def cmd_alerts(args) -> int:
    from urllib.parse import urlparse

    from prefect.utilities.urls import validate_restricted_url

    try:
        url = urlparse(args.webhook)
        url.port  # noqa: B018 - parsed on access: a port that is no number raises here
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise UsageError(f"argument --webhook: not an http(s) URL: {args.webhook!r}")
    if not args.allow_private_url:
        # Prefect checks the address only when it posts, on the server: a webhook it refuses would be
        # accepted here and every alert would then fail, unseen.
        try:
            validate_restricted_url(args.webhook)
        except ValueError as exc:
            if "could not be resolved" not in str(exc):
                raise UsageError(f"argument --webhook: {exc} Prefect posts to it only with --allow-private-url") from None
            # The server may resolve what this host does not; it checks the address again when it posts.
            console.print(f"[yellow]warning[/yellow]: {url.hostname} does not resolve from this host: "
                          "the Prefect server must resolve it to a public address to post to it")
    if not os.environ.get("PREFECT_API_URL"):
        raise UsageError("PREFECT_API_URL is not set: alerts live on a Prefect server (see the README's One box)")
    from flows.alerts import create_alert

    automation = create_alert(args.webhook, args.name, args.allow_private_url)
    console.print(f"automation {automation.name!r} ({automation.id}): each regression is posted to {url.scheme}://{url.netloc}/...")
    return 0


def cmd_workloads(args) -> int:
    registry = load_registry()
    table = Table("workload", "default configs", "full grid", "grid (--set KEY=VALUE; default values in bold)", "description")
    for name in registry.names():
        w = registry.workloads[name]
        default = w.default_grid or w.grid
        grid = "\n".join(f"{key}: " + ", ".join(f"[bold]{v}[/bold]" if v in default.get(key, ()) else str(v) for v in values)
                         for key, values in w.grid.items())
        table.add_row(name, str(len(list(w.configs()))), str(len(list(w.configs(full=True)))), grid, w.description)
    _tables().print(table)
    for name, why in sorted(registry.broken.items()):
        console.print(f"[red]could not load {name}[/red]: {why}")
    return 0


def _settings_to_environment(args) -> None:
    """Flow runs read the store, report and template settings from the environment."""
    for variable, name in ((URL_VARIABLE, "db"), (REPORTS_VARIABLE, "reports"), (TEMPLATES_VARIABLE, "templates")):
        if getattr(args, name, None):
            os.environ[variable] = getattr(args, name)


def _check_worker_settings() -> None:
    """The operator's settings that a worker's or serve's flow runs read, checked at its start."""
    from flows.benchmark import gpu_lease_s, nightly_gpu_wait_s

    from .params import max_configs, max_run_s

    max_configs()
    max_run_s()
    try:
        gpu_lease_s()
        nightly_gpu_wait_s()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _ready_to_run_flows(args) -> None:
    """What `serve` and `worker` check and set up before they start anything."""
    _check_worker_settings()
    check_output(args.reports, args.templates, create=False)  # before anything is written or started
    _store(args)
    check_writable(reports_dir(args.reports))  # made now
    _settings_to_environment(args)


def _check_schedule(cron: str, timezone: str) -> None:
    """The nightly schedule, checked before anything starts (the server would refuse it with a traceback)."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = {"cron": "--cron (or $REPLAYBENCH_NIGHTLY_CRON)", "timezone": "--timezone (or $REPLAYBENCH_TIMEZONE)"}
        raise UsageError(f"argument {option.get(err['loc'][0], err['loc'][0])}: {_reason(err)}") from None


def cmd_serve(args) -> int:
    from flows.deployments import NIGHTLY_CRON, TIMEZONE
    from flows.orchestration import serve
    from flows.supervise import supervise

    _check_schedule(args.cron or NIGHTLY_CRON, args.timezone or TIMEZONE)
    _ready_to_run_flows(args)
    if not args.supervised:  # the runner in a process of its own, stopped cleanly (flows/supervise.py)
        child = ["serve", "--gpu", args.gpu, "--supervised", *(["--cron", args.cron] if args.cron else []),
                 *(["--timezone", args.timezone] if args.timezone else [])]
        return supervise([sys.executable, "-m", "replaybench.cli", *child], "serve", now=args.now)
    serve(args.cron or NIGHTLY_CRON, args.timezone or TIMEZONE, args.gpu)
    return 0


def cmd_setup(args) -> int:
    from flows.orchestration import setup

    for name in setup(args.pool, args.gpus):
        print(f"concurrency limit {name}: 1")
    print(f"work pool {args.pool}: process")
    return 0


def cmd_worker(args) -> int:
    from flows.orchestration import worker_command
    from flows.supervise import supervise

    _ready_to_run_flows(args)
    return supervise(worker_command(args.pool, args.gpu, args.device), "worker", now=args.now)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help(sys.stderr)  # a bare `replaybench`: what it can do, not a one-line refusal
        return 2
    args = parser.parse_args(argv)
    handler = {
        "run": cmd_run, "report": cmd_report, "runs": cmd_runs, "workloads": cmd_workloads,
        "serve": cmd_serve, "setup": cmd_setup, "worker": cmd_worker, "compare": cmd_compare,
        "regressions": cmd_regressions, "ack": cmd_ack, "alerts": cmd_alerts, "ab": cmd_ab, "plan": cmd_plan,
    }[args.command]
    try:
        return handler(args)
    except (UsageError, WorkloadError, StoreError, ReportError, VariantError, PlanError) as exc:
        print(f"replaybench: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(exc, file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:  # before anything was started
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        import httpx

        if not isinstance(exc, httpx.TransportError):
            raise
        from prefect.settings import PREFECT_API_URL

        where = PREFECT_API_URL.value() or "(a temporary one)"  # the environment's, else the Prefect profile's
        print(f"replaybench: error: cannot reach the Prefect server {without_password(where)}: {without_password(str(exc))}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
