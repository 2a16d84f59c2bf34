import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from replaybench.storage import Store, StoreError

from .helpers import known_result


def test_round_trip_on_a_real_sqlite_file(db_url, tmp_path):
    store = Store(db_url)
    run_id = store.create_run("cli", {"workloads": ["seed_mlp"]}, {"torch": "2.11.0", "gpu_name": "NVIDIA H200", "python": "3.12"})
    store.add_result(run_id, known_result())
    # Committed immediately: another connection sees the rows before the run ends.
    rows = sqlite3.connect(tmp_path / "replaybench.db").execute(
        "select mode, throughput_s, speedup from results where run_id = ?", (run_id,)
    ).fetchall()
    assert {r[0] for r in rows} == {"eager", "graph"}
    assert store.finish_run(run_id) == "completed"

    run = Store(db_url).run(run_id)  # a fresh store on the same file
    assert (run.trigger, run.status, run.torch_version, run.gpu_name) == ("cli", "completed", "2.11.0", "NVIDIA H200")
    assert run.ended_at is not None and run.parameters == {"workloads": ["seed_mlp"]}
    by_mode = {r.mode: r for r in run.results}
    expected = known_result()
    assert by_mode["eager"].throughput_s == pytest.approx(expected.mode("eager").throughput.value)
    assert by_mode["graph"].speedup == pytest.approx(45.0 / 6.5)
    graph = by_mode["graph"]
    assert (graph.normalised_speedup, graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high) == (7.5, 7.2, 7.9)
    assert by_mode["eager"].normalised_speedup is None
    assert by_mode["graph"].graph_pool_bytes == 3 * 2**20
    assert by_mode["eager"].samples["throughput"] == expected.mode("eager").throughput.blocks
    assert by_mode["eager"].launch_overhead_s == pytest.approx(45e-6 - 7.5e-6, rel=0.05)
    assert by_mode["graph"].params == {"batch_size": 1, "dtype": "float32", "width": 128}


def test_failures_make_the_run_completed_with_failures(db_url):
    store = Store(db_url)
    run_id = store.create_run("adhoc", {})
    store.add_result(run_id, known_result(reason="output 0 differs from eager"))
    assert store.finish_run(run_id) == "completed_with_failures"


def test_schema_is_at_the_newest_migration(db_url, tmp_path):
    Store(db_url)
    con = sqlite3.connect(tmp_path / "replaybench.db")
    assert con.execute("select version_num from alembic_version").fetchone() == ("0009",)
    assert con.execute("pragma journal_mode").fetchone() == ("wal",)
    assert {"runs", "results"} <= set(inspect(Store(db_url).engine).get_table_names())


def test_a_run_marked_crashed_keeps_its_finished_results(db_url):
    """Which runs are stuck is decided from their Prefect flow runs' states (flows.benchmark,
    tests/test_orchestration.py); the store marks them and keeps what they finished."""
    store = Store(db_url)
    stuck = store.create_run("nightly", {})
    live = store.create_run("adhoc", {})
    store.add_result(stuck, known_result())
    assert [r.id for r in store.running_runs()] == [stuck, live]
    store.mark_crashed(stuck, "its flow run ended CRASHED before the run finished")
    run = store.run(stuck)
    assert run.status == "crashed" and "CRASHED" in run.error and run.ended_at is not None
    assert len(run.results) == 2  # finished results are intact
    store.finish_run(live)
    store.mark_crashed(live, "too late")  # a finished run is never marked
    assert store.run(live).status == "completed" and [r.id for r in store.running_runs()] == []


@pytest.mark.parametrize(
    "url, message",
    [
        ("not a url", "malformed database URL"),
        ("sqlite:////no/such/dir/x.db", "directory /no/such/dir does not exist"),
        ("nosuchdialect://x/y", "cannot use database URL"),
        # Each of the run's connections would open an empty database of its own: its results lost.
        ("sqlite://", "names an in-memory SQLite database"),
        ("sqlite:///:memory:", "names an in-memory SQLite database"),
        ("sqlite:///file:x?mode=memory&uri=true", "names an in-memory SQLite database"),
        ("sqlite:///file::memory:?cache=shared&uri=true", "names an in-memory SQLite database"),
    ],
)
def test_bad_database_urls_fail_with_one_clear_line(url, message):
    with pytest.raises(StoreError, match=message) as info:
        Store(url)
    assert "\n" not in str(info.value)


def test_unreachable_postgres_is_reported(monkeypatch):
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError, match="cannot reach database"):
        Store("postgresql+psycopg://user:secret@127.0.0.1:9/none?connect_timeout=2")


