"""The capture-plan flow: which batch sizes to capture for one workload under a traffic, within a
graph-memory budget (``replaybench.planning``), measured in one measuring process on this worker's
GPU, stored, and reported (``templates/plan.md.j2``, also a markdown artifact of the flow run).

The form takes the traffic as a preset or as weights, never as a path: a file of observed batch
sizes is read by the CLI (``replaybench plan --traffic-file``), which hands it over as ``cli_traffic``.
"""

from __future__ import annotations

import os
from typing import Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from pydantic import Field

from flows.benchmark import end_run, gpu_lock, publish, refuse_when_stopping
from flows.supervise import check_stop
from replaybench.health import host_facts
from replaybench.params import PlanParameters, max_run_s
from replaybench.plan import Traffic
from replaybench.planning import PlanFailed, make_plan, resolve_traffic
from replaybench.report import check_output
from replaybench.storage import Store
from replaybench.unstored import store_plan
from replaybench.worker import MeasuringProcess, gpu_slot, measuring_cores
from replaybench.workload import load_registry

# The form offers the registered workloads, and the server refuses others.
WorkloadName = Literal[tuple(load_registry().names())]  # type: ignore[valid-type]
# Set by the CLI: the traffic read from a file of observed batch sizes, used instead of ``traffic``.
cli_traffic: Traffic | None = None


class PlanFlowParameters(PlanParameters):
    workload: WorkloadName = Field("gpt_decode_step", description="the workload to plan captures for")  # type: ignore[valid-type]


@flow(name="replaybench-plan")
def plan(parameters: PlanFlowParameters = PlanFlowParameters()) -> int:
    """Measure which batch sizes to capture for a workload and traffic; returns the run id."""
    if stopping := refuse_when_stopping():
        return stopping
    logger = get_run_logger()
    registry = load_registry()
    config = parameters.config(registry)  # bad input fails here, before any measuring
    max_run_s()  # a malformed operator cap too
    resolve_traffic(parameters, cli_traffic)
    directory = check_output()
    store = Store()
    run_id = store.create_run("plan", {**parameters.model_dump(mode="json"),
                                       **({"traffic": cli_traffic.source} if cli_traffic else {})}, host_facts())
    store.set_flow_run(run_id, flow_run.get_id())
    logger.info("run %d: capture plan for %s, sizes %s", run_id, config.label, parameters.candidates)
    error = None
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
    try:
        with gpu_lock(), MeasuringProcess(measuring_cores(cores, 1, gpu_slot())[0], parameters.timeout_s) as process:
            store.set_environment(run_id, process.environment)
            # Between steps, a stopping worker stops the plan (Cancelled), as it stops a run between configs.
            data = make_plan(parameters, registry, process.request, traffic=cli_traffic,
                             say=lambda line: (check_stop(), logger.info(line)))
        if not_stored := store_plan(store, run_id, data, directory):
            logger.error(not_stored)
    except PlanFailed as exc:
        error = str(exc)
        logger.error("run %d failed: %s", run_id, error)
        keep_partial(store, run_id, exc.partial, directory, logger)
    except BaseException as exc:
        if cancelled := end_run(store, run_id, exc):
            return cancelled
        raise
    status = store.finish_run(run_id, error=error)
    publish(store, run_id, status, directory, "replaybench-plan", "replaybench capture plan, run")
    return run_id


def keep_partial(store: Store, run_id: int, partial: dict | None, directory, logger) -> None:
    """Store what a failed plan measured; whatever goes wrong there, the run still ends failed."""
    if not partial or not partial["sizes"]:
        return
    try:
        if not_stored := store_plan(store, run_id, partial, directory):
            logger.error(not_stored)
    except Exception as exc:  # the store is unreachable: the failure itself is what must be recorded
        logger.error("run %d: what the plan measured could not be kept: %s", run_id, exc)
