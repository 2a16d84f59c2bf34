"""The results store on a real PostgreSQL server, reached through its URL.

CI starts the server with ``.ci/postgres.sh``, which prints the URL to put in
REPLAYBENCH_TEST_POSTGRES_URL. Every test works in a database of its own, created on that server for
the test and dropped afterwards, so that no test sees another's rows.
"""

import json
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from replaybench.storage import Result, Run, Store, StoreError

BASE_URL = os.environ.get("REPLAYBENCH_TEST_POSTGRES_URL")
if not BASE_URL:
    pytest.skip("set REPLAYBENCH_TEST_POSTGRES_URL (.ci/postgres.sh starts a server)", allow_module_level=True)

H200_PLAN = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200-plan.json"
ENV = {"torch": "2.11.0", "gpu_name": "NVIDIA H200", "gpu_driver": "580", "cuda": "13.0", "python": "3.12"}
WRITE_SECONDS = 10.0


def known_result(*args, **kwargs):
    # Imported late: tests.helpers pulls in scipy, which the writer processes below need not load.
    from .helpers import known_result as make

    return make(*args, **kwargs)


@pytest.fixture(scope="module")
def server():
    """A connection to the server outside any transaction: CREATE/DROP DATABASE cannot run in one."""
    engine = create_engine(BASE_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with engine.connect() as con:
        assert con.dialect.name == "postgresql"
    yield engine
    engine.dispose()


@pytest.fixture
def stores():
    """Stores opened by a test, disposed before its database is dropped."""
    return []


@pytest.fixture
def pg_url(server, stores):
    """URL of a new, empty database on the server, dropped after the test."""
    name = f"rb_{secrets.token_hex(8)}"
    with server.connect() as con:
        con.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(BASE_URL).set(database=name).render_as_string(hide_password=False)
    for store in stores:
        store.engine.dispose()
    drop(server, name)


def drop(server, name: str, attempts: int = 20) -> None:
    """Drop a test's database as a role that is no superuser (as in CI): end this role's own
    connections to it (WITH (FORCE) would also have to end other roles' and is refused), then
    drop, waiting out a connection that is still closing."""
    for attempt in range(attempts):
        with server.connect() as con:
            con.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = :name AND usename = current_user AND pid <> pg_backend_pid()"),
                        {"name": name})
            try:
                con.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
                return
            except OperationalError:  # "being accessed by other users": a connection still closing
                if attempt == attempts - 1:
                    raise
        time.sleep(0.25)


@pytest.fixture
def open_store(pg_url, stores):
    def open_(**kwargs) -> Store:
        store = Store(pg_url, **kwargs)
        stores.append(store)
        return store

    return open_


def test_a_fresh_database_is_migrated_to_the_newest_head(open_store):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from replaybench.migrate import alembic_config
    from replaybench.storage import Base

    store = open_store()
    assert store.engine.dialect.name == "postgresql"
    head = ScriptDirectory.from_config(alembic_config(store.engine)).get_current_head()
    assert head is not None
    with store.engine.connect() as con:
        assert con.execute(text("select version_num from alembic_version")).scalars().all() == [head]
        # The migrated schema is exactly what the ORM models declare, types included.
        assert compare_metadata(MigrationContext.configure(con, opts={"compare_type": True}), Base.metadata) == []
    columns = {c["name"]: c["type"] for c in inspect(store.engine).get_columns("results")}
    assert columns["graph_pool_bytes"].__visit_name__.upper() == "BIGINT"

    open_store()  # opening again is a no-op: still one version row, at the head
    with store.engine.connect() as con:
        assert con.execute(text("select version_num from alembic_version")).scalars().all() == [head]


