"""The benchmark flows: one run, one task per workload config, one report.

The flow process never times anything: configs go to the measuring processes (replaybench.worker),
each result is committed to the store as soon as it arrives, and the report is rendered at the end
and published as a markdown artifact of the flow run.

With ``shards`` > 1 (the nightly suite on a work pool) the configs are split into shards, each run
as a flow run of the ``replaybench-shard/shard`` deployment, so that every worker on every host
takes part; the parent waits for them and renders one report covering every shard.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import nullcontext
from typing import Annotated, Any, Callable, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from pydantic import Field

from replaybench.health import host_facts
from replaybench.params import RunParameters
from replaybench.report import check_writable, reports_dir, write_report
from replaybench.results import ConfigResult, MeasureSettings
from replaybench.storage import Store
from replaybench.summary import one_line
from replaybench.worker import MeasuringPool
from replaybench.workload import BenchConfig, WorkloadError, check_batch_size, check_dtype, load_registry

Trigger = Literal["nightly", "adhoc", "cli"]
GPU_LIMIT_VARIABLE = "REPLAYBENCH_GPU_LIMIT"
POOL_VARIABLE = "REPLAYBENCH_POOL"
GPU_QUEUE_PREFIX = "gpu-"
SHARD_DEPLOYMENT = "replaybench-shard/shard"

# The run form in the Prefect UI offers the registered workloads, and the server refuses others.
WorkloadName = Literal[tuple(load_registry().names())]  # type: ignore[valid-type]


class FlowParameters(RunParameters):
    workloads: list[WorkloadName] = Field(  # type: ignore[valid-type]
        default_factory=list, description="workloads to measure; empty means every registered workload"
    )


# Set by the CLI to draw a progress bar: called with (configs done, configs in all, one-line result).
progress_hook: Callable[[int, int, str], None] | None = None


@task(cache_policy=NO_CACHE, task_run_name="{config.label}")
def measure_config(
    config: BenchConfig, settings: MeasureSettings, pool: MeasuringPool, store: Store, run_id: int
) -> ConfigResult:
    result = pool.measure(config, settings)
    store.add_result(run_id, result, gpu=gpu_label(pool.environment))  # committed now: a crash later loses nothing
    get_run_logger().info(one_line(result))
    return result


def gpu_label(environment: dict) -> str | None:
    """'host GPU 0 (GPU-1234abcd)': which physical GPU measured a result, for sharded runs."""
    if not environment.get("gpu_name"):
        return None
    index = environment.get("cuda_visible_devices") or "0"
    uuid = (environment.get("gpu_uuid") or "")[:12]
    return f"{environment.get('host') or socket.gethostname()} GPU {index}" + (f" ({uuid})" if uuid else "")


def gpu_lock():
    """Exclusive use of this worker's GPU across every worker, run and person: a global concurrency
    limit of 1 named by the worker (see ``replaybench worker``); strict, so a missing limit is an
    error rather than a silent free-for-all. Without a worker (the CLI), no lock."""
    name = os.environ.get(GPU_LIMIT_VARIABLE)
    return concurrency(name, occupy=1, strict=True, timeout_seconds=None) if name else nullcontext()


def measure_configs(run_id: int, configs: list[BenchConfig], parameters: RunParameters, store: Store) -> None:
    logger = get_run_logger()
    with gpu_lock(), MeasuringPool(parameters.processes, parameters.timeout_s) as pool:
        store.set_environment(run_id, pool.environment)
        settings = parameters.measure_settings()
        for done, config in enumerate(configs, 1):
            result = measure_config(config, settings, pool, store, run_id)
            logger.info("%d/%d configs measured", done, len(configs))
            if progress_hook:
                progress_hook(done, len(configs), one_line(result))


@flow(name="replaybench", flow_run_name="replaybench-{trigger}")
def benchmark(
    parameters: FlowParameters = FlowParameters(),
    trigger: Trigger = "adhoc",
    shards: Annotated[int, Field(ge=1, le=64, description="split the suite over this many shard flow runs")] = 1,
) -> int:
    """Measure eager vs CUDA graph replay for the selected workloads; returns the run id."""
    logger = get_run_logger()
    configs = parameters.configs(load_registry())  # bad input fails here, before any measuring
    directory = check_writable(reports_dir())
    store = Store()
    crashed = store.mark_crashed_runs()
    if crashed:
        logger.warning("marked runs %s as crashed: their process ended before they finished", crashed)
    run_id = store.create_run(trigger, {**parameters.model_dump(mode="json"), "shards": shards}, host_facts())
    store.set_flow_run(run_id, flow_run.get_id())
    logger.info("run %d: %d config(s), modes %s, %d shard(s)", run_id, len(configs), ", ".join(parameters.modes), shards)
    error = None
    try:
        if shards > 1:
            error = run_shards(run_id, configs, parameters, shards)
        else:
            measure_configs(run_id, configs, parameters, store)
    except BaseException as exc:
        store.finish_run(run_id, error=f"{type(exc).__name__}: {exc}")
        raise
    status = store.finish_run(run_id, error=error)
    path, markdown = write_report(store, run_id, directory)
    create_markdown_artifact(markdown=markdown, key="replaybench-report", description=f"replaybench run {run_id}")
    logger.info("run %d %s; report: %s", run_id, status.replace("_", " "), path)
    return run_id


def split(configs: list[BenchConfig], shards: int) -> list[list[BenchConfig]]:
    """Round-robin, so that each shard gets a mix of cheap and expensive workloads."""
    return [s for s in (configs[i::shards] for i in range(shards)) if s]


def run_shards(run_id: int, configs: list[BenchConfig], parameters: RunParameters, shards: int) -> str | None:
    """Start one shard flow run per shard on the work pool, wait for all; returns an error naming
    the shards that did not complete, or None."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    queues = gpu_queues()
    started = []
    for index, shard in enumerate(split(configs, shards)):
        run = run_deployment(
            SHARD_DEPLOYMENT,
            parameters={
                "run_id": run_id,
                "parameters": parameters.model_dump(mode="json"),
                "configs": [{"workload": c.workload, "params": c.params} for c in shard],
            },
            flow_run_name=f"shard-{index + 1}-of-{shards}-run-{run_id}",
            work_queue_name=queues[index % len(queues)] if queues else None,
            timeout=0,  # start it and go on; all shards run at once on the pool's workers
            as_subflow=False,
        )
        started.append((index + 1, run.id))
        logger.info("shard %d: %d config(s), flow run %s, queue %s", index + 1, len(shard), run.id, run.work_queue_name)
    deadline = time.monotonic() + parameters.timeout_s * 2 * len(configs) + 3600
    pending = dict(started)
    states: dict[int, Any] = {}
    with get_client(sync_client=True) as client:
        while pending and time.monotonic() < deadline:
            for index, run_id_ in list(pending.items()):
                state = client.read_flow_run(run_id_).state
                if state is not None and state.is_final():
                    states[index] = state
                    del pending[index]
            time.sleep(2)
    failed = [f"shard {i} {states[i].name if i in states else 'did not finish in time'}" for i, _ in started
              if i not in states or not states[i].is_completed()]
    for line in failed:
        logger.error(line)
    return "; ".join(failed) or None


def gpu_queues() -> list[str]:
    """The per-GPU work queues of this run's pool (one per worker), so that shards spread over GPUs."""
    from prefect.client.orchestration import get_client

    pool = os.environ.get(POOL_VARIABLE)
    if not pool:
        return []
    with get_client(sync_client=True) as client:
        return sorted(q.name for q in client.read_work_queues(work_pool_name=pool) if q.name.startswith(GPU_QUEUE_PREFIX))


@flow(name="replaybench-shard")
def shard(run_id: int, parameters: FlowParameters, configs: list[dict[str, Any]]) -> int:
    """Measure a share of a run's configs into that run (started by ``benchmark`` with shards)."""
    registry = load_registry()
    store = Store()
    selected = [BenchConfig(c["workload"], c["params"]) for c in configs]
    for config in selected:  # refuse anything but registered workloads and valid grid points
        workload = registry.get(config.workload)
        unknown = set(config.params) - set(workload.grid)
        if unknown:
            raise WorkloadError(f"{config.workload}: unknown parameter(s) {', '.join(sorted(unknown))}")
        check_batch_size(config.params.get("batch_size"))
        check_dtype(config.params.get("dtype"))
    measure_configs(run_id, selected, parameters, store)
    return len(selected)
