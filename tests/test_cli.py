"""The replaybench command as a user runs it (subprocesses, real files)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaybench.storage import Store

from .helpers import children, kill_all, kill_tree, known_result, outliving


def replaybench(*args, cwd, env=None):
    return subprocess.run(
        [sys.executable, "-m", "replaybench.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["-w", "nope"], "unknown workload 'nope'; known workloads: "),
        (["-b", "0"], "replaybench: error: argument -b/--batch-size: Input should be greater than or equal to 1 (got 0)"),
        (["-b", "-5"], "greater than or equal to 1"),
        (["--dtype", "float8"], "argument --dtype: Input should be 'float32', "),
        (["--mode", "warp"], "argument --mode: "),
        (["--time-budget", "0"], "argument --time-budget: Input should be greater than 0"),
        (["--time-budget", "nan"], "argument --time-budget: Input should be a finite number (got nan)"),
        (["--time-budget", "700"], "argument --time-budget: Input should be less than or equal to 600 (got 700.0)"),
        (["--set", "colour=red"], "unknown parameter(s) colour"),
        (["--db", "sqlite:////no/such/dir/r.db"], "directory /no/such/dir does not exist"),
        (["--db", "::nonsense::"], "malformed database URL"),
        (["--reports", "a_file/reports"], "report directory 'a_file/reports' is not writable"),
        (["--reports", "/proc/reports"], "report directory '/proc/reports' is not writable"),  # even for root
        (["--templates", "no_such_dir"], "template directory 'no_such_dir' does not exist"),
        (["--templates", "a_file"], "template directory 'a_file' is not a directory"),
        (["--templates", "broken"], "template broken/ab.md.j2, line 1: unexpected end of template"),  # before measuring
        (["--set", "width=abc"], "seed_mlp: width='abc' is not one of its values (128, 512)"),
        (["--set", "width=512", "--set", "width=128"], "argument --set: width is given twice; give it once"),
        (["--templates", "latin1"], "template latin1/report.md.j2: not UTF-8 text"),  # the directory named, as above
        (["-w", "rnn_unrolled", "--set", "steps=10000000"], "rnn_unrolled: steps=10000000 is not one of its values"),
        (["--db", "postgres ql://u:pw@h/x"], "malformed database URL 'postgres ql://u:***@h/x'"),
        (["--db", "postgresql://u:pw@127.0.0.1:notaport/x"], "malformed database URL 'postgresql://u:***@127.0.0.1"),
        (["--full-grid"], "the selection holds 381 configs, more than the 100 a run may measure"),
        (["-b", "1", "--set", "batch_size=8"], "batch_size is given twice (as batch_sizes and in sizes; on the command line, -b and --set)"),
        (["--time-budget", "40"], "the selection's time budget, 19 configs x 40 s of timed rounds = 760 s, is more than "
                                  "the 600 s a run may measure ($REPLAYBENCH_MAX_RUN_S, set where the runs are measured)"),
    ],
)
def test_bad_input_one_line_nonzero_exit_nothing_written(tmp_path, args, message):
    (tmp_path / "a_file").write_text("not a directory")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "ab.md.j2").write_text("# A/B run {{ run.id \n")
    (tmp_path / "latin1").mkdir()
    (tmp_path / "latin1" / "report.md.j2").write_bytes("# run {{ run.id }} \xe9t\xe9\n".encode("latin-1"))
    out = replaybench("run", *args, cwd=tmp_path, env={"REPLAYBENCH_MAX_CONFIGS": "100", "REPLAYBENCH_MAX_RUN_S": "600"})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert ":pw@" not in out.stderr  # no password in any message
    assert not (tmp_path / "replaybench.db").exists()
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["serve", "--cron", "garbage"], {}, 'argument --cron (or $REPLAYBENCH_NIGHTLY_CRON): Invalid cron string: "garbage"'),
        (["serve"], {"REPLAYBENCH_NIGHTLY_CRON": "0 2 * *"}, "argument --cron (or $REPLAYBENCH_NIGHTLY_CRON): Invalid cron string"),
        (["serve", "--timezone", "Mars/Base"], {}, 'argument --timezone (or $REPLAYBENCH_TIMEZONE): Invalid timezone: "Mars/Base"'),
        (["serve", "--gpu", "0/1"], {}, "argument --gpu: expected a GPU index or label without spaces, '/',"),
        (["serve"], {"CUDA_VISIBLE_DEVICES": "0 1"}, "argument --gpu: expected a GPU index or label"),  # the default, from there
        (["setup", "--pool", ""], {}, "argument --pool: expected a work pool name without '/', '%', '&', '<' or '>', got ''"),
        (["setup", "--pool", " "], {}, "argument --pool: expected a work pool name"),
        (["setup", "--pool", "a/b"], {}, "argument --pool: expected a work pool name"),
        (["setup", "--gpus", "0,x y"], {}, "argument --gpus: expected a GPU index such as 0, got 'x y'"),
        (["worker", "--gpu", ""], {}, "argument --gpu: expected a GPU index such as 0, got ''"),
        (["worker", "--gpu", "0", "--device", ""], {}, "argument --device: expected CUDA_VISIBLE_DEVICES"),  # would hide every GPU
        (["alerts", "--webhook", "https://hooks.example.com/x", "--name", "a/b"], {}, "argument --name: expected a name of lowercase"),
        (["alerts", "--webhook", "http://[::1"], {}, "argument --webhook: not an http(s) URL: 'http://[::1'"),
        (["alerts", "--webhook", "http://hooks.example.com:port/x"], {}, "argument --webhook: not an http(s) URL"),
        # Prefect would accept these and then refuse to post each alert, on the server, unseen.
        (["alerts", "--webhook", "http://127.0.0.1:4999/hook"], {},
         "resolves to the private address 127.0.0.1. Prefect posts to it only with --allow-private-url"),
        (["alerts", "--webhook", "http://10.1.2.3/hook"], {}, "resolves to the private address 10.1.2.3"),
    ],
)
def test_operator_options_are_refused_in_one_line_before_the_server_is_called(tmp_path, args, env, message):
    """serve, setup, worker and alerts check what they would hand the Prefect server. The server named
    here does not answer: a check that let a value through would end in another error."""
    out = replaybench(*args, cwd=tmp_path, env={"PREFECT_API_URL": "http://127.0.0.1:9/api", **env})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []  # no store, no report directory


def test_a_prefect_server_that_does_not_answer_is_one_line(tmp_path):
    out = replaybench("setup", "--pool", "My GPUs", cwd=tmp_path, env={"PREFECT_API_URL": "http://user:secret@127.0.0.1:9/api"})
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("replaybench: error: cannot reach the Prefect server http://user:***@127.0.0.1:9/api: ")


@pytest.mark.slow
def test_an_unwritable_report_directory_is_one_line_and_starts_nothing_on_the_server(tmp_path):
    """Each command that writes reports refuses a report directory it cannot write in, before it
    opens the store or calls the Prefect server: no flow run, deployment, work pool or limit."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from .prefect_server import prefect_server

    home, work = tmp_path / "prefect", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "a_file").write_text("not a directory")
    (work / "variants.toml").write_text("[variants.a]\n[variants.b]\n")
    commands = [["run", "-w", "seed_mlp"], ["ab", "a", "b", "-w", "seed_mlp"], ["serve"], ["worker", "--gpu", "0"], ["report"]]
    with prefect_server(home) as api:
        env = {"PREFECT_API_URL": api, "PREFECT_HOME": str(home)}
        for command in commands:
            out = replaybench(*command, "--reports", "a_file/reports", cwd=work, env=env)
            assert out.returncode == 2, (command, out.stderr[-3000:])
            assert out.stderr.count("\n") == 1 and out.stderr.startswith(
                "replaybench: error: report directory 'a_file/reports' is not writable"), (command, out.stderr[-3000:])
        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            assert client.read_flow_runs() == []
            assert client.read_deployments() == []
            assert client.read_work_pools() == []
            assert client.read_global_concurrency_limits() == []
    assert sorted(p.name for p in work.iterdir()) == ["a_file", "variants.toml"]  # no database, no reports