def test_round_trip_keeps_every_figure(open_store):
    expected = known_result()
    graph = expected.mode("graph")
    graph.graph_pool_bytes = 3 * 2**31  # above 2**31: needs BIGINT, an INTEGER column would overflow
    graph.flags = ["noisy: cv 4.1%", "thermal"]
    expected.load_average = [0.5, 0.25, 0.125]
    environment = {**ENV, "cpu_model": "EPYC", "git_commit": "abc123", "extra": {"nested": [1, 2.5, None, "x"]}}

    store = open_store()
    run_id = store.create_run("cli", {"workloads": ["seed_mlp"], "modes": ["eager", "graph"]}, environment)
    ids = store.add_result(run_id, expected)
    assert len(ids) == 2
    # Committed immediately: a separate connection sees the rows before the run ends.
    other = create_engine(store.url)
    with other.connect() as con:
        assert con.execute(select(func.count()).select_from(Result).where(Result.run_id == run_id)).scalar_one() == 2
    other.dispose()
    assert store.finish_run(run_id) == "completed"

    run = open_store(migrate=False).run(run_id)  # a fresh store on the same database
    assert (run.trigger, run.status, run.error) == ("cli", "completed", None)
    assert (run.torch_version, run.gpu_name, run.gpu_driver, run.cuda_version, run.git_commit) == (
        "2.11.0", "NVIDIA H200", "580", "13.0", "abc123")
    assert run.environment == environment
    assert run.parameters == {"workloads": ["seed_mlp"], "modes": ["eager", "graph"]}
    assert run.started_at.tzinfo is not None and run.ended_at is not None and run.ended_at >= run.started_at

    by_mode = {r.mode: r for r in run.results}
    assert sorted(by_mode) == ["eager", "graph"] and sorted(r.id for r in run.results) == sorted(ids)
    eager, g = by_mode["eager"], by_mode["graph"]
    exp_eager = expected.mode("eager")
    # float8 round-trips doubles exactly
    assert eager.throughput_s == exp_eager.throughput.value
    assert (eager.throughput_ci_low, eager.throughput_ci_high) == (exp_eager.throughput.ci_low, exp_eager.throughput.ci_high)
    assert g.throughput_s == graph.throughput.value
    assert g.speedup == graph.speedup == pytest.approx(45.0 / 6.5)
    assert (g.speedup_ci_low, g.speedup_ci_high) == (graph.speedup_ci_low, graph.speedup_ci_high)
    assert (g.capture_s, g.first_replay_s, g.break_even_replays) == (0.0123, 0.0004, 330.0)
    assert g.graph_pool_bytes == 3 * 2**31 and isinstance(g.graph_pool_bytes, int)
    assert eager.graph_pool_bytes is None
    assert (g.iters_per_block, eager.iters_per_block, g.throughput_blocks) == (1500, 200, 10)
    assert g.precision_met is True and eager.cpu_core == 3 and eager.host_reference_s == 0.01 and eager.host_disturbed_share == 0.25
    assert eager.launch_overhead_s == pytest.approx(45e-6 - 7.5e-6, rel=0.05)
    # JSON columns
    assert g.params == eager.params == {"batch_size": 1, "dtype": "float32", "width": 128}
    assert g.params_key == eager.params_key
    assert g.flags == ["noisy: cv 4.1%", "thermal"]
    assert eager.flags == []
    assert eager.samples["throughput"] == exp_eager.throughput.blocks
    assert eager.samples["latency"] == exp_eager.latency.blocks
    assert g.samples["gpu"] == graph.gpu.blocks
    assert set(g.samples) == {"throughput", "latency", "gpu", "host_enqueue", "per_process", "kept", "process_values",
                              "speedup_per_process", "host_reference"}
    assert g.samples["per_process"] == {"throughput": [10], "latency": [10], "gpu": [10], "host_enqueue": [10]}
    assert g.samples["kept"]["throughput"] == [True] * 10 and g.samples["process_values"]["gpu"] == [graph.gpu.value]
    assert eager.health["load_average"] == [0.5, 0.25, 0.125] and eager.health["before"] is None


def test_failures_make_the_run_completed_with_failures(open_store):
    store = open_store()
    run_id = store.create_run("adhoc", {})
    store.add_result(run_id, known_result(reason="output 0 differs from eager"))
    assert store.finish_run(run_id) == "completed_with_failures"
    failed = [r for r in store.run(run_id).results if r.status == "failed"]
    assert [(r.mode, r.phase, r.reason) for r in failed] == [("graph", "check", "output 0 differs from eager")]


def test_two_runs_mark_exactly_the_slowed_workload_slower(open_store):
    from replaybench.verdicts import compare_runs

    from .helpers import SLOWED_VERDICTS, two_runs_one_slowed

    store = open_store()
    first, second = two_runs_one_slowed(store, ENV)
    verdicts = {(r["workload"], r["mode"], r["figure"]): r["verdict"] for r in compare_runs(store, first, second)}
    assert verdicts == SLOWED_VERDICTS


