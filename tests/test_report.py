import re

import pytest

from replaybench.report import md_cell, write_report
from replaybench.storage import Store

from .helpers import SLOWED_VERDICTS, known_result, two_runs_one_slowed


def table_rows(markdown: str, first_cell: str):
    return [
        [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in markdown.splitlines()
        if line.startswith("| " + first_cell)
    ]


def section(markdown: str, workload: str) -> str:
    return markdown.split(f"## {workload}\n", 1)[1].split("\n## ", 1)[0]


def stored_run(db_url, *results):
    store = Store(db_url)
    run_id = store.create_run("cli", {}, {"torch": "2.11.0", "gpu_name": "NVIDIA H200", "python": "3.12", "cpu_model": "EPYC"})
    for r in results:
        store.add_result(run_id, r)
    store.finish_run(run_id)
    return store, run_id


def test_report_tables_hold_the_stored_figures(db_url, tmp_path):
    store, run_id = stored_run(db_url, known_result(eager_us=45.0, graph_us=6.5))
    path, text = write_report(store, run_id, tmp_path / "reports")
    assert path == tmp_path / "reports" / f"{run_id}.md"
    assert (tmp_path / "reports" / "latest.md").read_text() == text == path.read_text()

    run = store.run(run_id)
    stored = {r.mode: r for r in run.results}
    rows = table_rows(text, "batch_size=1, dtype=float32, width=128 |")
    eager_row = next(r for r in rows if r[1] == "eager")
    graph_row = next(r for r in rows if r[1] == "CUDA graph replay")
    assert eager_row[2].startswith(f"{stored['eager'].throughput_s * 1e6:.1f} [")
    assert graph_row[2].startswith(f"{stored['graph'].throughput_s * 1e6:.1f} [")
    assert graph_row[4].startswith(f"**{stored['graph'].speedup:.2f}x**")
    assert f"{45.0 / 6.5:.2f}x" in graph_row[4]
    # The steady figures beside the speedup: graph replay time and its GPU time, with intervals.
    assert graph_row[3] == f"{stored['graph'].gpu_s * 1e6:.2f} [{stored['graph'].gpu_ci_low * 1e6:.2f}, {stored['graph'].gpu_ci_high * 1e6:.2f}]"
    assert "geometric-mean speedup **6.92x** over 1 config(s)" in text
    assert "| 12.30 | 0.40 | 3.0 | 330 |" in text  # capture ms, first replay ms, pool MiB, break-even
    assert "| torch | 2.11.0 |" in text


def test_failures_are_listed_with_their_reason_and_text_is_escaped(db_url, tmp_path):
    hostile = "mismatch | <script>alert(1)</script>\n| injected | row |"
    store, run_id = stored_run(db_url, known_result(), known_result(workload="other", reason=hostile))
    _, text = write_report(store, run_id, tmp_path)
    assert "status **completed with failures**" in text
    assert "Failures: 1." in text
    failure = table_rows(text.split("## Failures")[1], "other |")
    assert len(failure) == 1  # the newline did not start a row
    row = failure[0]
    assert len(row) == 5  # the pipes did not add cells
    assert "<script>" not in text and "&lt;script&gt;" in row[4]
    assert "\n| injected" not in text


def test_md_cell():
    assert md_cell("a|b\nc") == "a\\|b c"
    assert md_cell(None) == ""


def test_a_cell_cannot_carry_a_link_or_an_image():
    from markdown_it import MarkdownIt

    hostile = "see [the fix](http://evil.example) ![x](http://evil.example/pixel.png) <http://evil.example> [r]"
    html = MarkdownIt("commonmark").enable("table").render(f"| a |\n|---|\n| {md_cell(hostile)} |\n")
    assert "<a " not in html and "<img" not in html
    assert "see [the fix](http://evil.example)" in html  # the text itself is kept, as text


def test_latest_is_the_newest_report_of_this_store_whatever_else_the_directory_holds(db_url, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "50.md").write_text("# replaybench run 50, of another database\n")
    (reports / "\u00b2.md").write_text("not a run's\n")  # digits to str.isdigit, not to int
    store, run_id = stored_run(db_url, known_result())
    _, text = write_report(store, run_id, reports)
    assert (reports / "latest.md").read_text() == text


def test_a_fault_in_a_builtin_template_or_filter_keeps_its_traceback(db_url, tmp_path, monkeypatch):
    """A user's template failing is one line (test_cli); the shipped ones failing is a bug of ours."""
    from replaybench import report

    def broken(value, *digits):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(report, "us", broken)
    store, run_id = stored_run(db_url, known_result())
    with pytest.raises(ZeroDivisionError, match="a bug"):
        write_report(store, run_id, tmp_path / "reports")


def test_a_user_template_directory_overrides_the_builtin(db_url, tmp_path):
    store, run_id = stored_run(db_url, known_result())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md.j2").write_text("run {{ run.id }}: {{ sections | length }} workload(s)\n")
    _, text = write_report(store, run_id, tmp_path / "out", template_dir=mine)
    assert text == f"run {run_id}: 1 workload(s)\n"


def test_two_runs_mark_exactly_the_slowed_workload_slower(db_url, tmp_path):
    from replaybench.verdicts import compare_runs

    env = {"torch": "2.11.0", "gpu_name": "NVIDIA H200", "gpu_driver": "580", "cuda": "13.0", "python": "3.12"}
    store = Store(db_url)
    first, second = two_runs_one_slowed(store, env)
    verdicts = {(r["workload"], r["mode"], r["figure"]): r["verdict"] for r in compare_runs(store, first, second)}
    assert verdicts == SLOWED_VERDICTS

    _, text = write_report(store, second, tmp_path, baseline=first)
    assert "Against the pinned baseline, run 1: **2 slower**, 0 faster, 2 same" in text
    rows = [row for row in table_rows(text, "batch_size=1") if len(row) == 9]
    assert sorted(row[7] for row in rows if "SLOWER" in row[7]) == ["**SLOWER** (+33.3%)", "**SLOWER** (+38.5%)"]
    assert section(text, "deep_mlp").count("**SLOWER**") == 2 and "SLOWER" not in section(text, "seed_mlp")
    # Without a pinned baseline, two nights are too short a history to call a regression.
    _, text = write_report(store, second, tmp_path)
    assert "**0 slower**" in text


def test_an_environment_change_is_judged_across_and_named(db_url, tmp_path):
    from replaybench.verdicts import compare_runs

    store = Store(db_url)
    first = store.create_run("nightly", {}, {"torch": "2.10.0", "gpu_name": "NVIDIA H200"})
    store.add_result(first, known_result(eager_us=45.0))
    second = store.create_run("nightly", {}, {"torch": "2.11.0", "gpu_name": "NVIDIA H200"})
    store.add_result(second, known_result(eager_us=90.0))
    eager = next(r for r in compare_runs(store, first, second) if r["mode"] == "eager")
    assert eager["verdict"] == "SLOWER" and "torch 2.10.0 -> 2.11.0" in eager["reason"]
    # Another GPU model is another history: not compared.
    third = store.create_run("nightly", {}, {"torch": "2.11.0", "gpu_name": "NVIDIA H100"})
    store.add_result(third, known_result(eager_us=90.0))
    assert {r["verdict"] for r in compare_runs(store, first, third)} == {"NEW"}


def test_launch_overhead_is_throughput_minus_gpu_time(db_url, tmp_path):
    store, run_id = stored_run(db_url, known_result(eager_us=45.0, graph_us=6.5))
    _, text = write_report(store, run_id, tmp_path)
    eager = next(r for r in table_rows(text, "batch_size=1, dtype=float32, width=128 |") if len(r) == 9 and r[1] == "eager")
    stored = next(r for r in store.run(run_id).results if r.mode == "eager")
    overhead = stored.throughput_s - stored.gpu_s
    assert eager[6] == f"{overhead * 1e6:.1f} ({overhead / stored.throughput_s:.0%})"


def test_the_host_table_counts_the_processes_each_figure_rests_on(tmp_path):
    """The H200 default-suite run (benchmarks/data): per config, how many of its six measuring
    processes had enough undisturbed units to count, as the figures were computed from them."""
    from pathlib import Path

    from replaybench.analysis import figures, stored_units

    copy = tmp_path / "suite.db"
    copy.write_bytes((Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "h200-default-suite-run-3.db").read_bytes())
    store = Store(f"sqlite:///{copy}")
    _, text = write_report(store, 1, tmp_path / "reports")
    rows: dict = {}
    for r in store.run(1).results:
        rows.setdefault((r.workload, r.params_key), {})[r.mode] = r
    counted = {key: modes["eager"].processes for key, modes in rows.items()}
    assert {c for c, _ in counted.values()} >= {3, 6} and all(total == 6 for _, total in counted.values())
    for key, modes in rows.items():  # as many as the figures, recomputed from the stored units, rest on
        recomputed = figures(stored_units(modes), list(modes))
        assert counted[key][0] == len(recomputed.used)
        # stored before the host-normalised speedup was: opening the store made it from the same units
        assert modes["graph"].normalised_speedup == pytest.approx(recomputed.normalised_speedup["graph"].value)
        assert f"{modes['graph'].normalised_speedup:.2f}x [" in text
    assert "| batch_size=1, depth=2, dtype=float32 | 32 of 228 (86% set aside) | 3 of 6 |" in text


def test_the_host_table_shows_the_speedup_with_the_hosts_speed_taken_out_and_n_a_where_none_was_stored(db_url, tmp_path):
    without = known_result(workload="deep_mlp")
    without.mode("graph").normalised_speedup = None
    store, run_id = stored_run(db_url, known_result(), without)
    _, text = write_report(store, run_id, tmp_path)
    for workload, shown in (("seed_mlp", "7.50x [7.20x, 7.90x]"), ("deep_mlp", "n/a")):
        (host_row,) = [r for r in table_rows(section(text, workload), "batch_size=1, dtype=float32, width=128 |") if len(r) == 6]
        assert host_row[5] == shown
    assert "on a host whose reference block takes 0.4 ms" in text


def test_two_writers_of_the_same_report_at_once_both_finish_and_leave_it_whole(db_url, tmp_path, monkeypatch):
    """A nightly run's own report and a `replaybench report N` of it may be written at the same
    moment. Both writers are held just before each moves a finished report into place, so that
    each has drafted its copy before either moves one: neither may move the other's draft away."""
    import os
    import threading

    store, run_id = stored_run(db_url, known_result())
    reports = tmp_path / "reports"
    both_drafted = threading.Barrier(2, timeout=30)
    real_replace = os.replace

    def replace_when_both_drafted(src, dst):
        if str(dst).endswith(".md"):
            both_drafted.wait()
        return real_replace(src, dst)

    monkeypatch.setattr("replaybench.report.os.replace", replace_when_both_drafted)
    written, faults = [], []

    def writer():
        try:
            written.append(write_report(Store(db_url), run_id, reports)[1])
        except BaseException as e:  # noqa: BLE001 - what a writer raised is the test's finding
            faults.append(e)
            both_drafted.abort()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert faults == [] and len(written) == 2 and written[0] == written[1]
    assert (reports / f"{run_id}.md").read_text() == written[0] == (reports / "latest.md").read_text()
    assert sorted(p.name for p in reports.iterdir() if not p.name.endswith(".png")) == [f"{run_id}.md", "latest.md"]
