"""The A/B flow: one run in which two variants of the code under test are measured side by side
(``replaybench.ab``), stored with their comparisons, and reported.

The variants are read on the measuring host from its variants file (``replaybench.variants``): the
form offers the names declared there when the deployment was made, and the flow checks again when
it runs. Nothing in the parameters names a path, an interpreter or a variable.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from pydantic import Field

from flows.benchmark import end_run, gpu_label, gpu_lock, progress, publish, refuse_when_stopping
from flows.supervise import check_stop
from replaybench.ab import ABPool, ABResult
from replaybench.health import host_facts
from replaybench.limits import CapReached, MeasuringCap
from replaybench.params import ABParameters
from replaybench.report import check_output
from replaybench.results import MeasureSettings
from replaybench.storage import Store
from replaybench.unstored import store_result
from replaybench.variants import VariantName, declared_names, load_variants, pick
from replaybench.worker import check_interpreter
from replaybench.workload import BenchConfig, load_registry


def _offered_workloads() -> list[str]:
    """Workloads of the shipped registry and of every declared variant's directory."""
    names = set(load_registry().names())
    for variant in load_variants().values() if declared_names() else []:
        if variant.workloads:
            names |= set(load_registry(shadowing=[variant.workloads]).names())
    return sorted(names)


_VARIANTS = declared_names()
# The form offers the variants declared on this host; the server refuses any other name.
VariantChoice = Literal[tuple(_VARIANTS)] if _VARIANTS else VariantName  # type: ignore[valid-type]
WorkloadName = Literal[tuple(_offered_workloads())]  # type: ignore[valid-type]


class ABFlowParameters(ABParameters):
    a: VariantChoice = Field(description="variant A, the baseline: a name from the worker's variants file")  # type: ignore[valid-type]
    b: VariantChoice = Field(description="variant B, compared against A")  # type: ignore[valid-type]
    workloads: list[WorkloadName] = Field(  # type: ignore[valid-type]
        default_factory=list, description="workloads to measure; empty means every registered workload"
    )


@task(cache_policy=NO_CACHE, task_run_name="{config.label}")
def measure_pair(config: BenchConfig, settings: MeasureSettings, pool: ABPool, store: Store, run_id: int,
                 min_effect: float, cap: MeasuringCap | None = None) -> ABResult:
    result = pool.measure(config, settings, min_effect)
    not_stored = store_result(store, run_id, result, gpu=gpu_label(pool.environment(0)))  # committed now
    logger = get_run_logger()
    if not_stored:
        logger.error(not_stored)
        if cap:
            cap.not_stored(result)
    for c in result.comparisons:
        logger.info("%s %s %s: %s", config.label, c.mode, c.metric, c.text)
    return result


def variant_facts(variant, environment: dict) -> dict:
    """What the run records of a variant: its declaration and what its measuring process saw."""
    return {**variant.describe(), "torch": environment.get("torch"), "cuda": environment.get("cuda"),
            "executable": environment.get("executable"), "workloads_broken": environment.get("workloads_broken") or {}}


@flow(name="replaybench-ab")
def ab(parameters: ABFlowParameters) -> int:
    """Measure variants A and B of the code under test side by side; returns the run id."""
    if stopping := refuse_when_stopping():
        return stopping
    logger = get_run_logger()
    a, b = pick(load_variants(), parameters.a, parameters.b)  # declared on this host, checked now
    for variant in (a, b):
        check_interpreter(variant)
    configs = parameters.configs(load_registry(shadowing=[a.workloads] if a.workloads else []))
    directory = check_output()
    store = Store()
    run_id = store.create_run("ab", parameters.model_dump(mode="json"), host_facts())
    store.set_flow_run(run_id, flow_run.get_id())
    logger.info("run %d: A/B, %s against %s, %d config(s)", run_id, b.name, a.name, len(configs))
    error = None
    cap = MeasuringCap(store, run_id)
    try:
        with gpu_lock(), ABPool(a, b, parameters.processes, parameters.timeout_s) as pool:
            env_a, env_b = pool.environment(0), pool.environment(1)
            store.set_environment(run_id, {**env_a, "variants": {"A": variant_facts(a, env_a), "B": variant_facts(b, env_b)}})
            settings = parameters.measure_settings()
            for done, config in enumerate(configs, 1):
                cap.check(len(configs) - done + 1)
                result = measure_pair(config, settings, pool, store, run_id, parameters.min_effect, cap)
                progress(done, len(configs), f"{config.label}: " + "; ".join(c.text for c in result.comparisons[:1]))
                if done < len(configs):
                    check_stop()
    except CapReached as exc:  # what it measured is stored; the run fails saying so
        error = str(exc)
        logger.error("run %d: %s", run_id, error)
    except BaseException as exc:
        if cancelled := end_run(store, run_id, exc):
            return cancelled
        raise
    status = store.finish_run(run_id, error=error)
    publish(store, run_id, status, directory, "replaybench-ab", "replaybench A/B run")
    return run_id