def writer(url: str, run_id: int, result, seconds: float, queue, start) -> None:
    store = Store(url, migrate=False)
    stored, errors = 0, []
    start.wait(120)  # all four write at the same time, for the whole window
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            stored += len(store.add_result(run_id, result))
        except Exception as exc:  # counted, and the test fails on any
            errors.append(f"{type(exc).__name__}: {exc}")
    store.engine.dispose()
    queue.put((stored, errors))


@pytest.mark.slow
def test_four_processes_writing_at_once_lose_nothing(open_store, pg_url):
    store = open_store()
    run_id = store.create_run("cli", {})
    ctx = mp.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Barrier(5)
    procs = [ctx.Process(target=writer, args=(pg_url, run_id, known_result(), WRITE_SECONDS, queue, start)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        start.wait(120)
        reports = [queue.get(timeout=WRITE_SECONDS + 60) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert [e for _, errs in reports for e in errs] == []
    assert all(n > 0 for n, _ in reports)
    stored = sum(n for n, _ in reports)
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(Result).where(Result.run_id == run_id)) == stored
        assert s.scalar(select(func.count(func.distinct(Result.id))).where(Result.run_id == run_id)) == stored
    assert len(store.run(run_id).results) == stored


def test_a_run_left_running_by_a_dead_process_is_marked_crashed(open_store):
    store = open_store()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    run_id = store.create_run("nightly", {})
    with store.session.begin() as s:
        s.get(Run, run_id).pid = int(dead.stdout)
    live = store.create_run("adhoc", {})  # this process: alive, must stay running
    store.add_result(run_id, known_result())
    assert store.mark_dead_local_runs() == [run_id]
    run = store.run(run_id)
    assert run.status == "crashed" and "ended before the run finished" in run.error
    assert run.ended_at is not None
    assert len(run.results) == 2  # finished results are intact
    assert store.run(live).status == "running"
    assert store.mark_dead_local_runs() == []  # already marked


def test_an_unreachable_server_is_reported_without_the_password():
    password = "n0t-" + secrets.token_hex(6)
    url = make_url(BASE_URL).set(port=1, password=password).update_query_dict({"connect_timeout": "3"})
    started = time.monotonic()
    with pytest.raises(StoreError, match="cannot reach database") as info:
        Store(url.render_as_string(hide_password=False))
    message = str(info.value)
    assert password not in message and "***" in message
    assert "\n" not in message
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_processes_opening_a_new_database_at_once_all_succeed(open_store, pg_url):
    code = f"from replaybench.storage import Store; Store({pg_url!r}).create_run('cli', {{}})"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e.strip().splitlines()[-1] for e in errors if e.strip()]
    assert len(open_store().runs()) == 4


LINEAR = '''
import torch
from replaybench.workload import Built, Workload


def build(params, device, dtype):
    model = torch.nn.Linear(16, 16).to(device=device, dtype=dtype).eval().requires_grad_(False)
    return Built(fn=model, inputs=(torch.randn(params["batch_size"], 16, device=device, dtype=dtype),))


WORKLOAD = Workload(name={name!r}, description="a linear layer", build=build,
                    grid={{"batch_size": [1], "dtype": ["float32"], "label": [{label!r}]}})
'''


@pytest.mark.slow
def test_a_config_the_database_refuses_is_kept_beside_the_report_and_the_run_goes_on(pg_url, open_store, tmp_path):
    """A grid value that makes the config's key longer than its column (512 characters): PostgreSQL
    refuses the rows with a DataError. The measurement is written as JSON beside the report, the run
    says so, and the next config is measured and stored."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "oversize.py").write_text(LINEAR.format(name="oversize", label="x" * 600))
    (user / "steady.py").write_text(LINEAR.format(name="steady", label="short"))
    env = {**os.environ, "REPLAYBENCH_WORKLOADS_PATH": str(user), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "replaybench.cli", "run", "-w", "oversize", "-w", "steady", "--db", pg_url,
         "--processes", "1", "--time-budget", "0.2", "--confirm-limit", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 1, out.stderr[-3000:]  # completed with failures, not a failed task
    run = open_store(migrate=False).run()
    assert run.status == "completed_with_failures"
    assert {r.workload for r in run.results} == {"steady"}  # measured after the refused config
    (kept,) = (tmp_path / "reports" / f"{run.id}-unstored").iterdir()
    body = json.loads(kept.read_text())
    assert body["run_id"] == run.id and "value too long for type character varying(512)" in body["not_stored"]
    assert body["result"]["workload"] == "oversize" and body["result"]["params"]["label"] == "x" * 600
    eager = next(m for m in body["result"]["modes"] if m["mode"] == "eager")
    assert eager["status"] == "ok" and eager["throughput"]["value"] > 0 and eager["throughput"]["blocks"]
    assert run.error.startswith("oversize(") and "not stored (DataError: value too long" in run.error
    assert f"reports/{run.id}-unstored/{kept.name}" in run.error
    report = (tmp_path / "reports" / f"{run.id}.md").read_text()
    assert "status **completed with failures**" in report and f"reports/{run.id}-unstored/{kept.name}" in report
    assert "## steady" in report


def test_an_ab_result_the_database_refuses_is_kept_as_json_and_noted(open_store, tmp_path):
    from replaybench.ab import ABResult
    from replaybench.unstored import store_result
    from replaybench.workload import BenchConfig

    store = open_store()
    run_id = store.create_run("ab", {})
    a = known_result()
    a.params = {**a.params, "label": "y" * 600}
    config = BenchConfig("seed_mlp", a.params)
    line = store_result(store, run_id, ABResult(config=config, a=a, b=a.model_copy(deep=True)), directory=tmp_path)
    (kept,) = (tmp_path / f"{run_id}-unstored").iterdir()
    assert line.startswith("seed_mlp(") and str(kept) in line and "DataError" in line
    body = json.loads(kept.read_text())
    assert body["kind"] == "ABResult" and body["result"]["a"]["params"]["label"] == "y" * 600
    assert store.run(run_id).results == []
    assert store.finish_run(run_id) == "completed_with_failures" and store.run(run_id).error == line


def test_a_plan_the_database_refuses_is_kept_as_json_and_noted(open_store, tmp_path):
    from replaybench.unstored import store_plan

    store = open_store()
    run_id = store.create_run("plan", {})
    data = {**json.loads(H200_PLAN.read_text()), "workload": "w" * 300}  # longer than the column
    line = store_plan(store, run_id, data, directory=tmp_path)
    (kept,) = (tmp_path / f"{run_id}-unstored").iterdir()
    assert line.startswith("the capture plan of ") and str(kept) in line and "DataError" in line
    body = json.loads(kept.read_text())
    assert body["kind"] == "plan" and body["plan"]["sizes"] == data["sizes"]
    assert store.plan(run_id) is None
    assert store.finish_run(run_id) == "completed_with_failures" and store.run(run_id).error == line


def test_graph_rows_stored_before_the_host_normalised_speedup_get_it_on_upgrade(pg_url, open_store, tmp_path):
    """The H200 default-suite run (benchmarks/data), its rows moved to PostgreSQL at schema 0007:
    opening the store upgrades it, and each graph row gets the host-normalised speedup from the
    units it stored, as the engine computes it."""
    from sqlalchemy import MetaData

    from replaybench.analysis import figures, stored_units
    from replaybench.migrate import upgrade

    copy = tmp_path / "suite.db"
    copy.write_bytes((H200_PLAN.parent / "h200-default-suite-run-3.db").read_bytes())
    source, target = create_engine(f"sqlite:///{copy}"), create_engine(pg_url)
    upgrade(source, "0007")
    upgrade(target, "0007")
    tables = []
    for engine in (source, target):
        meta = MetaData()
        meta.reflect(engine, only=["runs", "results"])
        tables.append(meta.tables)
    with source.connect() as src, target.begin() as dst:
        for name in ("runs", "results"):
            dst.execute(tables[1][name].insert(), [dict(r._mapping) for r in src.execute(tables[0][name].select())])
    source.dispose()
    target.dispose()

    run = open_store().run(1)
    configs: dict = {}
    for r in run.results:
        configs.setdefault((r.workload, r.params_key), {})[r.mode] = r
    assert len(configs) == 19
    for modes in configs.values():
        expected = figures(stored_units(modes), ["eager", "graph"]).normalised_speedup["graph"]
        graph = modes["graph"]
        assert (graph.normalised_speedup, graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high) == \
            pytest.approx((expected.value, expected.ci_low, expected.ci_high))
        assert modes["eager"].normalised_speedup is None
