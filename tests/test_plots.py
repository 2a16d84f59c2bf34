import math
import warnings
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from matplotlib.image import imread
from sqlalchemy import event, insert, update

from replaybench.history import Verdict
from replaybench.plots import TREND_LIMIT, batch_series, kernel_series, normalised_series, trend_series, write_plots
from replaybench.report import write_report
from replaybench.storage import Result, Run, Store
from replaybench.verdicts import store_verdicts
from replaybench.workload import params_json

from .helpers import known_result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ENV = {"gpu_name": "NVIDIA H200", "gpu_driver": "570.86", "cuda": "12.8", "torch": "2.10.0"}
START = datetime(2025, 1, 1, 2, 0, tzinfo=timezone.utc)


def config(workload="seed_mlp", batch_size=1, speedup=6.0, kernels=3.0, graph_ok=True, graph_us=5.0, **params):
    """One config's eager and graph result: eager at 30 us, graph at 30/speedup us (unless given)."""
    r = known_result(workload=workload, eager_us=graph_us * speedup, graph_us=graph_us, reason=None if graph_ok else "mismatch")
    r.params = {"batch_size": batch_size, "dtype": "float32", "width": 128, **params}
    for m in r.modes:
        m.kernels_per_iter = kernels if m.status == "ok" else None
    return r


def add_run(store, results, night=0, env=ENV):
    run_id = store.create_run("nightly", {}, env)
    for r in results:
        store.add_result(run_id, r)
    store.finish_run(run_id)
    store_verdicts(store, run_id)  # as the flow does once a run is finished
    with store.session.begin() as s:  # one run per night
        s.execute(update(Run).where(Run.id == run_id).values(started_at=START + timedelta(days=night)))
    return run_id


def assert_png(path, width=800, height=500):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = imread(path)
    assert image.shape[:2] == (height, width)  # 8x5 in at 100 dpi
    assert image[..., :3].std() > 0.05  # something is drawn on it


# -- the data behind the plots -----------------------------------------------------------------


def test_batch_series_one_line_per_workload_sorted_by_batch_size(db_url):
    store = Store(db_url)
    run_id = add_run(store, [
        config("mlp", 8, 4.0), config("mlp", 1, 6.0), config("mlp", 64, 1.5),
        config("conv", 4, 2.0), config("conv", 16, 1.2, graph_ok=False),  # a failed graph row: no point
    ])
    series = batch_series(store.run(run_id))
    assert list(series) == ["conv", "mlp"]
    assert [(p.batch_size, p.speedup) for p in series["mlp"]] == [(1, 6.0), (8, 4.0), (64, 1.5)]
    assert [p.batch_size for p in series["conv"]] == [4]
    p = series["mlp"][0]
    assert (p.ci_low, p.ci_high) == pytest.approx((5.9, 6.1))


def test_batch_series_splits_a_workload_whose_configs_share_a_batch_size(db_url):
    store = Store(db_url)
    run_id = add_run(store, [
        config("mlp", 1, 6.0, dtype="float32"), config("mlp", 8, 3.0, dtype="float32"),
        config("mlp", 1, 5.0, dtype="float16"), config("mlp", 8, 2.5, dtype="float16"),
    ])
    series = batch_series(store.run(run_id))
    # Labelled with the parameter that differs (dtype), not the ones they share (width).
    assert {k: [(p.batch_size, p.speedup) for p in v] for k, v in series.items()} == {
        "mlp (dtype=float16)": [(1, 5.0), (8, 2.5)],
        "mlp (dtype=float32)": [(1, 6.0), (8, 3.0)],
    }


def test_kernel_series_per_workload_with_the_eager_count_as_fallback(db_url):
    store = Store(db_url)
    no_graph_count = config("conv", 2, 1.5, kernels=40.0)
    no_graph_count.mode("graph").kernels_per_iter = None
    no_count = config("norm", 2, 1.1, kernels=None)
    run_id = add_run(store, [config("mlp", 1, 6.0, kernels=3.0), config("mlp", 8, 5.0, kernels=12.0), no_graph_count, no_count])
    series = kernel_series(store.run(run_id))
    assert list(series) == ["conv", "mlp"]  # norm: no kernel count at all
    assert [(p.kernels_per_iter, p.speedup) for p in series["mlp"]] == [(3.0, 6.0), (12.0, 5.0)]
    assert [(p.kernels_per_iter, p.speedup) for p in series["conv"]] == [(40.0, 1.5)]
    assert series["mlp"][0].label == "batch_size=1, dtype=float32, width=128"


