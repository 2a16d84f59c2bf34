"""Results storage: SQLAlchemy 2.0 typed ORM over SQLite (default) or any SQLAlchemy URL.

The schema is managed by Alembic (``replaybench/migrations``): opening a store upgrades the database
in place. Each result is committed as soon as it is measured, so a crash loses nothing finished.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, create_engine, event, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DataError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, sessionmaker

from .results import ConfigResult, ModeResult
from .workload import params_json

log = logging.getLogger(__name__)

URL_VARIABLE = "REPLAYBENCH_DB_URL"
DEFAULT_URL = "sqlite:///replaybench.db"

TRIGGERS = ("nightly", "adhoc", "cli", "shard", "ab", "plan")


SHARDS_PENDING = "shards_pending"  # in a sharded run's parameters: token -> configs not yet claimed


class StoreError(RuntimeError):
    """The database cannot be used; the message says which URL and why, in one line."""


class NotStored(RuntimeError):
    """The database refused a result's rows (a ``DataError``: a value too long for its column,
    say): retrying cannot help. The message is the database's first line."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    trigger: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32), default="running")
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None]
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    gpu_name: Mapped[str | None] = mapped_column(String(255))
    gpu_driver: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    python_version: Mapped[str | None] = mapped_column(String(32))
    package_version: Mapped[str | None] = mapped_column(String(32))
    git_commit: Mapped[str | None] = mapped_column(String(64))
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    environment: Mapped[dict[str, Any]] = mapped_column(default=dict)
    parameters: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    # The open regressions of its configs when it was judged (replaybench.verdicts.store_verdicts)
    open_regressions: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)

    results: Mapped[list["Result"]] = relationship(back_populates="run", order_by="Result.id")

    @property
    def environment_key(self) -> tuple:
        """What must match for two runs' figures to be comparable."""
        return (self.gpu_name, self.gpu_driver, self.cuda_version, self.torch_version)


