"""A/B runs: the comparison's statistics on real H200 noise (units kept in benchmarks/data, paired
as an A/B run pairs them by benchmarks/ab_noise.py), the variants file, and `replaybench ab` end to end on the CPU: two
interpreters and two workload directories through the CLI, and the `ab` deployment through a real
Prefect server, whose form refuses a variant the worker does not declare."""

import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from replaybench.ab import interval, judge, ratio, ratios
from replaybench.storage import Store
from replaybench.variants import VariantError, load_variants, pick
from replaybench.workload import load_registry

from .helpers import BENCHMARKS, benchmark
from .prefect_server import background, prefect_server, served_env

MODES = ["eager", "graph"]
ab_noise, ab_check = benchmark("ab_noise"), benchmark("ab_check")
# Real `replaybench ab` runs and their pairs of measuring processes; benchmarks/data/README.md says how they were made.
AB_RUNS = {"h200-ab.db": 6, "h200-ab-captures.db": 6, "h100-ab-1.db": 12, "h100-ab-2.db": 12,
           "h100-ab-3.db": 12, "h100-ab-4.db": 12}


@pytest.fixture(scope="module")
def identical():
    """A against an identical B, pairs on one core, from the units of 18 configs measured on an
    H200 (benchmarks/data/h200-calibration-2.json; benchmarks/ab_noise.py says how they are paired)."""
    return [ab_noise.on_one_core(units) for _, units in ab_noise.configs()]


def test_identical_variants_on_h200_noise_read_no_change_and_are_tight(identical):
    assert len(identical) == 18
    hold, widths = [], {}
    for a, b in identical:
        assert len(a) == len(b) == 6
        for key, e in ratios(a, b, MODES).items():
            hold.append(e.ci_low <= 1 <= e.ci_high)
            widths.setdefault(key, []).append(e.rel_halfwidth)
    assert len(hold) == 54 and np.mean(hold) >= 0.9  # a 95% interval, on real noise
    assert np.median(widths[("eager", "time per call")]) <= 0.05
    assert np.median(widths[("graph", "time per call")]) <= 0.01


def test_pairing_units_narrows_eager_against_comparing_process_medians(identical):
    """Unit j of A and of B in a pair share a core and a moment: their ratio cancels the host's
    drift, which each process's own median does not."""
    paired = [ratios(a, b, MODES)[("eager", "time per call")].rel_halfwidth for a, b in identical]
    medians = [ab_noise.process_medians(a, b, "eager").rel_halfwidth for a, b in identical]
    assert np.median(paired) < 0.5 * np.median(medians)


@pytest.mark.parametrize("mode, factor", [("eager", 1.05), ("graph", 1.01)])
def test_a_change_planted_in_real_h200_noise_is_found(identical, mode, factor):
    verdicts = [judge("time per call", ratios(a, ab_noise.scaled(b, mode, factor), MODES)[(mode, "time per call")], 0.05)[0]
                for a, b in identical]
    assert verdicts.count("slower") >= 0.95 * len(identical)
    before = [judge("time per call", ratios(a, b, MODES)[(mode, "time per call")], 0.05)[0] for a, b in identical]
    assert before.count("slower") == 0  # found because it was planted, not because it was there


@pytest.fixture(scope="module", params=list(AB_RUNS))
def real_ab_run(request):
    """One `replaybench ab` run on an H200 or H100 (benchmarks/ab_check.py): B switches on the probe's
    change, A and B are otherwise identical; its comparisons recomputed from the stored units by the
    current code, and its pairs of processes."""
    kept = BENCHMARKS / "data" / request.param
    before = kept.read_bytes()
    ((_, rows),) = ab_check.stored_comparisons(kept)
    assert kept.read_bytes() == before  # read from a copy: the kept file is never upgraded
    assert {r["pairs"] for r in rows} == {AB_RUNS[request.param]}
    return rows, AB_RUNS[request.param]