@pytest.mark.parametrize("command", [["run"], ["ab", "a", "b"]])
@pytest.mark.parametrize("cap, message", [
    ("10", "the selection's time budget, 1 config x 12 s of timed rounds = 12 s, is more than the 10 s a run may measure"),
    ("soon", "$REPLAYBENCH_MAX_RUN_S must be a positive number of seconds, not 'soon'"),
])
def test_a_run_whose_budget_passes_the_measuring_time_cap_is_refused_before_it_starts(tmp_path, command, cap, message):
    (tmp_path / "variants.toml").write_text("[variants.a]\n[variants.b]\n")
    out = replaybench(*command, "-w", "seed_mlp", "--time-budget", "12", cwd=tmp_path, env={"REPLAYBENCH_MAX_RUN_S": cap})
    assert out.returncode == 2
    assert out.stderr == f"replaybench: error: {message}" + ("" if message.endswith("'soon'") else
                                                             " ($REPLAYBENCH_MAX_RUN_S, set where the runs are measured)") + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variants.toml"]


@pytest.mark.parametrize("variable, value, message", [
    ("REPLAYBENCH_GPU_LEASE_S", "30", "$REPLAYBENCH_GPU_LEASE_S must be a number of seconds, at least 60 (the shortest lease a "
                                      "Prefect server grants), not '30'"),
    ("REPLAYBENCH_MAX_RUN_S", "0", "$REPLAYBENCH_MAX_RUN_S must be a positive number of seconds, not '0'"),
    ("REPLAYBENCH_MAX_CONFIGS", "-1", "$REPLAYBENCH_MAX_CONFIGS must be a whole number of at least 1, not '-1'"),
])
@pytest.mark.parametrize("command", [["worker", "--gpu", "0"], ["serve"]])
def test_a_worker_or_serve_with_a_bad_operator_setting_does_not_start(tmp_path, command, variable, value, message):
    out = replaybench(*command, cwd=tmp_path, env={variable: value})
    assert out.returncode == 2 and out.stderr == f"replaybench: error: {message}\n"
    assert list(tmp_path.iterdir()) == []