class Result(Base):
    __tablename__ = "results"
    # One config's history (verdicts, trend plot); also serves lookups by workload alone.
    __table_args__ = (Index("ix_results_history", "workload", "params_key", "mode", "run_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)
    workload: Mapped[str] = mapped_column(String(128))
    params: Mapped[dict[str, Any]]
    params_key: Mapped[str] = mapped_column(String(512))
    mode: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    phase: Mapped[str | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text)
    device: Mapped[str | None] = mapped_column(String(255))
    gpu: Mapped[str | None] = mapped_column(String(255))  # host, visible index and UUID of the GPU used
    cpu_core: Mapped[int | None]
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    # seconds per iteration: median and its 95% CI over blocks, spread, block count
    throughput_s: Mapped[float | None]
    throughput_ci_low: Mapped[float | None]
    throughput_ci_high: Mapped[float | None]
    throughput_min: Mapped[float | None]
    throughput_max: Mapped[float | None]
    throughput_iqr: Mapped[float | None]
    throughput_blocks: Mapped[int | None]
    iters_per_block: Mapped[int | None]
    precision_met: Mapped[bool | None] = mapped_column(Boolean)
    latency_s: Mapped[float | None]
    latency_ci_low: Mapped[float | None]
    latency_ci_high: Mapped[float | None]
    gpu_s: Mapped[float | None]
    gpu_ci_low: Mapped[float | None]
    gpu_ci_high: Mapped[float | None]
    host_enqueue_s: Mapped[float | None]
    # eager only: throughput at standard host speed (analysis.Units.at_standard_host), and its 95% interval
    host_normalised: Mapped[float | None]
    host_normalised_ci_low: Mapped[float | None]
    host_normalised_ci_high: Mapped[float | None]
    kernels_per_iter: Mapped[float | None]
    launch_overhead_s: Mapped[float | None]
    launch_bound_fraction: Mapped[float | None]
    speedup: Mapped[float | None]
    speedup_ci_low: Mapped[float | None]
    speedup_ci_high: Mapped[float | None]
    # the speedup with the host's speed taken out, and its 95% interval (analysis.host_normalised_speedup)
    normalised_speedup: Mapped[float | None]
    normalised_speedup_ci_low: Mapped[float | None]
    normalised_speedup_ci_high: Mapped[float | None]
    capture_s: Mapped[float | None]
    first_replay_s: Mapped[float | None]
    graph_pool_bytes: Mapped[int | None] = mapped_column(BigInteger)
    break_even_replays: Mapped[float | None]
    compile_s: Mapped[float | None]
    graphs_used: Mapped[bool | None] = mapped_column(Boolean)
    max_abs_diff: Mapped[float | None] = mapped_column(Float)
    # The host's undisturbed reference time while this config was measured, and the share of its
    # timed units set aside because the CPU reference showed the core disturbed (analysis.py).
    host_reference_s: Mapped[float | None]
    host_disturbed_share: Mapped[float | None]
    flags: Mapped[list[Any]] = mapped_column(default=list)
    health: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # raw block timings per metric, so that any statistic can be recomputed later
    samples: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The verdict against the nightly history (replaybench.verdicts), judged when the run was
    # finished: a history.Verdict value, the relative change, the baseline value, the reason.
    verdict: Mapped[str | None] = mapped_column(String(16))
    verdict_change: Mapped[float | None]
    verdict_baseline: Mapped[float | None]
    verdict_reason: Mapped[str | None] = mapped_column(Text)

    # 0: the config's measurement; 1: its same-night confirmation in fresh measuring processes
    repeat: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A/B runs: which variant measured this row, "A" or "B" (their names: the run's environment)
    variant: Mapped[str | None] = mapped_column(String(8))

    run: Mapped[Run] = relationship(back_populates="results")

    def process_values(self, metric: str = "throughput") -> list[float]:
        """Each measuring process's own figure of ``metric`` (its median over its kept blocks)."""
        return list(((self.samples or {}).get("process_values") or {}).get(metric) or [])

    @property
    def units(self) -> tuple[int, int]:
        """(timed units kept, timed units) over every measuring process."""
        kept = ((self.samples or {}).get("kept") or {}).get("throughput") or []
        return sum(map(bool, kept)), len(kept)

    @property
    def processes(self) -> tuple[int, int]:
        """(measuring processes whose figures count, measuring processes that timed units): a
        process with too few undisturbed units is left out (``replaybench.analysis.figures``)."""
        sizes = ((self.samples or {}).get("per_process") or {}).get("throughput") or []
        return len(self.process_values()), sum(1 for n in sizes if n)


class Comparison(Base):
    """B against A for one config, mode and metric of an A/B run (``replaybench.ab``)."""

    __tablename__ = "comparisons"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    workload: Mapped[str] = mapped_column(String(128))
    params: Mapped[dict[str, Any]]
    params_key: Mapped[str] = mapped_column(String(512))
    mode: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(32))
    ratio: Mapped[float | None]  # B's figure over A's, and its 95% interval
    ci_low: Mapped[float | None]
    ci_high: Mapped[float | None]
    pairs: Mapped[int]
    verdict: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)


class Plan(Base):
    """A capture plan (``replaybench.planning``): its workload config and everything measured and
    found, as the report and the JSON output show it."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    workload: Mapped[str] = mapped_column(String(128))
    params: Mapped[dict[str, Any]]
    data: Mapped[dict[str, Any]]


class Acknowledgement(Base):
    """An open regression someone has seen: its config, mode and metric, and its first run."""

    __tablename__ = "acknowledgements"
    __table_args__ = (UniqueConstraint("workload", "params_key", "mode", "metric", "first_run_id", name="uq_acknowledgement"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    workload: Mapped[str] = mapped_column(String(128))
    params_key: Mapped[str] = mapped_column(String(512))
    mode: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(64))
    first_run_id: Mapped[int]
    note: Mapped[str | None] = mapped_column(Text)
    acknowledged_at: Mapped[datetime] = mapped_column(default=utcnow)


def _result_row(run_id: int, config: ConfigResult, m: ModeResult, gpu: str | None = None, repeat: int = 0,
                variant: str | None = None) -> Result:
    t, lat, g, enq = m.throughput, m.latency, m.gpu, m.host_enqueue
    hn = m.host_normalised
    metrics = [(k, s) for k, s in (("throughput", t), ("latency", lat), ("gpu", g), ("host_enqueue", enq),
                                   ("host_normalised", hn)) if s]
    return Result(
        run_id=run_id,
        workload=config.workload,
        params=config.params,
        params_key=params_json(config.params),
        mode=m.mode,
        status=m.status,
        phase=m.phase,
        reason=m.reason,
        device=config.device,
        gpu=gpu,
        repeat=repeat,
        variant=variant,
        cpu_core=config.cpu_core,
        attempts=config.attempts,
        throughput_s=t and t.value,
        throughput_ci_low=t and t.ci_low,
        throughput_ci_high=t and t.ci_high,
        throughput_min=t and t.minimum,
        throughput_max=t and t.maximum,
        throughput_iqr=t and t.iqr,
        throughput_blocks=t and t.n,
        iters_per_block=m.iters_per_block,
        precision_met=t and t.precision_met,
        latency_s=lat and lat.value,
        latency_ci_low=lat and lat.ci_low,
        latency_ci_high=lat and lat.ci_high,
        gpu_s=g and g.value,
        gpu_ci_low=g and g.ci_low,
        gpu_ci_high=g and g.ci_high,
        host_enqueue_s=enq and enq.value,
        host_normalised=hn and hn.value,
        host_normalised_ci_low=hn and hn.ci_low,
        host_normalised_ci_high=hn and hn.ci_high,
        kernels_per_iter=m.kernels_per_iter,
        launch_overhead_s=m.launch_overhead_s,
        launch_bound_fraction=m.launch_bound_fraction,
        speedup=m.speedup,
        speedup_ci_low=m.speedup_ci_low,
        speedup_ci_high=m.speedup_ci_high,
        normalised_speedup=m.normalised_speedup,
        normalised_speedup_ci_low=m.normalised_speedup_ci_low,
        normalised_speedup_ci_high=m.normalised_speedup_ci_high,
        capture_s=m.capture_s,
        first_replay_s=m.first_replay_s,
        graph_pool_bytes=m.graph_pool_bytes,
        break_even_replays=m.break_even_replays,
        compile_s=m.compile_s,
        graphs_used=m.graphs_used,
        max_abs_diff=m.max_abs_diff,
        host_reference_s=config.host and config.host.base_s,
        host_disturbed_share=config.host and config.host.share_disturbed,
        flags=list(m.flags),
        health={
            "before": config.health_before,
            "after": config.health_after,
            "load_average": config.load_average,
            "measuring_s": config.measuring_s,
            "cpu_cores": config.cpu_cores,
        },
        samples={
            **{k: s.blocks for k, s in metrics},
            # blocks per measuring process, in order; which of them counted; each process's figure
            "per_process": {k: s.per_process for k, s in metrics},
            "kept": {k: s.kept for k, s in metrics},
            "process_values": {k: s.process_values for k, s in metrics},
            "speedup_per_process": m.speedup_per_process,
            "host_reference": {"before": config.host.before, "after": config.host.after} if config.host else {},
        },
    )


def database_url(url: str | None = None) -> str:
    return url or os.environ.get(URL_VARIABLE) or DEFAULT_URL


def _sqlite_pragmas(busy_timeout_s: float):
    def on_connect(dbapi_connection, _record) -> None:
        # WAL lets readers and one writer work at once; the busy timeout waits out other writers.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def without_password(text: str) -> str:
    """``text`` with the password of any URL in it replaced by ***, however malformed the URL."""
    return re.sub(r"(://[^/\s:@]*:)[^/\s]*@", r"\1***@", text)


class Store:
    def __init__(self, url: str | None = None, migrate: bool = True, busy_timeout_s: float = 30, retry_s: float = 120,
                 create: bool = True):
        """``create`` false: a SQLite file that does not exist is an error, not a new empty store
        (commands that only read must not leave one behind)."""
        self.url = database_url(url)
        self.retry_s = retry_s
        shown = without_password(self.url)
        try:
            parsed = make_url(self.url)
        except (ArgumentError, ValueError):
            raise StoreError(f"malformed database URL {shown!r}") from None
        if parsed.get_backend_name() == "sqlite":
            if (parsed.database in (None, "", ":memory:") or parsed.database.startswith("file::memory:")
                    or parsed.query.get("mode") == "memory"):
                # The flow, its measuring tasks and the CLI each open the store anew: each would see an empty one.
                raise StoreError(f"database URL {shown!r} names an in-memory SQLite database, which keeps nothing "
                                 "between the connections a run opens; name a file, e.g. sqlite:///replaybench.db")
            parent = Path(parsed.database).expanduser().resolve().parent
            if not parent.is_dir():
                raise StoreError(f"cannot open database {shown!r}: directory {parent} does not exist")
            if not create and not Path(parsed.database).expanduser().exists():
                raise StoreError(f"no run stored yet: there is no database {parsed.database!r} "
                                 f"(--db or ${URL_VARIABLE} names another)")
        try:
            self.engine: Engine = create_engine(self.url, pool_pre_ping=True)
        except (ArgumentError, ImportError, SQLAlchemyError, ValueError) as exc:
            why = str(exc).replace(self.url, shown).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreError(f"cannot use database URL {shown!r}: {without_password(why)}") from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas(busy_timeout_s))
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        if migrate:
            self.migrate()

    def migrate(self) -> None:
        from .migrate import ForeignDatabase, upgrade

        try:
            upgrade(self.engine)
        except ForeignDatabase as exc:
            raise StoreError(f"not a replaybench database {without_password(self.url)!r}: {exc}; "
                             "--db or $" + URL_VARIABLE + " should name a new file or a store of replaybench's") from None
        except SQLAlchemyError as exc:
            url = make_url(self.url).render_as_string(hide_password=True)
            first = str(exc.orig if getattr(exc, "orig", None) else exc).splitlines()[0]
            what = "cannot reach database" if isinstance(exc, OperationalError) else "cannot migrate database"
            raise StoreError(f"{what} {url!r}: {first}") from None

    # -- writing ------------------------------------------------------------------------------
    def create_run(self, trigger: str, parameters: dict[str, Any], environment: dict[str, Any] | None = None) -> int:
        if trigger not in TRIGGERS:
            raise ValueError(f"unknown trigger {trigger!r}; one of {', '.join(TRIGGERS)}")
        with self.session.begin() as s:
            run = Run(trigger=trigger, parameters=parameters, host=socket.gethostname(), pid=os.getpid())
            s.add(run)
            if environment:
                _apply_environment(run, environment)
            s.flush()
            return run.id

    def set_environment(self, run_id: int, environment: dict[str, Any]) -> None:
        with self.session.begin() as s:
            _apply_environment(s.get(Run, run_id), environment)

    def add_shard(self, run_id: int, token: str, configs: list[dict[str, Any]]) -> None:
        """Record a share of a running run's configs that a shard flow run may claim, once, by ``token``."""
        with self.session.begin() as s:
            run = s.get(Run, run_id)
            pending = {**(run.parameters or {}).get(SHARDS_PENDING, {}), token: configs}
            run.parameters = {**(run.parameters or {}), SHARDS_PENDING: pending}

    def claim_shard(self, run_id: int, token: str) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        """(the run's parameters, the configs recorded under ``token``, its trigger), once, while the
        run is running; anything else is refused: a shard measures only what its parent handed out."""
        with self.session.begin() as s:
            run = s.get(Run, run_id)
            pending = dict((run.parameters or {}).get(SHARDS_PENDING, {})) if run is not None else {}
            if run is None or run.status != "running" or token not in pending:
                raise StoreError(f"run {run_id} is not a running run that handed out this shard")
            configs = pending.pop(token)
            run.parameters = {**run.parameters, SHARDS_PENDING: pending}
            return run.parameters, configs, run.trigger

    def set_flow_run(self, run_id: int, flow_run_id: str | None) -> None:
        with self.session.begin() as s:
            s.get(Run, run_id).flow_run_id = flow_run_id

    def add_result(self, run_id: int, result: ConfigResult, gpu: str | None = None, repeat: int = 0) -> list[int]:
        """Store every mode of one config in one transaction, committed before returning. A locked
        or briefly unreachable database is retried for ``retry_s`` seconds: a measurement that
        took minutes is not thrown away for a lock that clears in seconds."""
        return self._write(lambda: (_result_row(run_id, result, m, gpu, repeat) for m in result.modes))

    def add_ab_result(self, run_id: int, result, gpu: str | None = None) -> None:
        """Store both variants' rows of one config and its comparisons (a ``replaybench.ab.ABResult``)
        in one transaction, retried as ``add_result`` is."""
        def rows():
            key = params_json(result.config.params)
            yield from (_result_row(run_id, result.a, m, gpu, variant="A") for m in result.a.modes)
            yield from (_result_row(run_id, result.b, m, gpu, variant="B") for m in result.b.modes)
            for c in result.comparisons:
                yield Comparison(run_id=run_id, workload=result.config.workload, params=result.config.params, params_key=key,
                                 **c.model_dump())

        self._write(rows)

    def _write(self, rows) -> list[int]:
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                with self.session.begin() as s:
                    made = list(rows())
                    s.add_all(made)
                    s.flush()
                    return [r.id for r in made]
            except OperationalError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            except DataError as exc:
                first = str(exc.orig if getattr(exc, "orig", None) else exc).strip().splitlines()
                raise NotStored(f"DataError: {first[0] if first else type(exc).__name__}") from None

    def add_plan(self, run_id: int, data: dict[str, Any]) -> None:
        self._write(lambda: [Plan(run_id=run_id, workload=data["workload"], params=data["params"], data=data)])

    def plan(self, run_id: int) -> dict[str, Any] | None:
        with self.session() as s:
            row = s.scalars(select(Plan).where(Plan.run_id == run_id).order_by(Plan.id)).first()
            return row.data if row else None

    def comparisons(self, run_id: int) -> list[Comparison]:
        with self.session() as s:
            return list(s.scalars(select(Comparison).where(Comparison.run_id == run_id).order_by(Comparison.id)))

    def finish_run(self, run_id: int, error: str | None = None, interrupted: str | None = None) -> str:
        """Set the run's final status: interrupted (by the signal named), failed with ``error``,
        completed with failures (a failed or crashed result, or a config the database refused:
        ``note_not_stored``), or completed; its finished results stay, and so do the notes of
        configs not stored, after the error. Its verdicts are judged and stored afterwards
        (``replaybench.verdicts.store_verdicts``); an interrupted run's never."""
        with self.session.begin() as s:
            run = s.get(Run, run_id)
            statuses = set(s.scalars(select(Result.status).where(Result.run_id == run_id)))
            notes = run.error if run.status == "running" else None  # configs not stored, so far
            if interrupted:
                run.status, run.error = "interrupted", _joined(f"interrupted by {interrupted}", notes)
            elif error:
                run.status, run.error = "failed", _joined(error, notes)
            elif statuses & {"failed", "crashed"} or notes:
                run.status = "completed_with_failures"
            else:
                run.status = "completed"
            run.ended_at = utcnow()
            return run.status

    def note_not_stored(self, run_id: int, line: str) -> None:
        """Record in a running run's error that one of its configs could not be stored (its rows
        refused by the database) and where its measurement was kept instead; the run then ends
        completed with failures at best."""
        with self.session.begin() as s:
            run = s.get(Run, run_id, with_for_update=True)
            run.error = _joined(run.error, line)

    def measuring_s(self, run_id: int) -> float:
        """Seconds a run's stored configs took to measure, added up over its configs (each counted
        once, its confirmations apart; an A/B run's two variants measure a config together), over
        every shard of a sharded run."""
        with self.session() as s:
            rows = s.execute(select(Result.workload, Result.params_key, Result.repeat, Result.health)
                             .where(Result.run_id == run_id)).all()
        took: dict[tuple, float] = {}
        for workload, key, repeat, health in rows:
            seconds = (health or {}).get("measuring_s") or 0.0
            took[(workload, key, repeat)] = max(took.get((workload, key, repeat), 0.0), seconds)
        return sum(took.values())

    def configs_kept(self, run_id: int) -> int:
        """Configs with a stored result in a run (each counted once)."""
        with self.session() as s:
            return len(set(s.execute(select(Result.workload, Result.params_key).where(Result.run_id == run_id)).all()))

    def running_runs(self) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).where(Run.status == "running").order_by(Run.id)))

    def mark_dead_local_runs(self) -> list[int]:
        """Runs left 'running' by a process of this host that no longer exists: their process was
        killed (a run's Prefect flow-run state says the same from any host: flows.benchmark)."""
        host = socket.gethostname()
        dead = [r.id for r in self.running_runs() if r.host == host and r.pid is not None and not _pid_alive(r.pid)]
        for run_id in dead:
            self.mark_crashed(run_id, f"the process running it (pid {self.run(run_id).pid}) ended before the run finished")
        return dead

    def mark_crashed(self, run_id: int, reason: str) -> None:
        """A run whose process ended before it finished: its finished results stay as they are."""
        with self.session.begin() as s:
            run = s.get(Run, run_id)
            if run.status == "running":
                run.status, run.error = "crashed", _joined(reason, run.error)
                run.ended_at = run.ended_at or utcnow()

    def acknowledge(self, workload: str, params_key: str, mode: str, metric: str, first_run_id: int, note: str | None) -> bool:
        """Record that an open regression was seen; False if it already was."""
        with self.session.begin() as s:
            if s.scalar(select(Acknowledgement.id).where(
                Acknowledgement.workload == workload, Acknowledgement.params_key == params_key, Acknowledgement.mode == mode,
                Acknowledgement.metric == metric, Acknowledgement.first_run_id == first_run_id,
            )) is not None:
                return False
            s.add(Acknowledgement(workload=workload, params_key=params_key, mode=mode, metric=metric,
                                  first_run_id=first_run_id, note=note))
            return True

    def acknowledged(self) -> set[tuple[str, str, str, str, int]]:
        with self.session() as s:
            rows = s.execute(select(Acknowledgement.workload, Acknowledgement.params_key, Acknowledgement.mode,
                                    Acknowledgement.metric, Acknowledgement.first_run_id)).all()
        return {tuple(r) for r in rows}

    # -- reading ------------------------------------------------------------------------------
    def run(self, run_id: int | None = None) -> Run:
        with self.session() as s:
            query = select(Run).order_by(Run.id.desc()).limit(1) if run_id is None else select(Run).where(Run.id == run_id)
            run = s.scalars(query).first()
            if run is None:
                raise StoreError("no run stored yet" if run_id is None else f"no run with id {run_id}")
            run.results  # load while the session is open
            return run

    def run_ids_after(self, run_id: int) -> set[int]:
        with self.session() as s:
            return set(s.scalars(select(Run.id).where(Run.id > run_id)))

    def runs(self, limit: int = 50) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).order_by(Run.id.desc()).limit(limit)))


def _joined(*parts: str | None) -> str | None:
    return "; ".join(p for p in parts if p) or None


def _apply_environment(run: Run, env: dict[str, Any]) -> None:
    run.environment = {**(run.environment or {}), **env}
    for column, key in (
        ("cpu_model", "cpu_model"),
        ("gpu_name", "gpu_name"),
        ("gpu_driver", "gpu_driver"),
        ("cuda_version", "cuda"),
        ("torch_version", "torch"),
        ("python_version", "python"),
        ("package_version", "package_version"),
        ("git_commit", "git_commit"),
    ):
        if env.get(key) is not None:
            setattr(run, column, str(env[key]))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