def test_identical_configs_of_a_real_ab_run_hold_no_change_and_eager_is_tight(real_ab_run):
    all_rows, pairs = real_ab_run
    rows = [r for r in all_rows if r["workload"] != "ab_probe" and r["ratio"] is not None]
    assert len({(r["workload"], json.dumps(r["params"])) for r in rows}) >= 16  # of 19; some runs' time limits cut the last
    hold = [r["ci_low"] <= 1 <= r["ci_high"] for r in rows]
    assert np.mean(hold) >= 0.9  # a 95% interval: about one in twenty may miss, no more
    assert all(r["verdict"] not in ("slower", "faster") or abs(r["ratio"] - 1) < 0.03 for r in rows)

    def widths(mode, metric):
        return [(r["ci_high"] - r["ci_low"]) / 2 / r["ratio"] for r in rows if (r["mode"], r["metric"]) == (mode, metric)]

    assert np.median(widths("eager", "time per call")) <= 0.05
    assert np.median(widths("graph", "time per call")) <= 0.015 and np.median(widths("graph", "GPU time")) <= 0.015
    if pairs >= 12:  # the default: every eager interval within the 5% aim, graph's typically within 1%
        assert max(widths("eager", "time per call")) <= 0.05
        assert np.median(widths("graph", "time per call")) <= 0.01 and np.median(widths("graph", "GPU time")) <= 0.01


def test_the_probes_of_a_real_ab_run_move_the_right_metric(real_ab_run):
    probe = {(r["params"]["change"], r["mode"], r["metric"]): r for r in real_ab_run[0] if r["workload"] == "ab_probe"}
    kernel = [probe[("kernel", "graph", metric)] for metric in ("time per call", "GPU time")]
    assert all(r["verdict"] == "slower" and r["ci_low"] > 1.05 for r in kernel)  # one kernel more per call
    assert probe[("host", "eager", "time per call")]["verdict"] == "slower"  # more host work per call
    assert all(probe[("host", "graph", metric)]["verdict"] != "slower" for metric in ("time per call", "GPU time"))


def test_a_real_runs_differences_below_the_minimum_effect_are_told_apart_in_its_report(tmp_path):
    """On the H100 run of identical variants, three intervals excluded no change by 0.2-2.0%: the
    report counts and shows them apart (not in bold), and the probe's real changes stay in bold."""
    from replaybench.report import ab_rows, write_report

    copy = tmp_path / "h100-ab-2.db"
    copy.write_bytes((BENCHMARKS / "data" / "h100-ab-2.db").read_bytes())
    store = Store(f"sqlite:///{copy}")
    rows = ab_rows(store, store.run(1))
    small = [r for r in rows if r["below_min_effect"]]
    assert small and all(r["verdict"] in ("slower", "faster", "lower", "higher") for r in small)
    assert all(0.95 < r["ci_low"] and r["ci_high"] < 1.05 for r in small)
    assert all(r["workload"] != "ab_probe" or r["metric"] == "speedup" for r in small)  # the planted changes are >= 10%
    _, report = write_report(store, 1, tmp_path / "reports")
    worse = sum(r["verdict"] in ("slower", "lower") for r in rows)
    small_worse = sum(r["verdict"] in ("slower", "lower") for r in small)
    assert f"**{worse} worse in B** (slower, or a lower speedup; {small_worse} of them by less than +/-5%" in report
    lines = {r["text"]: line for r in rows for line in report.splitlines() if r["text"].replace("[", "\\[").replace("]", "\\]") in line}
    for r in rows:
        if r["verdict"] in ("slower", "faster", "lower", "higher"):
            assert ("below the +/-5% minimum effect" in lines[r["text"]]) == r["below_min_effect"]
            assert ("**" in lines[r["text"]]) != r["below_min_effect"]
    # A's and B's figures carry their units: microseconds per call, or the speedup's factor.
    section = report.split("## B against A")[1].split("\n## ")[0].splitlines()
    table = section[section.index("|---|---|---|---|---|---|---|---|") + 1:]
    assert len([line for line in table if line.startswith("| ")]) == len(rows)
    for line in filter(None, table):
        cells = line.split(" | ")
        unit = "x" if cells[3] == "speedup" else " us"
        assert all(c.endswith(unit) or c == "n/a" for c in cells[4:6]) and cells[4:6] != ["n/a", "n/a"], line
    store.engine.dispose()


