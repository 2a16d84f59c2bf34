"""Every built-in workload on the CPU: it builds, runs, returns what it should, from a reproducible
state, and goes through the real engine. Capture itself needs a GPU (test_gpu.py)."""

import ast
import importlib
import inspect

import pytest
import torch

from replaybench.engine import measure
from replaybench.results import MeasureSettings
from replaybench.workload import BenchConfig, load_registry

REGISTRY = load_registry()
CPU = torch.device("cpu")
F32 = torch.float32
INT64 = torch.int64

# name -> expected outputs for params: a list of (shape, dtype), one per returned tensor
EXPECTED = {
    "seed_mlp": lambda p: [((p["batch_size"], p["width"]), F32)],
    "deep_mlp": lambda p: [((p["batch_size"], 128), F32)],
    "transformer_encoder": lambda p: [((p["batch_size"], p["seq_len"], 256), F32)],
    "gpt_decode_step": lambda p: [((p["batch_size"], 2048), F32)],
    "gpt_multi_step": lambda p: [((p["batch_size"], p["steps"]), INT64), ((p["batch_size"], 2048), F32)],
    "resnet_small": lambda p: [((p["batch_size"], 10), F32)],
    "mobile_block": lambda p: [((p["batch_size"], 10), F32)],
    "rnn_unrolled": lambda p: [((p["batch_size"], 128), F32)],
    "recommender": lambda p: [((p["batch_size"], 1), F32)],
    "pointwise_chain": lambda p: [((p["batch_size"], 256), F32)],
    "sdpa_attention": lambda p: [((p["batch_size"], p["seq_len"], 512), F32)],
}
NAMES = sorted(EXPECTED)
STATEFUL = {"gpt_decode_step", "gpt_multi_step"}

# What would make a CUDA call wait for the host (or cannot be captured) if it appeared in a workload.
HOST_SYNC_ATTRIBUTES = {"item", "cpu", "tolist", "numpy", "nonzero", "synchronize"}


def smallest(workload) -> dict:
    """The cheapest config: the least of each numeric grid key, float32, else the first value."""
    params = {}
    for key, values in workload.grid.items():
        if key == "dtype":
            params[key] = "float32"
        elif all(isinstance(v, (int, float)) for v in values):
            params[key] = min(values)
        else:
            params[key] = values[0]
    return params


def outputs(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (out,)
    assert isinstance(out, tuple) and out and all(isinstance(o, torch.Tensor) for o in out), type(out)
    return out


def call(built) -> tuple:
    return tuple(o.clone() for o in outputs(built.fn(*built.inputs)))


def build(name, params):
    return REGISTRY.get(name).build(dict(params), CPU, F32)


def check_outputs(name, params, got):
    expected = EXPECTED[name](params)
    assert [(tuple(o.shape), o.dtype) for o in got] == expected, params
    for o in got:
        if o.is_floating_point():
            assert torch.isfinite(o).all(), f"{name} {params}: non-finite output"


def test_every_builtin_workload_is_covered_and_loads():
    assert not REGISTRY.broken
    builtin = {n for n in REGISTRY.names() if REGISTRY.get(n).source.startswith("workloads.")}
    assert builtin == set(EXPECTED), "give every built-in workload its expected outputs here"


@pytest.mark.parametrize("name", NAMES)
def test_metadata_and_default_grid(name):
    workload = REGISTRY.get(name)
    module = importlib.import_module(workload.source)
    first_line = (module.__doc__ or "").strip().splitlines()[0].strip() if (module.__doc__ or "").strip() else ""
    assert first_line, f"{name}: module docstring has no first line"
    assert workload.description.strip() and "\n" not in workload.description
    configs = list(workload.configs())
    assert 1 <= len(configs) <= 3, f"{name}: {len(configs)} default configs"
    assert all(c.params["dtype"] == "float32" for c in configs)


@pytest.mark.parametrize("name", NAMES)
def test_forward_has_no_host_synchronisation(name):
    """No .item(), .cpu(), .tolist(), nonzero ... anywhere in the module's code (strings aside)."""
    tree = ast.parse(inspect.getsource(importlib.import_module(REGISTRY.get(name).source)))
    found = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in HOST_SYNC_ATTRIBUTES
    ]
    assert not found, f"{name}: {found}"


@pytest.mark.parametrize("name", NAMES)
def test_smallest_config_runs_with_the_expected_outputs_from_a_reproducible_state(name):
    params = smallest(REGISTRY.get(name))
    torch.manual_seed(0)
    with torch.inference_mode():
        built = build(name, params)
        assert isinstance(built.inputs, tuple)
        if name in STATEFUL:
            assert built.reset is not None, f"{name} mutates state and must provide reset"
        if built.reset:
            built.reset()
        first = call(built)
        check_outputs(name, params, first)
        if built.reset:
            built.reset()
        again = call(built)
    for a, b in zip(first, again, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_decode_step_advances_the_cache_and_reset_restores_it():
    params = smallest(REGISTRY.get("gpt_decode_step"))
    torch.manual_seed(0)
    with torch.inference_mode():
        built = build("gpt_decode_step", params)
        model = built.fn.__self__
        built.reset()
        first = call(built)[0]
        assert int(model.pos) == model.prompt_len + 1
        second = call(built)[0]
        assert not torch.equal(first, second), "a second step from the advanced cache gave the same logits"
        built.reset()
        assert int(model.pos) == model.prompt_len and not model.cache.any()
        torch.testing.assert_close(call(built)[0], first, rtol=0, atol=0)
        # the position wraps instead of running off the cache
        for _ in range(params["cache_len"]):
            built.fn(*built.inputs)
        assert int(model.pos) == model.prompt_len + 1


def test_multi_step_generates_what_single_steps_generate():
    params = {**smallest(REGISTRY.get("gpt_multi_step"))}
    torch.manual_seed(0)
    with torch.inference_mode():
        built = build("gpt_multi_step", params)
        decoder = built.fn.decoder
        built.reset()
        tokens, logits = call(built)
        built.reset()
        token = built.inputs[0]
        for i in range(params["steps"]):
            step_logits = decoder.step(token)
            token = step_logits.argmax(-1)
            assert torch.equal(token, tokens[:, i])
        torch.testing.assert_close(step_logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize(
    "name, params",
    [(name, c.params) for name in NAMES for c in REGISTRY.get(name).configs()],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={v[k]}" for k in sorted(v) if k not in ("dtype",)),
)
def test_every_default_config_builds_and_runs(name, params):
    with torch.inference_mode():
        built = build(name, params)
        if built.reset:
            built.reset()
        check_outputs(name, params, call(built))


SETTINGS = MeasureSettings(time_budget_s=0.1, block_s=0.002, warmup_iters=2, min_units=6, force_cpu=True)


@pytest.mark.parametrize("name", NAMES)
def test_engine_measures_eager_and_skips_graph_on_the_cpu(name):
    config = BenchConfig(name, smallest(REGISTRY.get(name)))
    result = measure(config, SETTINGS, REGISTRY)
    eager, graph = result.mode("eager"), result.mode("graph")
    assert eager.status == "ok", eager.reason
    # A tenth of a second of rounds: at least one round of units, whatever the host's state.
    assert len(eager.throughput.blocks) >= 2 and eager.throughput.value > 0
    assert graph.status == "skipped" and graph.reason == "no CUDA device"
