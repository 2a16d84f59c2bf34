"""Work pool, per-GPU concurrency limits, workers and serving: idempotent, safe to run again."""

from __future__ import annotations

import os
import socket
import sys

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists

from flows.benchmark import GPU_LIMIT_VARIABLE, GPU_QUEUE_PREFIX, HOST_VARIABLE, POOL_VARIABLE
from replaybench.worker import GPU_VARIABLE

DEFAULT_POOL = "gpu"
QUERY_SECONDS = 2  # how often workers and `serve` ask the server for runs to start


def host_label(host: str | None = None) -> str:
    """The name of this host in concurrency limit, queue and worker names: $REPLAYBENCH_HOST where
    set (a container's own hostname is random, and is not the host's), else the hostname."""
    return host or os.environ.get(HOST_VARIABLE) or socket.gethostname()


def gpu_limit_name(gpu: str, host: str | None = None) -> str:
    """One global concurrency limit per physical GPU: host plus the GPU's index on that host."""
    return f"replaybench-gpu-{host_label(host)}-{gpu}"


def gpu_queue_name(gpu: str, host: str | None = None) -> str:
    return f"{GPU_QUEUE_PREFIX}{host_label(host)}-{gpu}"


def ensure_gpu_limit(name: str) -> None:
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)


def ensure_pool(pool: str = DEFAULT_POOL) -> bool:
    """Create the process work pool; False if it existed already."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            return True
        except ObjectAlreadyExists:
            return False


def ensure_queue(pool: str, queue: str) -> None:
    """A worker polling a queue that does not exist picks up nothing at all: create it first."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_queue(name=queue, work_pool_name=pool)
        except ObjectAlreadyExists:
            pass


def setup(pool: str, gpus: list[str]) -> list[str]:
    ensure_pool(pool)
    names = [gpu_limit_name(g) for g in gpus]
    for gpu, name in zip(gpus, names):
        ensure_gpu_limit(name)
        ensure_queue(pool, gpu_queue_name(gpu))
    return names


def worker_command(pool: str, gpu: str, device: str | None = None) -> list[str]:
    """The command of a Prefect process worker pinned to one GPU, with this process's environment
    set for it: flow runs it starts inherit the GPU and the name of its concurrency limit.

    ``gpu`` is the GPU's index on the host: it names the limit and the queue and picks the cores of
    the measuring processes (``replaybench.worker.gpu_slot``). ``device`` is what the flow runs get
    as CUDA_VISIBLE_DEVICES, ``gpu`` unless given: in a container that sees only its GPU, "0"."""
    (name,) = setup(pool, [gpu])
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu if device is None else device
    os.environ[GPU_VARIABLE] = gpu
    os.environ[GPU_LIMIT_VARIABLE] = name
    os.environ[POOL_VARIABLE] = pool
    # Prefect's default polls for runs every 10 s: an ad-hoc run, and each shard of a nightly run,
    # would wait 5 s on average before it starts. A poll is one small API call.
    os.environ.setdefault("PREFECT_WORKER_QUERY_SECONDS", str(QUERY_SECONDS))
    # Two slots: a sharded run's parent only waits, so it must not keep a shard from this worker;
    # the GPU's concurrency limit still lets one measurement at a time onto the GPU. The worker's
    # own queue lets a sharded run send each shard to a different GPU.
    prefect = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", "2",
               "--work-queue", "default", "--work-queue", gpu_queue_name(gpu),
               "--name", f"replaybench-{host_label()}-gpu{gpu}"]
    return prefect


def serve(cron: str, timezone: str, gpu: str) -> None:
    """Serve every deployment from this process (a single box, no work pool)."""
    from prefect import serve as prefect_serve

    from flows.deployments import deployments

    name = gpu_limit_name(gpu)
    ensure_gpu_limit(name)
    os.environ[GPU_LIMIT_VARIABLE] = name
    prefect_serve(*deployments(cron, timezone), limit=1, query_seconds=QUERY_SECONDS)
