"""Deployments: ``nightly`` (cron schedule, the default suite), ``adhoc`` (no schedule, started from
the Prefect UI's run form), ``shard`` (started by a sharded nightly run), ``ack`` (acknowledge an
open regression from the UI), ``ab`` (two variants declared on the host, side by side) and ``plan``
(which batch sizes to capture for serving a workload). ``replaybench serve`` serves them from one process on a single box;
``prefect.yaml`` declares the same for a work pool of GPU workers."""

from __future__ import annotations

import os

from prefect.schedules import Cron

from flows.ab import ab
from flows.benchmark import ack, benchmark, shard
from flows.plan import plan

NIGHTLY_CRON = os.environ.get("REPLAYBENCH_NIGHTLY_CRON", "0 2 * * *")
TIMEZONE = os.environ.get("REPLAYBENCH_TIMEZONE", "UTC")


def deployments(cron: str = NIGHTLY_CRON, timezone: str = TIMEZONE, shards: int = 1):
    return [
        benchmark.to_deployment(
            name="nightly",
            schedules=[Cron(cron, timezone=timezone)],
            parameters={"shards": shards},
            description=f"The default suite, every night: cron `{cron}` in the {timezone} timezone.",
            tags=["replaybench"],
        ),
        benchmark.to_deployment(
            name="adhoc",
            description="An ad-hoc run: choose workloads, batch sizes, dtypes and modes in the form.",
            tags=["replaybench"],
        ),
        shard.to_deployment(name="shard", description="A share of a sharded run.", tags=["replaybench"]),
        ack.to_deployment(name="ack", description="Acknowledge an open regression: reports stop listing it.",
                          tags=["replaybench"]),
        ab.to_deployment(name="ab", description="An A/B run: two variants declared in this host's variants file, "
                                                "measured side by side; B against A per config.", tags=["replaybench"]),
        plan.to_deployment(name="plan", description="A capture plan: which batch sizes to capture as CUDA graphs for "
                                                    "a workload and a traffic, within a graph-memory budget.", tags=["replaybench"]),
    ]
