"""The benchmark flow: one run, one task per workload config, one report.

The flow process never times anything: configs go to a measuring process (replaybench.worker),
each result is committed to the store as soon as it arrives, and the report is rendered at the end
and published as a markdown artifact of the flow run.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from replaybench.health import host_facts
from replaybench.params import RunParameters
from replaybench.report import check_writable, reports_dir, write_report
from replaybench.results import ConfigResult, MeasureSettings
from replaybench.storage import Store
from replaybench.summary import one_line
from replaybench.worker import MeasuringPool
from replaybench.workload import BenchConfig, load_registry

Trigger = Literal["nightly", "adhoc", "cli"]


@task(cache_policy=NO_CACHE, task_run_name="{config.label}")
def measure_config(
    config: BenchConfig, settings: MeasureSettings, process: MeasuringPool, store: Store, run_id: int
) -> ConfigResult:
    result = process.measure(config, settings)
    store.add_result(run_id, result)  # committed now: a crash later loses nothing measured
    get_run_logger().info(one_line(result))
    return result


@flow(name="replaybench", flow_run_name="replaybench-{trigger}")
def benchmark(parameters: RunParameters = RunParameters(), trigger: Trigger = "adhoc") -> int:
    """Measure eager vs CUDA graph replay for the selected workloads; returns the run id."""
    logger = get_run_logger()
    configs = parameters.configs(load_registry())  # bad input fails here, before any measuring
    directory = check_writable(reports_dir())
    store = Store()
    crashed = store.mark_crashed_runs()
    if crashed:
        logger.warning("marked runs %s as crashed: their process ended before they finished", crashed)
    run_id = store.create_run(trigger, parameters.model_dump(mode="json"), host_facts())
    store.set_flow_run(run_id, flow_run.get_id())
    logger.info("run %d: %d config(s), modes %s", run_id, len(configs), ", ".join(parameters.modes))
    try:
        with MeasuringPool(parameters.processes, parameters.timeout_s) as process:
            store.set_environment(run_id, process.environment)
            settings = parameters.measure_settings()
            for config in configs:
                measure_config(config, settings, process, store, run_id)
    except BaseException as exc:
        store.finish_run(run_id, error=f"{type(exc).__name__}: {exc}")
        raise
    status = store.finish_run(run_id)
    path, markdown = write_report(store, run_id, directory)
    create_markdown_artifact(markdown=markdown, key="replaybench-report", description=f"replaybench run {run_id}")
    logger.info("run %d %s; report: %s", run_id, status.replace("_", " "), path)
    return run_id
