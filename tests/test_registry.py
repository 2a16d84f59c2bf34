import pytest
from pydantic import ValidationError

from replaybench.params import RunParameters
from replaybench.workload import WorkloadError, expand, load_registry


def test_seed_mlp_is_registered_with_the_seed_config():
    registry = load_registry()
    assert "seed_mlp" in registry.names()
    configs = expand(registry, ["seed_mlp"])
    assert [c.params for c in configs] == [{"batch_size": 1, "dtype": "float32", "width": 128}]


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(WorkloadError, match=r"unknown workload 'nope'.*known workloads: .*seed_mlp"):
        expand(load_registry(), ["nope"])


def test_narrowing_and_full_grid():
    registry = load_registry()
    configs = expand(registry, ["seed_mlp"], {"batch_size": [2, 4], "dtype": ["bfloat16"]})
    assert sorted(c.params["batch_size"] for c in configs) == [2, 4]
    assert {c.params["dtype"] for c in configs} == {"bfloat16"}
    full = expand(registry, ["seed_mlp"], full=True)
    assert len(full) == 3 * 2 * 2


def test_a_workloads_path_entry_that_is_no_directory_is_listed_as_broken(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYBENCH_WORKLOADS_PATH", str(tmp_path / "typo"))
    registry = load_registry()
    assert registry.broken == {str(tmp_path / "typo"): f"WorkloadError: {str(tmp_path / 'typo')!r} is not a directory"}
    assert "seed_mlp" in registry.names()  # the others still load
    with pytest.raises(WorkloadError, match=f"unknown workload 'mine'; .*; {str(tmp_path / 'typo')} could not be loaded"):
        registry.get("mine")


def test_a_workload_or_value_named_twice_is_measured_once():
    registry = load_registry()
    twice = expand(registry, ["seed_mlp", "seed_mlp", "deep_mlp"], {"batch_size": [1, 1, 2], "width": [128, 128]})
    once = expand(registry, ["seed_mlp", "deep_mlp"], {"batch_size": [1, 2], "width": [128]})
    assert [(c.workload, c.params) for c in twice] == [(c.workload, c.params) for c in once]
    assert len({(c.workload, c.key) for c in twice}) == len(twice) > 2


def test_a_value_equal_to_a_declared_one_is_taken_as_declared_and_one_of_another_kind_is_refused():
    """A form may send 128.0 for the width 128: the workload is built with the declared 128 (a float
    would fail to build a tensor), and the run's labels and history name it as a CLI run does."""
    registry = load_registry()
    (config,) = RunParameters(workloads=["seed_mlp"], sizes={"width": [128.0]}).configs(registry)
    assert config.params["width"] == 128 and type(config.params["width"]) is int
    assert config.key == expand(registry, ["seed_mlp"], {"width": [128]})[0].key
    with pytest.raises(WorkloadError, match="width=128.5 is not one of its values"):
        expand(registry, ["seed_mlp"], {"width": [128.5]})
    with pytest.raises(WorkloadError, match="width='128' is not one of its values"):
        expand(registry, ["seed_mlp"], {"width": ["128"]})


@pytest.mark.parametrize(
    "narrow, message",
    [
        ({"batch_size": [0]}, "at least 1"),
        ({"batch_size": [-3]}, "at least 1"),
        ({"batch_size": [10**9]}, "larger than the limit"),
        ({"dtype": ["float8"]}, "unknown dtype 'float8'"),
        ({"colour": ["red"]}, "unknown parameter"),
    ],
)
def test_bad_narrowing_is_refused(narrow, message):
    with pytest.raises(WorkloadError, match=message):
        expand(load_registry(), ["seed_mlp"], narrow)


def test_run_parameters_bounds():
    for bad in ({"batch_sizes": [0]}, {"dtypes": ["int8"]}, {"time_budget_s": 0}, {"precision": 2}, {"modes": ["turbo"]},
                {"module": "os"}):
        with pytest.raises(ValidationError):
            RunParameters(**bad)
    assert RunParameters(modes=["graph"]).measure_settings().modes == ["eager", "graph"]


def test_malformed_workloads_are_reported_by_name_and_do_not_stop_others(tmp_path):
    (tmp_path / "no_workload.py").write_text("X = 1\n")
    (tmp_path / "import_error.py").write_text("import does_not_exist\n")
    (tmp_path / "bad_grid.py").write_text(
        "from replaybench.workload import Workload\n"
        "WORKLOAD = Workload(name='bad_grid', description='', build=lambda p, d, t: None, grid={'dtype': ['float32']})\n"
    )
    (tmp_path / "bad_dtype.py").write_text(
        "from replaybench.workload import Workload\n"
        "WORKLOAD = Workload(name='bad_dtype', description='', build=lambda p, d, t: None,"
        " grid={'batch_size': [1], 'dtype': ['float99']})\n"
    )
    (tmp_path / "good_one.py").write_text(
        "from replaybench.workload import Workload\n"
        "WORKLOAD = Workload(name='good_one', description='', build=lambda p, d, t: None,"
        " grid={'batch_size': [1], 'dtype': ['float32']})\n"
    )
    registry = load_registry([tmp_path])
    assert {"seed_mlp", "good_one"} <= set(registry.names())
    assert "no WORKLOAD" in registry.broken["no_workload"]
    assert "ModuleNotFoundError" in registry.broken["import_error"]
    assert "batch_size" in registry.broken["bad_grid"]
    assert "float99" in registry.broken["bad_dtype"]
    with pytest.raises(WorkloadError, match="bad_grid failed to load"):
        registry.get("bad_grid")