def test_verdict_words_and_their_directions():
    from replaybench.stats import Estimate

    assert judge("time per call", Estimate(1.12, 1.08, 1.16), 0.05)[1] == "B slower by 12.0% [+8.0%, +16.0%]"
    assert judge("GPU time", Estimate(0.9, 0.85, 0.95), 0.05)[0] == "faster"
    assert judge("speedup", Estimate(0.9, 0.85, 0.95), 0.05) == ("lower", "B's speedup lower by 10.0% [-15.0%, -5.0%]")
    assert judge("time per call", Estimate(1.01, 0.98, 1.04), 0.05)[0] == "no difference"
    assert judge("time per call", Estimate(1.01, 0.90, 1.13), 0.05)[0] == "inconclusive"
    # Narrow, but reaching a 9.4% slowdown: that is not "no difference".
    assert judge("time per call", Estimate(1.045, 0.999, 1.094), 0.05)[0] == "inconclusive"
    assert judge("time per call", None, 0.05)[0] == "inconclusive"
    assert interval([0.1]) is None and ratio([1.0, None], [2.0, 3.0]) is None
    e = ratio([1.0, 1.0, 1.0], [1.1, 1.2, 1.15])
    assert e.ci_low < e.value < e.ci_high and e.value == pytest.approx((1.1 * 1.2 * 1.15) ** (1 / 3))


# -- the variants file ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, why", [
    ("[variants.a]\nworkloads = '/no/such/dir'\n", "does not exist"),
    ("[variants.a]\nworkloads = '{tmp}/not-a-program.txt'\n", "not-a-program.txt' is not a directory"),
    ("[variants.a]\npython = '{tmp}/not-a-program.txt'\n", "not an executable"),
    # An empty path is the current directory: every module where `ab` was started would be imported.
    ("[variants.a]\nworkloads = ''\n", "variant 'a', workloads: expected a path, got an empty one"),
    ("[variants.a]\npython = ' '\n", "variant 'a', python: expected a path, got an empty one"),
    ("[variants.a]\nenv = { PYTHONPATH = '/tmp' }\n", "cannot be set by a variant"),
    ("[variants.a]\nenv = { 'A B' = '1' }\n", "not a plain name"),
    ("[variants.a]\ncommand = 'rm -rf /'\n", "Extra inputs are not permitted"),
    ("[variants.'../x']\n", "should match pattern"),
    ("[variants.a\n", "not valid TOML"),
    ("[other]\n", "expected only [variants.NAME] tables"),
])
def test_a_bad_variants_file_is_one_clear_line(tmp_path, text, why):
    file = tmp_path / "variants.toml"
    (tmp_path / "not-a-program.txt").write_text("hello")
    file.write_text(text.replace("{tmp}", str(tmp_path)))
    with pytest.raises(VariantError, match=".*".join(map(__import__("re").escape, [str(file), why]))) as caught:
        load_variants(file)
    assert "\n" not in str(caught.value) and "Value error" not in str(caught.value)  # the reason alone, no pydantic prefix


def test_variants_are_picked_by_name_only(tmp_path):
    file = tmp_path / "variants.toml"
    file.write_text(f"[variants.main]\n[variants.venv]\npython = '{sys.executable}'\nenv = {{ X = '1' }}\n")
    variants = load_variants(file)
    a, b = pick(variants, "main", "venv")
    assert a.python is None and b.python == Path(sys.executable).absolute() and b.env == {"X": "1"}
    with pytest.raises(VariantError, match="unknown variant 'other'; declared variants: main, venv"):
        pick(variants, "main", "other")
    with pytest.raises(VariantError, match="no variants file"):
        load_variants(tmp_path / "missing.toml")


def test_a_variants_broken_workload_never_falls_back_to_the_shipped_one(tmp_path):
    (tmp_path / "seed_mlp.py").write_text("raise ImportError('half-edited')\n")
    registry = load_registry(shadowing=[tmp_path])
    assert "seed_mlp" not in registry.workloads and "half-edited" in registry.broken["seed_mlp"]
    with pytest.raises(Exception, match="seed_mlp failed to load: ImportError: half-edited"):
        registry.get("seed_mlp")