def test_url_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("REPLAYBENCH_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    Store()
    assert os.path.exists(tmp_path / "env.db")


def test_a_locked_database_is_retried_until_the_lock_clears(db_url, tmp_path):
    import threading
    import time

    store = Store(db_url, busy_timeout_s=0.1, retry_s=30)
    run_id = store.create_run("cli", {})
    locker = sqlite3.connect(tmp_path / "replaybench.db", isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")
    threading.Timer(2.0, locker.rollback).start()
    started = time.monotonic()
    ids = store.add_result(run_id, known_result())
    assert time.monotonic() - started >= 1.5  # it waited for the lock, well past its busy timeout
    assert len(ids) == 2 and len(store.run(run_id).results) == 2


def test_a_lock_that_never_clears_fails_after_the_retry_window(db_url, tmp_path):
    from sqlalchemy.exc import OperationalError

    store = Store(db_url, busy_timeout_s=0.05, retry_s=0.5)
    run_id = store.create_run("cli", {})
    locker = sqlite3.connect(tmp_path / "replaybench.db", isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(OperationalError, match="locked"):
        store.add_result(run_id, known_result())
    locker.rollback()


def test_processes_opening_a_new_database_at_once_all_succeed(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    code = f"from replaybench.storage import Store; Store({url!r}).create_run('cli', {{}})"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert len(Store(url).runs()) == 4


def test_a_database_of_the_first_schema_holding_data_upgrades_without_loss(tmp_path):
    from sqlalchemy import create_engine, text

    from replaybench.migrate import upgrade
    from replaybench.report import write_report

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    upgrade(engine, "0001")
    with engine.begin() as c:
        c.execute(text(
            "insert into runs (id, started_at, trigger, status, environment, parameters, torch_version) "
            "values (7, '2026-11-30 02:00:00', 'nightly', 'completed', '{\"torch\": \"2.10.0\"}', '{}', '2.10.0')"
        ))
        c.execute(
            text(
                "insert into results (run_id, measured_at, workload, params, params_key, mode, status, attempts, "
                "throughput_s, speedup, host_calibration_s, flags, health, samples) values (7, '2026-11-30 02:01:00', "
                "'seed_mlp', :params, :key, 'graph', 'ok', 1, 6.5e-06, 6.9, 0.012, '[]', '{}', :samples)"
            ),
            {"params": '{"batch_size": 1, "dtype": "float32", "width": 128}', "key": '{"batch_size":1,"dtype":"float32","width":128}',
             "samples": '{"throughput": [6.4e-06, 6.6e-06]}'},
        )
    assert "gpu" not in {c["name"] for c in inspect(engine).get_columns("results")}
    store = Store(url)  # opening upgrades in place
    con = sqlite3.connect(tmp_path / "old.db")
    assert con.execute("select version_num from alembic_version").fetchone() == ("0009",)
    indexes = {i["name"]: i["column_names"] for i in inspect(store.engine).get_indexes("results")}
    assert indexes == {"ix_results_run_id": ["run_id"], "ix_results_history": ["workload", "params_key", "mode", "run_id"]}
    run = store.run(7)
    assert (run.trigger, run.status, run.torch_version, run.environment) == ("nightly", "completed", "2.10.0", {"torch": "2.10.0"})
    (result,) = run.results
    assert (result.workload, result.mode, result.throughput_s, result.speedup) == ("seed_mlp", "graph", 6.5e-06, 6.9)
    assert result.samples == {"throughput": [6.4e-06, 6.6e-06]} and result.gpu is None
    # host_calibration_s became host_reference_s with its value; the newer figures are empty.
    assert result.host_reference_s == 0.012 and result.host_disturbed_share is None and result.host_normalised is None
    assert result.verdict is None  # finished before verdicts were stored: its report judges it
    _, text = write_report(store, 7, tmp_path / "reports")
    assert "**0 slower**" in text and "1 new." in text
    new_id = store.create_run("cli", {}, {"torch": "2.10.0"})
    store.add_result(new_id, known_result(), gpu="vm GPU 0")
    assert {r.gpu for r in store.run(new_id).results} == {"vm GPU 0"}
    store.finish_run(new_id)
    from replaybench.verdicts import store_verdicts

    store_verdicts(store, new_id)  # the old run's row is its graph history (nightly, no GPU either)
    verdicts = {r.mode: r.verdict for r in store.run(new_id).results}
    assert verdicts == {"eager": "NEW", "graph": "UNCERTAIN"}  # one earlier night: too short a history


def test_a_store_of_the_previous_schema_gets_its_figures_at_standard_host_speed_computed_again_on_upgrade(tmp_path):
    """An H100 default-suite run stored at schema 0008, whose eager over the host reference and
    host-normalised speedups divided eager by the reference outright: opening it upgrades it, every
    eager row gets eager at standard host speed and every graph row its host-normalised speedup
    computed again from the units it stored, as the engine computes them now, so that old and new
    nights compare; an acknowledged eager regression keeps its acknowledgement under the new name,
    and the open regressions stored with the run are dropped (reports compute them again).
    Downgrading gives back the figures the engine stored then."""
    from pathlib import Path

    from alembic import command

    from replaybench.analysis import figures, stored_units
    from replaybench.migrate import alembic_config
    from replaybench.verdicts import EAGER

    copy = tmp_path / "suite.db"
    copy.write_bytes((Path(__file__).resolve().parent.parent / "benchmarks/data/h100-default-suite-run-5.db").read_bytes())
    con = sqlite3.connect(copy)
    assert con.execute("select version_num from alembic_version").fetchone() == ("0008",)
    query = "select params_key || workload, mode, coalesce(normalised_speedup, host_normalised) from results"
    before = {(key, mode): value for key, mode, value in con.execute(query)}
    con.execute("insert into acknowledgements (workload, params_key, mode, metric, first_run_id, acknowledged_at) "
                "values ('seed_mlp', '{}', 'eager', 'eager over the host reference', 1, '2026-12-07 00:00:00')")
    con.execute("""update runs set open_regressions = '[{"metric": "eager over the host reference"}]'""")
    con.commit()
    con.close()
    assert len(before) == 38 and all(before.values())

    store = Store(f"sqlite:///{copy}")
    run = store.run(1)
    assert run.open_regressions is None
    configs: dict = {}
    for r in run.results:
        configs.setdefault(r.params_key + r.workload, {})[r.mode] = r
    moved = []
    for key, modes in configs.items():
        found = figures(stored_units(modes), ["eager", "graph"])
        expected = found.normalised_speedup["graph"]
        graph, eager = modes["graph"], modes["eager"]
        assert (graph.normalised_speedup, graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high) == \
            pytest.approx((expected.value, expected.ci_low, expected.ci_high))
        assert (eager.host_normalised, eager.host_normalised_ci_low, eager.host_normalised_ci_high) == \
            pytest.approx((found.normalised.value, found.normalised.ci_low, found.normalised.ci_high))
        assert eager.normalised_speedup is None and graph.host_normalised is None
        # a time per call now, near eager's own (reference blocks of 0.24-0.60 ms against the standard 0.4 ms)
        assert 0.5 < eager.host_normalised / eager.throughput_s < 2
        moved.append(abs(graph.normalised_speedup / before[key, "graph"] - 1))
    assert min(moved) > 0.01  # each was stored by the old definition, and is not any more
    con = sqlite3.connect(copy)
    assert con.execute("select metric from acknowledgements").fetchall() == [(EAGER.name,)]
    con.close()

    command.downgrade(alembic_config(store.engine), "0008")
    store.engine.dispose()
    con = sqlite3.connect(copy)
    after = {(key, mode): value for key, mode, value in con.execute(query)}
    assert after.keys() == before.keys()
    assert all(after[k] == pytest.approx(before[k], rel=1e-9) for k in before)
    assert con.execute("select metric from acknowledgements").fetchall() == [("eager over the host reference",)]


def test_a_downgrade_and_upgrade_of_a_real_store_keep_every_result(tmp_path):
    """Downgrading past migration 0005 recreates `runs` by copying it (SQLite's batch mode): with
    foreign keys on, dropping the old table cascaded to every result (38 of 38 lost on this store)."""
    from alembic import command

    from replaybench.migrate import alembic_config

    copy = tmp_path / "run.db"
    copy.write_bytes((Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h100-default-suite-run-5.db").read_bytes())
    store = Store(f"sqlite:///{copy}")
    before = len(store.run(1).results)
    assert before == 38
    command.downgrade(alembic_config(store.engine), "0004")
    with store.engine.connect() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM results").scalar() == before
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # on again for the store's own use
    store.migrate()
    assert len(store.run(1).results) == before


def test_opening_a_store_at_its_head_revision_takes_no_write_lock(tmp_path):
    """Only a migration takes SQLite's write lock: `runs`, `report` or a flow opening a store while a
    measuring process writes to it neither waits for it nor fails."""
    path = tmp_path / "r.db"
    Store(f"sqlite:///{path}").create_run("cli", {})
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process, mid-write
    try:
        store = Store(f"sqlite:///{path}", busy_timeout_s=0.5)
        assert len(store.runs()) == 1
    finally:
        writer.execute("ROLLBACK")
        writer.close()