def stepped_history(store, flat=12, after=4, step=-0.15, sigma=0.02, seed=0, level=6.0):
    """`flat` nights of one config at speedup `level` with lognormal noise, then `after` nights with
    graph replay slower so that the speedup is `step` lower; a second config stays flat throughout.
    Returns the run ids."""
    rng = np.random.default_rng(seed)
    ids = []
    for night in range(flat + after):
        f = 1 + step if night >= flat else 1.0
        ids.append(add_run(store, [
            config("mlp", 1, level * f * math.exp(rng.normal(0, sigma)), graph_us=5.0 / f),
            config("mlp", 8, 3.0 * math.exp(rng.normal(0, sigma))),
        ], night=night))
    return ids


def test_trend_series_marks_the_slowdown_step(db_url):
    store = Store(db_url)
    ids = stepped_history(store)
    series = trend_series(store, store.run(ids[-1]))
    assert list(series) == ["mlp (batch_size=1)", "mlp (batch_size=8)"]
    stepped, flat = series["mlp (batch_size=1)"], series["mlp (batch_size=8)"]
    assert [p.run_id for p in stepped] == ids == [p.run_id for p in flat]
    assert [p.started_at.date() for p in stepped] == [(START + timedelta(days=i)).date() for i in range(16)]
    verdicts = [p.verdict for p in stepped]
    assert verdicts[0] is Verdict.NEW
    assert Verdict.SLOWER not in verdicts[:12] and Verdict.FASTER not in verdicts
    first = verdicts.index(Verdict.SLOWER)
    assert 12 < first <= 14, [v and v.value for v in verdicts]  # on the step's second or third night
    assert f"since run {ids[12]}" in stepped[first].reason
    assert all(p.value < 6.0 * 0.93 for p in stepped[12:])
    assert not {Verdict.SLOWER, Verdict.FASTER} & {p.verdict for p in flat}


def test_trend_series_only_this_runs_configs_earlier_runs_graph_ok_rows(db_url):
    store = Store(db_url)
    first = add_run(store, [config("mlp", 1, 6.0), config("gone", 1, 2.0)], night=0)
    add_run(store, [config("mlp", 1, 6.1, graph_ok=False)], night=1)  # graph failed: no night
    third = add_run(store, [config("mlp", 1, 5.9), config("other", 1, 3.0)], night=2)
    add_run(store, [config("mlp", 1, 1.0)], night=3)  # after the run: not in its trend
    series = trend_series(store, store.run(third))
    assert {k: [(p.run_id, p.value) for p in v] for k, v in series.items()} == {
        "mlp": [(first, 6.0), (third, 5.9)],
        "other": [(third, 3.0)],
    }
    assert [p.verdict for p in series["mlp"]] == [Verdict.NEW, Verdict.UNCERTAIN]  # too little history


def test_trend_series_environment_change(db_url):
    store = Store(db_url)
    ids = [add_run(store, [config("mlp", 1, 6.0 + 0.01 * i)], night=i, env=ENV if i < 6 else {**ENV, "torch": "2.11.0"})
           for i in range(8)]
    points = trend_series(store, store.run(ids[-1]))["mlp"]
    assert [p.env_changed for p in points] == [False] * 6 + [True, False]
    assert not {Verdict.SLOWER, Verdict.FASTER} & {p.verdict for p in points}  # a torch upgrade is no step


def with_normalised(result, value, interval=(0.97, 1.03)):
    """``result`` with its graph row's host-normalised speedup ``value`` within ``interval`` (as
    factors; None: not stored, as rows stored before the figure existed)."""
    graph = result.mode("graph")
    graph.normalised_speedup = value
    graph.normalised_speedup_ci_low, graph.normalised_speedup_ci_high = (
        (value * interval[0], value * interval[1]) if value else (None, None))
    return result