def test_a_variants_workloads_shadow_the_shipped_ones(tmp_path):
    (tmp_path / "seed_mlp.py").write_text(
        "from replaybench.workload import Workload\n"
        "WORKLOAD = Workload(name='seed_mlp', description='mine', build=lambda p, d, t: None,\n"
        "                    grid={'batch_size': [1], 'dtype': ['float32']})\n")
    registry = load_registry(shadowing=[tmp_path])
    assert registry.get("seed_mlp").description == "mine" and not registry.broken
    assert load_registry().get("seed_mlp").description != "mine"


# -- end to end ------------------------------------------------------------------------------------
WORKLOAD = """
import time
import torch
from replaybench.workload import Built, Workload

SPIN_S = {spin}  # host work per call, before the layers
SCALE = {scale}  # 1: the same output in both variants


def build(params, device, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32)).to(device, dtype).eval()
    x = torch.randn(params["batch_size"], 32, device=device, dtype=dtype)

    def fn(x):
        end = time.perf_counter() + SPIN_S
        while time.perf_counter() < end:
            pass
        return model(x) * SCALE
    return Built(fn=fn, inputs=(x,))


WORKLOAD = Workload(name="{name}", description="an A/B test workload", build=build,
                    grid={{"batch_size": [1], "dtype": ["float32"]}})
"""


def workloads_dir(path: Path, slowed_spin: float, changed_scale: float) -> Path:
    path.mkdir()
    (path / "ab_slowed.py").write_text(WORKLOAD.format(name="ab_slowed", spin=slowed_spin, scale=1))
    (path / "ab_changed.py").write_text(WORKLOAD.format(name="ab_changed", spin=0, scale=changed_scale))
    return path


def virtualenv(path: Path) -> Path:
    """A virtual environment with an interpreter of its own that sees this one's packages (torch
    included) through a .pth file: another interpreter holding the same torch."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shared = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if os.path.isdir(p)]
    Path(purelib, "parent.pth").write_text("\n".join(shared) + "\n")
    return python


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    dir_a = workloads_dir(root / "a", slowed_spin=0, changed_scale=1)
    dir_b = workloads_dir(root / "b", slowed_spin=300e-6, changed_scale=2)
    python_a, python_b = virtualenv(root / "venv-a"), virtualenv(root / "venv-b")
    file = root / "variants.toml"
    file.write_text(f"""
