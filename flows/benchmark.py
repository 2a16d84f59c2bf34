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
import secrets
import signal
import socket
import time
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any, Callable, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.exceptions import TerminationSignal
from prefect.runtime import deployment, flow_run
from prefect.states import Cancelled, Cancelling, Failed
from pydantic import Field

from flows.supervise import WorkerStopping, check_stop, stop_requested
from replaybench.health import host_facts
from replaybench.history import Verdict
from replaybench.limits import CapReached, MeasuringCap
from replaybench.params import RunParameters
from replaybench.report import ReportError, check_output, write_report
from replaybench.results import ConfigResult, MeasureSettings
from replaybench.storage import Store
from replaybench.summary import one_line
from replaybench.unstored import store_result
from replaybench.verdicts import CONFIRMATIONS, acknowledge, judge_run, store_verdicts
from replaybench.worker import GPU_VARIABLE, MeasuringPool
from replaybench.workload import BenchConfig, load_registry

Trigger = Literal["nightly", "adhoc", "cli"]
GPU_LIMIT_VARIABLE = "REPLAYBENCH_GPU_LIMIT"
POOL_VARIABLE = "REPLAYBENCH_POOL"
HOST_VARIABLE = "REPLAYBENCH_HOST"  # this host's name in limit, queue and worker names
NIGHTLY_GPU_WAIT_VARIABLE = "REPLAYBENCH_NIGHTLY_GPU_WAIT_S"
GPU_LEASE_VARIABLE = "REPLAYBENCH_GPU_LEASE_S"
MIN_LEASE_S = 60  # the shortest lease a Prefect server grants
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
# Set by the CLI (`replaybench run --trigger`): the trigger of a run started without a deployment.
cli_trigger: Trigger = "cli"
# Set by the CLI: called with the signal's name once a run is stored as interrupted.
interrupt_hook: Callable[[str], None] | None = None
# Set by the CLI: called with the run id once a run is stored and its report written, before the
# flow's last calls to the Prefect server (which the CLI skips where the server is gone).
finished_hook: Callable[[int], None] | None = None


def publish(store: Store, run_id: int, status: str, directory, key: str, title: str) -> None:
    """Write the finished run's report, tell the CLI it is stored, and show the report as the flow
    run's artifact."""
    status = status.replace("_", " ")
    try:
        path, markdown = write_report(store, run_id, directory)
    except ReportError as exc:  # a template that fails only on this run's data: its results are safe
        raise ReportError(f"{exc}; run {run_id} is stored ({status}): "
                          f"`replaybench report {run_id}` writes its report once that is mended") from None
    if finished_hook:
        finished_hook(run_id)
    create_markdown_artifact(markdown=markdown, key=key, description=f"{title} {run_id}")
    get_run_logger().info("run %d %s; report: %s", run_id, status, path)