def test_the_normalised_trend_follows_the_host_normalised_speedup_of_the_nights_that_stored_it(db_url, tmp_path):
    """The speedup moves with the host's speed from night to night; the normalised trend draws the
    figure that moves far less, from the same nights, leaving out those stored without it and
    marking an environment change that fell on one of them on the next night kept."""
    store = Store(db_url)
    speedups, normalised = [6.0, 4.4, 6.1, 4.5, 6.0], [None, 7.4, 7.5, None, 7.5]
    ids = []
    for night, (sp, n) in enumerate(zip(speedups, normalised)):
        mlp = with_normalised(config("mlp", 1, sp), n)
        if night == 3:  # an interval stored without its figure: no point either
            mlp.mode("graph").normalised_speedup_ci_low, mlp.mode("graph").normalised_speedup_ci_high = 7.0, 8.0
        env = ENV if night < 3 else {**ENV, "torch": "2.11.0"}  # torch upgraded on night 3
        ids.append(add_run(store, [mlp, with_normalised(config("conv", 1, 2.0), None)], night=night, env=env))
    trend = trend_series(store, store.run(ids[-1]))
    assert [p.value for p in trend["mlp"]] == pytest.approx(speedups)
    assert [p.env_changed for p in trend["mlp"]] == [False, False, False, True, False]
    steady = normalised_series(trend)
    assert list(steady) == ["mlp"]  # conv never stored one
    assert [(p.run_id, p.value) for p in steady["mlp"]] == [(ids[i], pytest.approx(normalised[i])) for i in (1, 2, 4)]
    assert [(p.ci_low, p.ci_high) for p in steady["mlp"]][0] == pytest.approx((7.4 * 0.97, 7.4 * 1.03))
    assert [p.env_changed for p in steady["mlp"]] == [False, False, True]  # night 3's upgrade, on night 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # five nights once made matplotlib warn about its date ticks
        written = write_plots(store, store.run(ids[-1]), tmp_path)
    assert written["normalised_trend"] == f"{ids[-1]}-normalised-trend.png"
    assert_png(tmp_path / written["normalised_trend"])
    # The report links every plot written beside it, this one under its own caption.
    _, text = write_report(store, ids[-1], tmp_path / "reports")
    assert all(f"]({name})" in text for name in written.values())
    assert f"![Nightly trend of the speedup with the host's speed taken out, verdict changes marked]({written['normalised_trend']})" in text
    # A history that never stored it gets no such plot.
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    last = [add_run(other, [with_normalised(config("mlp", 1, sp), None)], night=i) for i, sp in enumerate(speedups)][-1]
    assert set(write_plots(other, other.run(last), tmp_path / "other")) == {"speedup_vs_batch", "speedup_vs_kernels", "trend"}


def test_trend_series_keeps_the_configs_with_the_most_history(db_url):
    store = Store(db_url)
    # Config b (batch size 2**b) is measured from night b on: the first ones have the longest history.
    for night in range(5):
        add_run(store, [config("mlp", 2**b, 2.0) for b in range(night + 1)], night=night)
    run = store.run()
    series = trend_series(store, run, limit=3)
    assert {k: len(v) for k, v in series.items()} == {"mlp (batch_size=1)": 5, "mlp (batch_size=2)": 4, "mlp (batch_size=4)": 3}
    assert len(trend_series(store, run, limit=None)) == 5
    assert TREND_LIMIT == 12


def test_trend_series_spreads_equally_long_histories_over_the_workloads(db_url):
    store = Store(db_url)
    for night in range(2):
        add_run(store, [config(w, b, 2.0) for w in ("a", "b", "c") for b in (1, 2, 4)], night=night)
    assert list(trend_series(store, store.run(), limit=4)) == [
        "a (batch_size=1)", "a (batch_size=2)", "b (batch_size=1)", "c (batch_size=1)",
    ]


# -- the files -------------------------------------------------------------------------------------


def test_write_plots_writes_valid_pngs(db_url, tmp_path):
    store = Store(db_url)
    for night in range(6):
        results = [config("mlp", b, 6.0 / (1 + b / 16), kernels=3.0 * b) for b in (1, 4, 16, 64)]
        results += [config("conv", b, 2.0 / (1 + b / 64), kernels=40.0) for b in (1, 8, 64)]
        run_id = add_run(store, results, night=night)
    out = tmp_path / "reports"
    written = write_plots(store, store.run(run_id), out)
    assert written == {
        "speedup_vs_batch": f"{run_id}-speedup-vs-batch.png",
        "speedup_vs_kernels": f"{run_id}-speedup-vs-kernels.png",
        "trend": f"{run_id}-trend.png",
        "normalised_trend": f"{run_id}-normalised-trend.png",
    }
    for name in written.values():
        assert_png(out / name)
    assert sorted(p.name for p in out.iterdir()) == sorted(written.values())  # no temporary files left


def test_a_run_without_graph_results_plots_the_trend_of_eager_time(db_url, tmp_path):
    """A host without CUDA measures no speedup: its report follows eager time per call instead."""
    store = Store(db_url)
    add_run(store, [config("mlp", 1, 6.0)], night=0)  # eager 30 us
    run_id = add_run(store, [config("mlp", 1, 7.0, graph_ok=False), config("conv", 4, 2.0, graph_ok=False)], night=1)
    run = store.run(run_id)
    assert batch_series(run) == kernel_series(run) == trend_series(store, run) == {}
    eager = trend_series(store, run, mode="eager")
    assert {k: [(p.run_id, round(p.value * 1e6, 1)) for p in v] for k, v in eager.items()} == {
        "conv": [(run_id, 10.0)], "mlp": [(run_id - 1, 30.0), (run_id, 35.0)]}
    written = write_plots(store, run, tmp_path / "reports")
    assert written == {"eager_trend": f"{run_id}-eager-trend.png"}
    assert_png(tmp_path / "reports" / written["eager_trend"])
    assert not write_plots(store, store.run(run_id - 1), tmp_path / "other").get("eager_trend")  # a speedup there