[variants.base]
workloads = "{dir_a}"
python = "{python_a}"
[variants.candidate]
workloads = "{dir_b}"
python = "{python_b}"
env = {{ REPLAYBENCH_AB_TEST = "candidate" }}
[variants.plain-a]
workloads = "{dir_a}"
[variants.plain-b]
workloads = "{dir_b}"
""")
    return file, python_a, python_b


def cli(*args, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replaybench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}, timeout=900)


@pytest.mark.slow
def test_ab_between_two_interpreters_and_two_workload_directories_through_the_cli(variants, tmp_path):
    file, python_a, python_b = variants
    done = cli("ab", "base", "candidate", "--variants", str(file), "-w", "ab_slowed", "-w", "ab_changed",
               "--processes", "3", "--time-budget", "1", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    rows = out["comparisons"]
    assert out["status"] == "completed" and out["error"] is None and out["failures"] == []
    # The graph modes it could not measure are in the answer, for each config and variant, with the reason.
    assert sorted((r["workload"], r["variant"], r["mode"], r["reason"]) for r in out["skipped"]) == [
        (w, v, "graph", "no CUDA device") for w in ("ab_changed", "ab_slowed") for v in "AB"]
    slowed = {(r["mode"], r["metric"]): r for r in rows if r["workload"] == "ab_slowed"}
    assert set(slowed) == {("eager", "time per call")}  # eager only on the CPU: no graph row to read
    eager = slowed[("eager", "time per call")]
    assert eager["verdict"] == "slower" and eager["ci_low"] > 1.5 and eager["b"] > eager["a"]
    changed = [r for r in rows if r["workload"] == "ab_changed"]
    assert changed and all(r["verdict"] == "not compared" and "B computes something else (output 0 differs from A's: " in r["text"] for r in changed)

    store = Store(f"sqlite:///{tmp_path / 'replaybench.db'}")
    run = store.run()
    assert run.trigger == "ab" and run.status == "completed"
    recorded = run.environment["variants"]
    # Each variant's measuring processes ran its own interpreter, with its own environment.
    assert recorded["A"]["executable"].startswith(str(python_a.parent.parent))
    assert recorded["B"]["executable"].startswith(str(python_b.parent.parent))
    assert recorded["B"]["env"] == "REPLAYBENCH_AB_TEST=candidate" and recorded["A"]["torch"] == recorded["B"]["torch"]
    assert {r.variant for r in run.results} == {"A", "B"}
    report = (tmp_path / "reports" / f"{run.id}.md").read_text()
    assert "# replaybench A/B run" in report and "B slower by" in report and "B computes something else" in report
    assert "- Skipped: CUDA graph replay (no CUDA device)." in report and "| ab_slowed | " in report.split("## Skipped")[1]
    assert str(python_b.parent.parent) in report

    again = cli("compare", str(run.id), "--format", "json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout) == out
    table = cli("compare", str(run.id), cwd=tmp_path)
    assert table.returncode == 0 and "B slower by" in table.stdout
    assert "B against A: within pairs of processes" in " ".join(table.stdout.split())  # which figure to judge by
    assert "skipped: CUDA graph replay (no CUDA device)" in table.stderr and "failed" not in table.stderr
    refused = cli("compare", str(run.id), str(run.id), cwd=tmp_path)
    assert refused.returncode == 2 and "A/B run" in refused.stderr


def test_ab_refuses_bad_input_before_measuring(variants, tmp_path):
    file, _, _ = variants
    unknown = cli("ab", "base", "nope", "--variants", str(file), cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "replaybench: error: unknown variant 'nope'; declared variants: base, candidate, plain-a, plain-b"]
    one = cli("ab", "base", "candidate", "--variants", str(file), "--processes", "1", cwd=tmp_path)
    assert one.returncode == 2 and "processes" in one.stderr and len(one.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "replaybench.db").exists() or Store(f"sqlite:///{tmp_path / 'replaybench.db'}").runs() == []


def test_a_variant_whose_python_cannot_run_a_measuring_process_is_refused_in_one_line(tmp_path):
    """An interpreter without torch, or an executable that is no Python at all, is found before
    anything is stored or started, and named."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    file = tmp_path / "variants.toml"
    file.write_text(f'[variants.a]\n[variants.bare]\npython = "{tmp_path / "bare" / "bin" / "python"}"\n'
                    f'[variants.true]\npython = "{shutil.which("true")}"\n')
    for name, why in (("bare", "cannot run a measuring process: ModuleNotFoundError: No module named "),
                      ("true", "cannot run a measuring process: it ran, but not as a Python interpreter")):
        out = cli("ab", "a", name, "--variants", str(file), "-w", "seed_mlp", cwd=tmp_path)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
        assert out.stderr.startswith(f"replaybench: error: variant {name!r}: its python ") and why in out.stderr, out.stderr
    assert not (tmp_path / "replaybench.db").exists()


def test_an_interpreter_is_probed_once_per_process_and_not_given_stdin(tmp_path, monkeypatch):
    """The CLI checks a variant's interpreter, sets its settings in the environment, then its flow
    checks again in the same process: the second check must not import torch a second time. A
    probe that reads stdin reads nothing, even where stdin is an open pipe."""
    from replaybench import worker
    from replaybench.variants import VARIANTS_VARIABLE, Variant

    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho probed >> {tmp_path / 'calls'}\ncat\necho torch 0.0\n")  # cat: until EOF
    python.chmod(0o755)
    monkeypatch.setattr(worker, "PROBE_TIMEOUT_S", 5.0)
    read_end, write_end = os.pipe()  # stdin that never ends: a probe reading it would wait out its limit
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        variant = Variant(name="fake", python=python)
        worker.check_interpreter(variant)
        monkeypatch.setenv(VARIANTS_VARIABLE, str(tmp_path / "variants.toml"))  # as cmd_ab does before its flow
        worker.check_interpreter(variant)
        assert (tmp_path / "calls").read_text() == "probed\n"
        worker.check_interpreter(Variant(name="other", python=python, env={"REPLAYBENCH_X": "1"}))  # another: tried
        assert (tmp_path / "calls").read_text() == "probed\n" * 2
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