SLOW_BUILD = '''
"""A small MLP that takes a second to build: each config measures for a second or more."""
import time

import torch
from replaybench.workload import Built, Workload


def build(params, device, dtype):
    time.sleep(1.0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).to(device=device, dtype=dtype).eval()
    return Built(fn=model.requires_grad_(False), inputs=(torch.randn(params["batch_size"], 32, device=device, dtype=dtype),))


WORKLOAD = Workload(name="slow_build", description="a small MLP, slow to build", build=build,
                    grid={"batch_size": [1, 2, 3, 4, 5], "dtype": ["float32"]})
'''


@pytest.mark.slow
@pytest.mark.parametrize("command", [["run", "--processes", "1"], ["ab", "a", "b", "--variants", "variants.toml", "--processes", "2"]])
def test_a_run_that_reaches_the_measuring_time_cap_stops_and_keeps_what_it_measured(tmp_path, command):
    """Five configs of a second or more each (a second per measuring process: four of them in the
    A/B run), 0.1 s of timed rounds each (0.5 s in all, within the cap), and a cap of 2.5 s: the run
    stops after one to three configs, stored failed with what it measured and why, and says so in
    its report and on the terminal."""
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "slow_build.py").write_text(SLOW_BUILD)
    (tmp_path / "variants.toml").write_text("[variants.a]\n[variants.b]\n")
    out = replaybench(*command, "-w", "slow_build", "--time-budget", "0.1", cwd=tmp_path,
                      env={"REPLAYBENCH_WORKLOADS_PATH": str(tmp_path / "user"), "REPLAYBENCH_MAX_RUN_S": "2.5"})
    assert out.returncode == 1, out.stderr[-3000:]
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    kept = len({r.params_key for r in run.results})
    assert run.status == "failed" and 1 <= kept <= 3, (run.status, kept, run.error)
    assert run.error.startswith("measuring-time cap reached: the run measured for ")
    assert run.error.endswith(f"its cap is 2.5 s ($REPLAYBENCH_MAX_RUN_S); {5 - kept} config(s) not measured")
    assert all(r.status == "ok" for r in run.results if r.mode == "eager")
    report = (tmp_path / "reports" / f"{run.id}.md").read_text()
    assert "status **failed**" in report and f"Run error: {run.error}" in report
    assert f"run {run.id}: {run.error}" in out.stderr