def bulk_history(store, runs=365, configs=100, seed=0):
    """`runs` nightly runs of `configs` configs each (an eager and a graph row: 2 x configs
    results per run), inserted in bulk. Returns the last run's id."""
    rng = np.random.default_rng(seed)
    workloads = [f"workload_{i % 20:02d}" for i in range(configs)]
    params = [{"batch_size": 2 ** (i // 20), "dtype": "float32", "width": 128} for i in range(configs)]
    keys = [params_json(p) for p in params]
    kernels = [3.0 * 2 ** (i % 20 % 9) for i in range(configs)]
    level = 1.0 + 0.3 * np.sqrt(kernels) / 2 ** (np.arange(configs) // 20 / 2) * rng.uniform(0.8, 1.2, configs)
    with store.engine.begin() as conn:
        first = conn.execute(insert(Run.__table__).values(
            [{"trigger": "nightly", "status": "completed", "started_at": START + timedelta(days=n), "parameters": {},
              "environment": {}, "gpu_name": ENV["gpu_name"], "gpu_driver": ENV["gpu_driver"], "cuda_version": ENV["cuda"],
              "torch_version": ENV["torch"]} for n in range(runs)]
        ).returning(Run.__table__.c.id)).scalars().all()
        rows = []
        for run_id in first:
            speedups = level * np.exp(rng.normal(0, 0.02, configs))
            for w, p, k, n, sp in zip(workloads, params, keys, kernels, speedups):
                common = {"run_id": run_id, "workload": w, "params": p, "params_key": k, "status": "ok", "kernels_per_iter": n}
                rows.append({**common, "mode": "eager", "throughput_s": 5e-6 * sp, "speedup": None, "speedup_ci_low": None, "speedup_ci_high": None})
                rows.append({**common, "mode": "graph", "throughput_s": 5e-6, "speedup": float(sp),
                             "speedup_ci_low": float(sp) * 0.98, "speedup_ci_high": float(sp) * 1.02})
        conn.execute(insert(Result.__table__), rows)
    return first[-1]


@pytest.mark.timeout(120)
def test_write_plots_reads_a_year_of_history_in_a_few_indexed_queries(tmp_path):
    """A year of nightly runs (20 configs here, to keep the test short; for 365 x 200 results see
    benchmarks/report_history.py): one SELECT counting each config's nights, then one per config
    drawn on the trend, a range of the index ix_results_history; whatever the length of the history."""
    store = Store(f"sqlite:///{tmp_path / 'year.db'}")
    last = bulk_history(store, runs=365, configs=20)
    run = store.run(last)
    assert len(run.results) == 40
    statements = []
    event.listen(store.engine, "before_cursor_execute", lambda conn, cursor, sql, params, *args: statements.append((sql, params)))
    written = write_plots(store, run, tmp_path / "reports")
    assert set(written) == {"speedup_vs_batch", "speedup_vs_kernels", "trend"}
    assert [sql.split()[0] for sql, _ in statements] == ["SELECT"] * (1 + TREND_LIMIT)
    assert "GROUP BY" in statements[0][0] and all("JOIN runs" in sql for sql, _ in statements[1:])
    with store.engine.connect() as c:
        plan = " ".join(str(row) for row in c.exec_driver_sql("EXPLAIN QUERY PLAN " + statements[-1][0], statements[-1][1]))
    assert "USING INDEX ix_results_history" in plan and "TEMP B-TREE" not in plan


def test_a_plot_is_the_png_that_savefig_writes(tmp_path):
    """Plots are drawn once (savefig draws a constrained-layout figure twice), into the same file."""
    from replaybench.plots import DPI, _figure, _save

    def figure():
        fig, ax = _figure()
        ax.plot([1, 2, 3], [2.0, 1.0, 3.0], label="a config")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle("Run 1: a title\nover two lines")
        return fig

    _save(figure(), tmp_path / "drawn-once.png")
    figure().savefig(tmp_path / "savefig.png", dpi=DPI, format="png")
    assert (tmp_path / "drawn-once.png").read_bytes() == (tmp_path / "savefig.png").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_a_single_config_run_and_a_config_without_batch_size(db_url, tmp_path):
    store = Store(db_url)
    first = add_run(store, [config("mlp", 4, 3.0, kernels=7.0)])
    written = write_plots(store, store.run(first), tmp_path)
    assert set(written) == {"speedup_vs_batch", "speedup_vs_kernels", "trend", "normalised_trend"}  # one point each
    for name in written.values():
        assert_png(tmp_path / name)
    no_batch = config("scalar_op", kernels=2.0)
    del no_batch.params["batch_size"]
    second = add_run(store, [no_batch], night=1)
    written = write_plots(store, store.run(second), tmp_path / "second")
    assert set(written) == {"speedup_vs_kernels", "trend", "normalised_trend"}  # nothing to put on a batch size axis