def interruption(exc: BaseException) -> str | None:
    """The signal that interrupted a run ('SIGINT', 'SIGTERM'), or None for any other failure."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
    if isinstance(exc, TerminationSignal):
        return signal.Signals(exc.signal).name
    if isinstance(exc, WorkerStopping):
        return f"{exc.signal_name} to the worker"
    return None


def end_run(store: Store, run_id: int, exc: BaseException):
    """A run that did not finish: interrupted (a signal) or failed; what it measured stays. Where
    the worker or serve process running it is stopping, the flow run's final state, Cancelled, to
    be returned by the flow (anything else is re-raised by the caller)."""
    signal_name = interruption(exc)
    store.finish_run(run_id, error=f"{type(exc).__name__}: {exc}", interrupted=signal_name)
    if signal_name and interrupt_hook:
        interrupt_hook(signal_name)
    if stopping := stop_requested():
        return Cancelled(message=f"run {run_id} interrupted: {stopping} to the worker; "
                                 f"{store.configs_kept(run_id)} config(s) kept")
    return None


def refuse_when_stopping():
    """A flow run that starts while its worker is stopping ends at once, Cancelled."""
    if stopping := stop_requested():
        return Cancelled(message=f"not started: {stopping} to the worker")
    return None


def progress(done: int, total: int, line: str) -> None:
    if progress_hook:
        progress_hook(done, total, line)


@task(cache_policy=NO_CACHE, task_run_name="{config.label}")
def measure_config(
    config: BenchConfig, settings: MeasureSettings, pool: MeasuringPool, store: Store, run_id: int,
    cap: MeasuringCap | None = None,
) -> ConfigResult:
    result = pool.measure(config, settings)
    # Committed now: a crash later loses nothing. Rows the database refuses are kept beside the report.
    not_stored = store_result(store, run_id, result, gpu=gpu_label(pool.environment))
    get_run_logger().info(one_line(result))
    if not_stored:
        get_run_logger().error(not_stored)
        if cap:
            cap.not_stored(result)
    return result


def gpu_label(environment: dict) -> str | None:
    """'host GPU 0 (GPU-1234abcd)': which physical GPU measured a result, for sharded runs; host
    and index as the worker names them ($REPLAYBENCH_HOST, $REPLAYBENCH_GPU: a container's)."""
    if not environment.get("gpu_name"):
        return None
    index = os.environ.get(GPU_VARIABLE) or environment.get("cuda_visible_devices") or "0"
    uuid = (environment.get("gpu_uuid") or "")[:12]
    host = os.environ.get(HOST_VARIABLE) or environment.get("host") or socket.gethostname()
    return f"{host} GPU {index}" + (f" ({uuid})" if uuid else "")


def nightly_gpu_wait_s() -> float:
    """How long a nightly run waits for its GPU behind other runs before it fails: the operator's
    ``$REPLAYBENCH_NIGHTLY_GPU_WAIT_S`` (default 3 hours). Ad-hoc runs wait until cancelled."""
    value = os.environ.get(NIGHTLY_GPU_WAIT_VARIABLE, str(3 * 3600))
    try:
        return max(float(value), 1.0)
    except ValueError:
        raise ValueError(f"${NIGHTLY_GPU_WAIT_VARIABLE} must be a number of seconds, not {value!r}") from None


def gpu_lease_s() -> float:
    """The lease on the GPU's concurrency slot: the holder renews it while it measures (every
    three quarters of it); where the holder is killed, the slot is free again once the lease has
    run out and the server has noticed (``PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS``, 15 s
    by default). The operator's ``$REPLAYBENCH_GPU_LEASE_S``, default 300 s (Prefect's), at least 60."""
    value = os.environ.get(GPU_LEASE_VARIABLE, "300")
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not MIN_LEASE_S <= seconds < float("inf"):
        raise ValueError(f"${GPU_LEASE_VARIABLE} must be a number of seconds, at least {MIN_LEASE_S} "
                         f"(the shortest lease a Prefect server grants), not {value!r}")
    return seconds


@contextmanager
def gpu_lock(trigger: str = "adhoc"):
    """Exclusive use of this worker's GPU across every worker, run and person: a global concurrency
    limit of 1 named by the worker (see ``replaybench worker``); strict, so a missing limit is an
    error rather than a silent free-for-all. Without a worker (the CLI), no lock. A nightly run
    waits at most ``nightly_gpu_wait_s`` for it, then fails saying so."""
    name = os.environ.get(GPU_LIMIT_VARIABLE)
    with ExitStack() as held:
        if name:
            wait = nightly_gpu_wait_s() if trigger == "nightly" else None
            try:
                held.enter_context(concurrency(name, occupy=1, strict=True, timeout_seconds=wait, lease_duration=gpu_lease_s()))
            except TimeoutError:
                raise GPUBusy(f"the GPU ({name}) stayed busy with other runs for {wait:.0f} s "
                              f"(${NIGHTLY_GPU_WAIT_VARIABLE}); this nightly run measured nothing") from None
        yield


class GPUBusy(RuntimeError):
    pass


def measure_configs(run_id: int, configs: list[BenchConfig], parameters: RunParameters, store: Store,
                    trigger: str = "adhoc", what: str = "config(s)") -> None:
    """Measure ``configs`` into run ``run_id``; ``CapReached`` once the run has measured for its
    cap (``replaybench.limits``), the configs measured until then stored."""
    logger = get_run_logger()
    cap = MeasuringCap(store, run_id)
    cap.check(len(configs), what)  # a shard whose siblings have used the run's time up
    with gpu_lock(trigger), MeasuringPool(parameters.processes, parameters.timeout_s) as pool:
        store.set_environment(run_id, pool.environment)
        settings = parameters.measure_settings()
        for done, config in enumerate(configs, 1):
            cap.check(len(configs) - done + 1, what)
            result = measure_config(config, settings, pool, store, run_id, cap)
            logger.info("%d/%d configs measured", done, len(configs))
            progress(done, len(configs), one_line(result))
            if done < len(configs):
                check_stop()


def run_trigger() -> Trigger:
    """What started this run: 'nightly' for the nightly deployment's flow runs, 'adhoc' for any
    other deployment's, ``cli_trigger`` when called directly (the CLI). Never a parameter: a form
    must not be able to label its run nightly and so enter the nightly history."""
    name = deployment.name
    if name is None:
        return cli_trigger
    return "nightly" if name == "nightly" else "adhoc"


def run_name() -> str:
    """A deployment's flow run keeps the name it was given (typed in the run form, or Prefect's
    own); a run started without one (the CLI) is named for its trigger."""
    return flow_run.name if deployment.name else f"replaybench-{cli_trigger}"


@flow(name="replaybench", flow_run_name=run_name)
def benchmark(
    parameters: FlowParameters = FlowParameters(),
    shards: Annotated[int, Field(ge=1, le=64, description="split the suite over this many shard flow runs")] = 1,
) -> int:
    """Measure eager vs CUDA graph replay for the selected workloads; returns the run id."""
    if stopping := refuse_when_stopping():
        return stopping
    trigger = run_trigger()
    logger = get_run_logger()
    configs = parameters.configs(load_registry())  # bad input fails here, before any measuring
    directory = check_output()
    store = Store()
    for run_id_, why in resolve_stuck_runs(store):
        logger.warning("run %d marked crashed: %s", run_id_, why)
    run_id = store.create_run(trigger, {**parameters.model_dump(mode="json"), "shards": shards}, host_facts())
    store.set_flow_run(run_id, flow_run.get_id())
    logger.info("run %d: %d config(s), modes %s, %d shard(s)", run_id, len(configs), ", ".join(parameters.modes), shards)
    error = None
    try:
        try:
            if shards > 1:
                error = run_shards(run_id, configs, parameters, shards, store)
            else:
                measure_configs(run_id, configs, parameters, store, trigger)
        except CapReached as exc:  # what it measured is stored; the run fails saying so
            error = str(exc)
            logger.error("run %d: %s", run_id, error)
        if error is None:  # a failed run is not judged: nothing to confirm
            try:
                confirm(run_id, parameters, store)
            except CapReached as exc:  # every config was measured: judged on the confirmations made
                logger.warning("run %d: same-night confirmations stopped: %s", run_id, exc)
    except BaseException as exc:
        if cancelled := end_run(store, run_id, exc):
            return cancelled
        raise
    status = store.finish_run(run_id, error=error)
    if error is None:
        alert(store, run_id, store_verdicts(store, run_id))
    publish(store, run_id, status, directory, "replaybench-report", "replaybench run")
    return run_id


def resolve_stuck_runs(store: Store) -> list[tuple[int, str]]:
    """Runs left 'running' whose Prefect flow run has ended (its process was killed, its host lost)
    are marked crashed, their finished results kept: judged by the flow run's state on the server,
    so that a dead host on a shared database is found from any other. A flow run that a killed
    temporary server never ended is found by its process on this host instead."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    current = str(flow_run.get_id() or "")
    marked = []
    with get_client(sync_client=True) as client:
        for run in store.running_runs():
            if not run.flow_run_id or run.flow_run_id == current:
                continue
            try:
                state = client.read_flow_run(run.flow_run_id).state
            except ObjectNotFound:
                continue
            if state is not None and state.is_final():
                why = f"its flow run ended {state.name} before the run finished"
                store.mark_crashed(run.id, why)
                marked.append((run.id, why))
    marked += [(run_id, "its process on this host ended before it finished") for run_id in store.mark_dead_local_runs()]
    return marked


def confirm(run_id: int, parameters: RunParameters, store: Store) -> None:
    """Same-night confirmation: configs that look off against the nightly history tonight (a step,
    tonight alone off its level, or a possible recent step), at most ``parameters.confirm_limit``
    of them, are measured CONFIRMATIONS more times, each time by a fresh pool of measuring
    processes and after the others, so that each is a fresh draw of the host's state; stored as
    repeats, so that their verdicts rest on every measurement and a real step is reported on its
    first night or soon after."""
    if not parameters.confirm_limit:
        return
    run = store.run(run_id)
    rows = {r.id: r for r in run.results}
    off: dict[str, BenchConfig] = {}
    for result_id, j in judge_run(store, run).items():
        if j.verdict in (Verdict.SLOWER, Verdict.FASTER) or (j.verdict is Verdict.UNCERTAIN and j.since is not None):
            r = rows[result_id]
            off.setdefault(BenchConfig(r.workload, r.params).key, BenchConfig(r.workload, r.params))
    configs = list(off.values())[: parameters.confirm_limit]
    if not configs:
        return
    logger = get_run_logger()
    logger.info("run %d: %d config(s) look off tonight; measuring them %d more times in fresh processes",
                run_id, len(configs), CONFIRMATIONS)
    settings = parameters.measure_settings()
    cap = MeasuringCap(store, run_id)
    left = CONFIRMATIONS * len(configs)
    for repeat in range(1, CONFIRMATIONS + 1):
        cap.check(left, "same-night confirmation(s)")
        with gpu_lock(run.trigger), MeasuringPool(parameters.processes, parameters.timeout_s) as pool:
            for config in configs:
                cap.check(left, "same-night confirmation(s)")
                result = pool.measure(config, settings)
                left -= 1
                not_stored = store_result(store, run_id, result, gpu=gpu_label(pool.environment), repeat=repeat)
                logger.info("confirmation %d: %s", repeat, one_line(result))
                if not_stored:
                    logger.error(not_stored)
                    cap.not_stored(result)


def alert(store: Store, run_id: int, verdicts: dict) -> None:
    """A Prefect event per regression or improvement found tonight (see the README for an
    automation that sends them on). The resource's labels name the config, figure and change."""
    from prefect.events import emit_event

    rows = {r.id: r for r in store.run(run_id).results}
    seen = set()
    for result_id, j in verdicts.items():
        r = rows[result_id]
        if j.verdict not in (Verdict.SLOWER, Verdict.FASTER) or (r.workload, r.params_key, r.mode) in seen:
            continue
        seen.add((r.workload, r.params_key, r.mode))
        label = BenchConfig(r.workload, r.params).label
        kind = "regression" if j.verdict is Verdict.SLOWER else "improvement"
        emit_event(
            event=f"replaybench.{kind}.detected",
            resource={
                "prefect.resource.id": f"replaybench.config.{r.workload}.{r.mode}.{r.params_key}",
                "prefect.resource.name": f"{label} {r.mode}",
                "replaybench.workload": r.workload,
                "replaybench.config": label,
                "replaybench.mode": r.mode,
                "replaybench.change": f"{j.change:+.1%}" if j.change is not None else "",
                "replaybench.cause": j.cause or "",
                "replaybench.run": str(run_id),
            },
            payload={"verdict": j.verdict.value, "change": j.change, "reason": j.reason, "run_id": run_id,
                     "since_run_id": j.since},
        )


def split(configs: list[BenchConfig], shards: int) -> list[list[BenchConfig]]:
    """Round-robin, so that each shard gets a mix of cheap and expensive workloads."""
    return [s for s in (configs[i::shards] for i in range(shards)) if s]


def run_shards(run_id: int, configs: list[BenchConfig], parameters: RunParameters, shards: int, store: Store) -> str | None:
    """Start one shard flow run per shard on the work pool, wait for all; returns an error naming
    the shards that did not complete, or None."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    queues = gpu_queues()
    started = []
    for index, shard in enumerate(split(configs, shards)):
        token = secrets.token_urlsafe(16)
        store.add_shard(run_id, token, [{"workload": c.workload, "params": c.params} for c in shard])
        run = run_deployment(
            SHARD_DEPLOYMENT,
            parameters={"run_id": run_id, "token": token},
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
            try:
                check_stop()
            except WorkerStopping:  # this worker is stopping: so is the run, shards elsewhere too
                for run_id_ in pending.values():
                    client.set_flow_run_state(run_id_, Cancelling(message="the run's parent was stopped"), force=True)
                raise
            time.sleep(2)
    failed = [f"shard {i} " + (f"{states[i].name}" + (f": {states[i].message}" if states[i].message else "")
                               if i in states else "did not finish in time")
              for i, _ in started if i not in states or not states[i].is_completed()]
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
def shard(run_id: int, token: Annotated[str, Field(max_length=64)]) -> int:
    """Measure a share of a running run's configs into that run: the share its parent recorded
    under ``token`` (``run_shards``), with the run's own parameters; claimed once, so that no form
    can add rows to a run or measure anything its parent did not hand out."""
    if stopping := refuse_when_stopping():
        return stopping
    store = Store()
    stored, configs, trigger = store.claim_shard(run_id, token)
    parameters = FlowParameters(**{k: v for k, v in stored.items() if k in FlowParameters.model_fields})
    try:
        measure_configs(run_id, [BenchConfig(c["workload"], c["params"]) for c in configs], parameters, store, trigger,
                        what="config(s) of this shard")
    except WorkerStopping as exc:  # the parent run stores the interruption
        return Cancelled(message=str(exc))
    except CapReached as exc:  # the parent names it in the run's error
        get_run_logger().error("run %d: %s", run_id, exc)
        return Failed(message=str(exc))
    return len(configs)


RegressionId = Annotated[str, Field(pattern=r"^[0-9]{1,12}:[A-Za-z_]{1,64}$",
                                    description="as `replaybench regressions` or a report's open regressions list it, e.g. 4512:GPU_time")]


@flow(name="replaybench-ack")
def ack(regression: RegressionId, note: Annotated[str, Field(max_length=500)] = "") -> str:
    """Acknowledge an open regression: reports stop listing it. Refused unless it is open."""
    o = acknowledge(Store(), regression, note or None)
    text = f"acknowledged: {o.workload} {o.mode} {o.metric} {o.change:+.1%} since run {o.first_run_id}"
    get_run_logger().info(text)
    return text