@pytest.mark.parametrize("command", [["report"], ["runs"], ["compare", "1", "2"], ["regressions"], ["ack", "1:GPU_time"]])
def test_a_command_that_only_reads_leaves_no_database_behind(tmp_path, command):
    out = replaybench(*command, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        "replaybench: error: no run stored yet: there is no database 'replaybench.db' (--db or $REPLAYBENCH_DB_URL names another)\n")
    assert list(tmp_path.iterdir()) == []


def test_report_prints_a_stored_run(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    run_id = store.create_run("nightly", {})
    store.add_result(run_id, known_result())
    store.finish_run(run_id)
    out = replaybench("report", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"# replaybench run {run_id}")
    assert out.stdout == (tmp_path / "reports" / "latest.md").read_text()
    missing = replaybench("report", "99", cwd=tmp_path)
    assert missing.returncode == 2 and "no run with id 99" in missing.stderr
    newer = store.create_run("nightly", {})
    store.finish_run(newer)
    assert replaybench("report", cwd=tmp_path).returncode == 0
    again = replaybench("report", str(run_id), cwd=tmp_path)  # an older run, printed again
    assert again.returncode == 0 and again.stdout.startswith(f"# replaybench run {run_id}")
    assert (tmp_path / "reports" / f"{run_id}.md").read_text() == again.stdout
    assert (tmp_path / "reports" / "latest.md").read_text().startswith(f"# replaybench run {newer}")
    long_nightly = store.create_run("nightly", {})  # still measuring when a newer run is stopped
    stopped = store.create_run("adhoc", {})
    store.finish_run(stopped, interrupted="SIGINT")  # ended without a report
    store.add_result(long_nightly, known_result())
    store.finish_run(long_nightly)
    assert replaybench("report", str(long_nightly), cwd=tmp_path).returncode == 0
    assert (tmp_path / "reports" / "latest.md").read_text().startswith(f"# replaybench run {long_nightly}")


def test_a_template_that_fails_is_one_line_naming_it(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    run_id = store.create_run("nightly", {})
    store.add_result(run_id, known_result())
    store.finish_run(run_id)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md.j2").write_text("run {{ run.id }}\n{{ nosuch.attr }}\n")
    out = replaybench("report", "--templates", "mine", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"replaybench: error: template {Path('mine') / 'report.md.j2'}, line 2: 'nosuch' is undefined\n")
    # Its plots were drawn before it failed, and are not left behind without a report; nor is the
    # report directory it made.
    assert not (tmp_path / "reports").exists()
    good = replaybench("report", cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    plot = tmp_path / "reports" / f"{run_id}-speedup-vs-batch.png"
    assert plot.exists() and (tmp_path / "reports" / f"{run_id}.md").exists()
    plot.unlink()  # a failing render must not draw it again
    kept = {p.name: p.read_bytes() for p in (tmp_path / "reports").iterdir()}
    # A staging directory a killed writer left an hour ago goes; one in use now stays.
    for name, age in ((".plots-killed", 7200), (".plots-busy", 0)):
        (tmp_path / "reports" / name).mkdir()
        os.utime(tmp_path / "reports" / name, (time.time() - age,) * 2)
    (mine / "report.md.j2").write_text("run {{ run.id }}\n{{ run.id / 0 }}\n")  # no template error: Python's
    out = replaybench("report", "--templates", "mine", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"replaybench: error: template {Path('mine') / 'report.md.j2'}, line 2: ZeroDivisionError: division by zero\n")
    (tmp_path / "reports" / ".plots-busy").rmdir()
    assert {p.name: p.read_bytes() for p in (tmp_path / "reports").iterdir()} == kept  # the good report, as it was
    out = replaybench("report", "--templates", "mine", "--reports", "new/reports", cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "new").exists()  # no directory left of its own
    # A template it includes fails: that file and its line are named, whatever the error.
    (mine / "report.md.j2").write_text('run {{ run.id }}\n{% include "part.j2" %}\n')
    for body, why in (("{{ 1 + }}", "unexpected 'end of print statement'"), ("{{ nope.x }}", "'nope' is undefined"),
                      ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero")):
        (mine / "part.j2").write_text(f"a\nb\n{body}\n")
        out = replaybench("report", "--templates", "mine", cwd=tmp_path)
        assert out.returncode == 2 and out.stderr == f"replaybench: error: template {Path('mine') / 'part.j2'}, line 3: {why}\n"
    (mine / "report.md.j2").write_bytes(b"run \xff\n")  # not text: refused before anything is rendered
    out = replaybench("report", "--templates", "mine", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"replaybench: error: template {Path('mine') / 'report.md.j2'}: not UTF-8 text (invalid start byte at byte 4)\n")


def test_runs_lists_the_newest_and_ids_limits_and_urls_the_store_cannot_take_are_refused(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    ids = [store.create_run("cli", {}) for _ in range(3)]
    out = replaybench("runs", "--limit", "2", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [r["id"] for r in json.loads(out.stdout)] == ids[:0:-1]
    huge = "9" * 23  # past SQLite's 64-bit integers: an overflow in the store, were it let through
    for args, argument, message in (
            (["runs", "--limit", "-3"], "--limit", "expected 1 to 9223372036854775807, got -3"),
            (["runs", "--limit", "0"], "--limit", "expected 1 to 9223372036854775807, got 0"),
            (["runs", "--limit", "two"], "--limit", "expected a whole number, got 'two'"),
            (["runs", "--limit", huge], "--limit", f"got {huge}"),
            (["report", huge], "RUN", f"got {huge}"),
            (["report", "1", "--baseline", huge], "--baseline", f"got {huge}"),
            (["compare", huge, "1"], "A", f"got {huge}"),
            (["compare", "1", "0"], "B", "got 0"),
            (["runs", "--db", ""], "--db", "expected a value, got an empty one"),
            (["report", "--reports", " "], "--reports", "expected a value, got an empty one"),
            (["run", "--templates", ""], "--templates", "expected a value, got an empty one"),
            (["ab", "a", "b", "--variants", ""], "--variants", "expected a value, got an empty one"),
            (["plan", "--traffic-file", " "], "--traffic-file", "expected a value, got an empty one"),
            (["run", "-b", "abc"], "-b/--batch-size", "invalid int value: 'abc'")):
        refused = replaybench(*args, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        # One line naming the command and the argument, as every other refusal: no usage block.
        assert refused.stderr.startswith(f"replaybench {args[0]}: error: argument {argument}: "), refused.stderr
        assert refused.stderr.endswith(f"{message}\n") and refused.stderr.count("\n") == 1, refused.stderr
    bare = replaybench(cwd=tmp_path)
    assert bare.returncode == 2 and bare.stderr.startswith("usage: replaybench") and "measure workloads" in bare.stderr
    assert [r.id for r in Store(f"sqlite:///{tmp_path / 'replaybench.db'}").runs()] == ids[::-1]  # nothing started


def test_a_database_of_another_application_is_refused_and_gets_no_table(tmp_path):
    import sqlite3

    foreign, newer = tmp_path / "foreign.db", tmp_path / "newer.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE t (x INTEGER)")
    with sqlite3.connect(newer) as db:  # another application's alembic, or a newer replaybench's schema
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES ('a1b2c3')")
    def schema(path):
        with sqlite3.connect(path) as db:
            return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()

    for path, why in ((foreign, "it holds tables that are not a replaybench store's (t)"),
                      (newer, "its schema is at revision a1b2c3, which is not replaybench's")):
        before = schema(path)
        for args in (["runs"], ["report", "1"], ["regressions"], ["run", "-w", "seed_mlp"]):
            out = replaybench(*args, "--db", f"sqlite:///{path}", cwd=tmp_path)
            assert out.returncode == 2 and out.stderr.count("\n") == 1, (args, out.stderr)
            assert f"not a replaybench database 'sqlite:///{path}': {why}" in out.stderr, out.stderr
            assert schema(path) == before, args  # no table added, nothing migrated
    assert not (tmp_path / "reports").exists()


def test_runs_without_configs_to_judge_are_refused_by_compare_and_baseline(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    nightly = store.create_run("nightly", {})
    store.add_result(nightly, known_result())
    store.finish_run(nightly)
    plan, other_plan, ab = store.create_run("plan", {}), store.create_run("plan", {}), store.create_run("ab", {})
    for args, message in ((["compare", str(plan), str(other_plan)], f"run {plan} is a capture plan: its report is "
                                                                     f"replaybench report {plan}"),
                          (["compare", str(nightly), str(plan)], f"run {plan} is a capture plan"),
                          (["compare", str(plan)], f"run {plan} is a capture plan: its report is replaybench report {plan}"),
                          (["report", str(nightly), "--baseline", str(ab)], f"run {ab} is an A/B run: --baseline judges"),
                          (["report", str(plan), "--baseline", str(nightly)], f"run {plan} is a capture plan: --baseline")):
        out = replaybench(*args, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.startswith(f"replaybench: error: {message}"), (args, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stdout == ""
    assert not (tmp_path / "reports").exists()


def test_workloads_lists_the_registry(tmp_path):
    out = replaybench("workloads", cwd=tmp_path, env={"COLUMNS": "200"})
    assert out.returncode == 0 and "seed_mlp" in out.stdout
    assert "depth: 2, 8, 32, 64" in out.stdout  # the values --set takes
    piped = replaybench("workloads", cwd=tmp_path, env={"COLUMNS": ""})  # into a pipe, no width set: nothing cut
    assert "transformer_encoder" in piped.stdout and "…" not in piped.stdout
    assert "Linear(128,128)+ReLU repeated `depth` times" in piped.stdout


@pytest.mark.slow
def test_run_end_to_end_writes_a_report_and_the_database(tmp_path):
    out = replaybench("run", "-w", "seed_mlp", "--time-budget", "0.3", "--mode", "graph", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert {r.mode for r in run.results} == {"eager", "graph"}  # eager, the reference, is always measured...
    assert "measuring 1 config(s), modes: eager, graph" in out.stderr  # ...and the start line says so
    assert f"run {run.id} completed: report reports/{run.id}.md" in out.stdout
    report = Path(tmp_path / "reports" / "latest.md").read_text()
    eager = next(r for r in run.results if r.mode == "eager")
    assert f"| {eager.throughput_s * 1e6:.1f} [" in report
    if eager.device == "cpu":
        assert "| seed_mlp | batch_size=1, dtype=float32, width=128 | CUDA graph replay | no CUDA device |" in report
    out = replaybench("runs", cwd=tmp_path)
    assert out.returncode == 0 and "completed" in out.stdout


def test_a_template_that_fails_only_on_the_measured_data_keeps_the_run_and_says_how_to_report_it(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()  # parses, so the run starts; fails on the first result's data, after measuring
    (mine / "report.md.j2").write_text("run {{ run.id }}\n{{ run.results[0].nosuch.attr }}\n")
    out = replaybench("run", "-w", "seed_mlp", "--time-budget", "0.3", "--processes", "1", "--templates", "mine",
                      cwd=tmp_path)
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert out.returncode == 2 and out.stderr.splitlines()[-1] == (
        f"replaybench: error: template {Path('mine') / 'report.md.j2'}, line 2: 'replaybench.storage.Result object' "
        f"has no attribute 'nosuch'; run {run.id} is stored (completed): `replaybench report {run.id}` writes its "
        "report once that is mended"), out.stderr[-3000:]
    assert run.status == "completed" and run.results
    assert not (tmp_path / "reports" / f"{run.id}.md").exists()
    out = replaybench("report", str(run.id), cwd=tmp_path)
    assert out.returncode == 0 and (tmp_path / "reports" / f"{run.id}.md").exists(), out.stderr[-3000:]


@pytest.mark.slow
def test_a_killed_run_is_marked_crashed_at_the_next_start_with_finished_results_intact(tmp_path):
    import time

    proc = subprocess.Popen(
        # A target no interval meets: each config takes its whole budget, and the kill lands in the second.
        [sys.executable, "-m", "replaybench.cli", "run", "-w", "seed_mlp", "--set", "width=128,512",
         "--processes", "1", "--time-budget", "20", "--precision", "0.001"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    db = tmp_path / "replaybench.db"
    deadline = time.monotonic() + 300
    left: set[int] = set()
    try:
        while time.monotonic() < deadline:  # until the first config's results are committed
            if db.exists():
                try:
                    if Store(f"sqlite:///{db}").run().results:
                        break
                except Exception:
                    pass
            time.sleep(0.5)
        else:
            pytest.fail("no result was stored within 300 s")
        # Killed outright, as the OOM killer would: the process alone, not its group. Its Prefect
        # server (a session of its own) must end with it, and so must a measuring process it has
        # at that moment (that one ends by itself: test_worker.py holds it to that more closely).
        left = children(proc.pid)
        assert left, "the run started neither its Prefect server nor a measuring process"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not outliving(left, within_s=15), "a process of the killed run outlived it"
    finally:
        kill_tree(proc.pid)  # whatever is left of it, should the test fail
        proc.wait()
        kill_all(left)
    out = replaybench("runs", cwd=tmp_path)
    assert out.returncode == 0 and "crashed" in out.stdout
    run = Store(f"sqlite:///{db}").run()
    assert run.status == "crashed" and "ended before the run finished" in run.error
    assert {(r.params["width"], r.mode) for r in run.results} == {(128, "eager"), (128, "graph")}
    assert next(r for r in run.results if r.mode == "eager").throughput_s > 0


def test_compare_and_runs_for_people_and_scripts(tmp_path):
    import json

    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    env = {"torch": "2.11.0", "gpu_name": "NVIDIA H200"}
    a = store.create_run("nightly", {}, env)
    store.add_result(a, known_result(eager_us=45.0, graph_us=6.5))
    b = store.create_run("nightly", {}, env)
    store.add_result(b, known_result(eager_us=60.0, graph_us=6.5))
    out = replaybench("compare", str(a), str(b), "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {(r["mode"], r["figure"]): r for r in json.loads(out.stdout)}
    assert rows[("eager", "eager throughput")]["verdict"] == "SLOWER"
    assert abs(rows[("eager", "eager throughput")]["change"] - 60 / 45 + 1) < 1e-9
    # Graph replay and its GPU time did not move: the speedup went up with eager, and is no verdict.
    assert rows[("graph", "throughput")]["verdict"] == rows[("graph", "GPU time")]["verdict"] == "SAME"
    md = replaybench("compare", str(a), str(b), "--format", "markdown", cwd=tmp_path)
    assert "| seed_mlp | batch_size=1, dtype=float32, width=128 | eager | eager throughput | 45.00 us | 60.00 us | +33.3% | SLOWER |" in md.stdout
    table = replaybench("compare", str(a), str(b), cwd=tmp_path)
    assert table.returncode == 0 and "1 slower, 0 faster of 3 compared" in table.stderr
    runs = json.loads(replaybench("runs", "--format", "json", cwd=tmp_path).stdout)
    assert [r["id"] for r in runs] == [b, a] and runs[0]["gpu_name"] == "NVIDIA H200"
    assert replaybench("compare", str(a), "99", cwd=tmp_path).returncode == 2

    other = store.create_run("nightly", {}, env)  # shares no config with run a
    store.add_result(other, known_result(workload="deep_mlp", eager_us=45.0, graph_us=6.5))
    apart = json.loads(replaybench("compare", str(a), str(other), "--format", "json", cwd=tmp_path).stdout)
    assert {(r["workload"], r["verdict"]) for r in apart} == {("seed_mlp", "MISSING"), ("deep_mlp", "NEW")}
    assert all(r["value"] is None and r["reason"] == f"not measured in run {other}" for r in apart if r["verdict"] == "MISSING")
    table = replaybench("compare", str(a), str(other), cwd=tmp_path)
    assert f"0 slower, 0 faster of 0 compared; 3 only in run {a}; 3 only in run {other}" in table.stderr

    blind = known_result()
    blind.modes[1].gpu = None  # its graph's GPU time could not be read: that figure alone is missing
    c = store.create_run("nightly", {}, env)
    store.add_result(c, blind)
    rows = json.loads(replaybench("compare", str(a), str(c), "--format", "json", cwd=tmp_path).stdout)
    assert [(r["mode"], r["figure"], r["reason"]) for r in rows if r["verdict"] == "MISSING"] == [
        ("graph", "GPU time", f"no such figure in run {c}")]
    assert len(rows) == 3


SMALL_MLP = '''
"""A small MLP; with SLOW_IT set, the workload named `slowed` does its work twice; with
SLOW_BUILD_S, it takes that long to build."""
import os
import time

import torch
from replaybench.workload import Built, Workload

NAME = "{name}"


def build(params, device, dtype):
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    repeat = 2 if NAME == "slowed" and os.environ.get("SLOW_IT") else 1
    time.sleep(float(os.environ.get("SLOW_BUILD_S", "0")))

    def forward(x):
        for _ in range(repeat):
            y = model(x)
        return y

    return Built(fn=forward, inputs=(torch.randn(params["batch_size"], 64, device=device, dtype=dtype),))


WORKLOAD = Workload(name=NAME, description="a small MLP", build=build, grid={{"batch_size": [1], "dtype": ["float32"]}})
'''


@pytest.mark.slow
def test_two_measured_runs_mark_exactly_the_slowed_workload_slower(tmp_path):
    """Two real runs of the same suite, the second with one workload doing twice the work: its report
    against the first marks that workload SLOWER, with its figures, and nothing else."""
    import json

    (tmp_path / "user_workloads").mkdir()
    for name in ("steady", "slowed"):
        (tmp_path / "user_workloads" / f"{name}.py").write_text(SMALL_MLP.format(name=name))
    env = {"REPLAYBENCH_WORKLOADS_PATH": str(tmp_path / "user_workloads")}
    # Three measuring processes: their spread is part of each interval, so host noise on a busy
    # machine does not pass for a change of the steady workload.
    run = ["run", "-w", "steady", "-w", "slowed", "--time-budget", "1.5", "--processes", "3"]
    assert replaybench(*run, cwd=tmp_path, env=env).returncode == 0
    out = replaybench(*run, cwd=tmp_path, env={**env, "SLOW_IT": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    first, second = (store.run(i) for i in (1, 2))
    eager = {(run.id, r.workload): r.throughput_s for run in (first, second) for r in run.results if r.mode == "eager"}
    # The slowdown is real in eager at standard host speed, which a change of the whole host's
    # speed between the two runs (common on a 2-core machine) does not move.
    normalised = {(run.id, r.workload): r.host_normalised for run in (first, second) for r in run.results if r.mode == "eager"}
    # Twice the layers, not twice the call: the timing loop's own cost per call is not doubled.
    assert normalised[(2, "slowed")] > 1.3 * normalised[(1, "slowed")]

    out = replaybench("compare", "1", "2", "--format", "json", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    verdicts = {(r["workload"], r["mode"]): r["verdict"] for r in json.loads(out.stdout)}
    assert verdicts[("slowed", "eager")] == "SLOWER"
    assert verdicts[("steady", "eager")] != "SLOWER"
    assert not any(v == "SLOWER" for (w, _), v in verdicts.items() if w == "steady")

    own = (tmp_path / "reports" / "2.md").read_text()
    plots = {p.name: p.stat().st_ino for p in (tmp_path / "reports").glob("2-*.png")}
    out = replaybench("report", "2", "--baseline", "1", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert plots and {p.name: p.stat().st_ino for p in (tmp_path / "reports").glob("2-*.png")} == plots  # none redrawn
    report = (tmp_path / "reports" / "2-against-1.md").read_text()
    assert out.stdout == report
    # The run's own report, judged against the history, is neither replaced nor the latest's stand-in.
    assert (tmp_path / "reports" / "2.md").read_text() == own == (tmp_path / "reports" / "latest.md").read_text()
    assert "pinned baseline" not in own
    slowed = report.split("## slowed")[1].split("\n## ")[0]
    steady = report.split("## steady")[1].split("\n## ")[0]
    assert "**SLOWER**" in slowed and "SLOWER" not in steady
    assert f"| {eager[(2, 'slowed')] * 1e6:.1f} [" in slowed  # with its figures
    assert "Against the pinned baseline, run 1: **1 slower**" in report