NOT_COMPILABLE = """
import torch
from replaybench.workload import Built, Workload


def build(params, device, dtype):
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32).to(device, dtype).eval()

    def fn(x):
        if {refuse} and torch.compiler.is_compiling():
            return model(x) * 2  # compiled, it computes something else: its check fails
        return model(x)
    return Built(fn=fn, inputs=(torch.randn(1, 32, device=device, dtype=dtype),))


WORKLOAD = Workload(name="ab_compiled", description="", build=build, grid={{"batch_size": [1], "dtype": ["float32"]}})
"""


@pytest.mark.slow
def test_a_mode_failing_in_b_leaves_the_other_modes_compared(tmp_path):
    for name, refuse in (("a", False), ("b", True)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ab_compiled.py").write_text(NOT_COMPILABLE.format(refuse=refuse))
    (tmp_path / "variants.toml").write_text(f"[variants.a]\nworkloads = '{tmp_path / 'a'}'\n"
                                            f"[variants.b]\nworkloads = '{tmp_path / 'b'}'\n")
    done = cli("ab", "a", "b", "--variants", "variants.toml", "-w", "ab_compiled", "--mode", "compile",
               "--processes", "2", "--time-budget", "0.5", "--format", "json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]  # B's failed mode: completed with failures
    out = json.loads(done.stdout)
    rows = {(r["mode"], r["metric"]): r for r in out["comparisons"]}
    assert [(r["variant"], r["mode"], r["phase"]) for r in out["failures"]] == [("B", "compile", "check")]
    assert rows[("eager", "time per call")]["ratio"] is not None
    assert rows[("compile", "time per call")]["verdict"] == "not compared"
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    failed = [r for r in run.results if r.status == "failed"]
    assert [(r.variant, r.mode) for r in failed] == [("B", "compile")] and failed[0].phase == "check"


@pytest.mark.slow
def test_the_ab_deployment_runs_declared_variants_and_refuses_others(variants, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    file, _, _ = variants
    home = tmp_path / "prefect"
    home.mkdir()
    with prefect_server(home) as api:
        env = served_env(api, home, tmp_path, REPLAYBENCH_VARIANTS=str(file))
        args = [sys.executable, "-m", "replaybench.cli", "serve", "--gpu", "0"]
        with background(args, env, tmp_path / "serve.log") as proc, temporary_settings({PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                deadline = time.monotonic() + 180
                while True:
                    try:
                        deployment = client.read_deployment_by_name("replaybench-ab/ab")
                        break
                    except Exception:
                        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                        time.sleep(1)
                form = deployment.parameter_openapi_schema
                assert "plain-b" in json.dumps(form) and "ab_slowed" in json.dumps(form)
                for bad in ({"a": "plain-a", "b": "not-declared"}, {"a": "plain-a", "b": "../../bin/sh"},
                            {"a": "plain-a", "b": "plain-b", "python": "/usr/bin/python3"}):
                    with pytest.raises(Exception, match="(?i)validation|invalid|422|409"):
                        client.create_flow_run_from_deployment(deployment.id, parameters={"parameters": bad})
            flow_run = run_deployment(
                "replaybench-ab/ab", timeout=600, poll_interval=1,
                parameters={"parameters": {"a": "plain-a", "b": "plain-b", "workloads": ["ab_slowed"], "processes": 2,
                                           "time_budget_s": 1}},
            )
            assert flow_run.state.is_completed(), (tmp_path / "serve.log").read_text()[-3000:]
            with get_client(sync_client=True) as client:
                artifacts = [a for a in client.read_artifacts() if a.flow_run_id == flow_run.id]
    run = Store(f"sqlite:///{tmp_path / 'replaybench.db'}").run()
    assert run.trigger == "ab" and run.flow_run_id == str(flow_run.id)
    assert run.environment["variants"]["B"]["workloads"].endswith("/b")
    report = (tmp_path / "reports" / f"{run.id}.md").read_text()
    assert any(a.data == report for a in artifacts)
    assert "ab_slowed" in report and "B against A" in report
