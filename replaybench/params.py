"""Run parameters: one pydantic model shared by the CLI and the Prefect flows (where it becomes the
run form in the Prefect UI). Bounds are enforced here, before any measuring."""

from __future__ import annotations

import os
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from .results import DEFAULT_MODES, MeasureSettings, Mode
from .variants import VariantName
from .workload import DTYPES, MAX_BATCH_SIZE, BenchConfig, Registry, WorkloadError, expand

DType = Literal[DTYPES]  # type: ignore[valid-type]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]
SizeValue = Union[int, float, str]
MIN_EFFECT = 0.05


MAX_CONFIGS_VARIABLE = "REPLAYBENCH_MAX_CONFIGS"


def max_configs() -> int:
    """The most configs one run may measure: the operator's to set, in the environment of the CLI,
    worker or serve process; a form or a deployment parameter cannot raise it."""
    value = os.environ.get(MAX_CONFIGS_VARIABLE, "500")
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise WorkloadError(f"${MAX_CONFIGS_VARIABLE} must be a whole number of at least 1, not {value!r}")
    return limit


MAX_RUN_VARIABLE = "REPLAYBENCH_MAX_RUN_S"
DEFAULT_MAX_RUN_S = 6 * 3600


def max_run_s() -> float:
    """The most seconds one run may spend measuring its configs (``replaybench.limits``): the
    operator's to set, like ``max_configs``; a form or a deployment parameter cannot raise it."""
    value = os.environ.get(MAX_RUN_VARIABLE, str(DEFAULT_MAX_RUN_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise WorkloadError(f"${MAX_RUN_VARIABLE} must be a positive number of seconds, not {value!r}")
    return seconds


class Selection(BaseModel):
    """What to measure and how precisely: shared by runs and A/B runs."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # nan passes no bound: refuse it by name

    workloads: list[str] = Field(
        default_factory=list, description="workload names; empty means every registered workload"
    )
    batch_sizes: list[BatchSize] = Field(default_factory=list, description="narrow to these batch sizes")
    dtypes: list[DType] = Field(default_factory=list, description="narrow to these dtypes")
    sizes: dict[str, list[SizeValue]] = Field(
        default_factory=dict,
        description="narrow other grid keys to values among those each workload declares "
                    "(`replaybench workloads` lists them), e.g. {\"width\": [128]}",
    )
    full_grid: bool = Field(False, description="each workload's full grid instead of its default grid")
    modes: list[Mode] = Field(default_factory=lambda: list(DEFAULT_MODES), min_length=1)
    precision: float = Field(
        0.02, ge=0.001, le=0.5, description="stop once every reported 95% interval is within +/- this of its figure"
    )
    time_budget_s: float = Field(6.0, gt=0, le=600, description="seconds of timed rounds per config, all modes together: at most; "
                                  "from half of it on, rounds stop once every interval is within 4x the precision target")
    min_units: int = Field(6, ge=3, le=10_000, description="fewest undisturbed timed units per measuring process")
    processes: int = Field(
        6, ge=1, le=16, description="measuring processes per GPU; each config is timed in every one, in turn"
    )
    timeout_s: float = Field(600, ge=1, le=24 * 3600, description="per-config limit; a hung config is killed")

    def measure_settings(self) -> MeasureSettings:
        return MeasureSettings(
            modes=self.modes, precision=self.precision, min_units=self.min_units, time_budget_s=self.time_budget_s
        )

    def configs(self, registry: Registry) -> list[BenchConfig]:
        for key, given, option in (("batch_size", self.batch_sizes, "-b"), ("dtype", self.dtypes, "--dtype")):
            if given and self.sizes.get(key):
                raise WorkloadError(f"{key} is given twice (as {key}s and in sizes; on the command line, "
                                    f"{option} and --set); give it once")
        narrow = {"batch_size": self.batch_sizes, "dtype": self.dtypes, **self.sizes}
        configs = expand(registry, self.workloads or None, narrow, full=self.full_grid)
        limit = max_configs()
        if len(configs) > limit:
            raise WorkloadError(f"the selection holds {len(configs)} configs, more than the {limit} a run may measure "
                                f"(${MAX_CONFIGS_VARIABLE}, set where the runs are measured)")
        # Each config's timed rounds may take its whole time budget: a run asking for more than
        # the cap allows is refused before it starts (preparing and finishing come on top, and a
        # run that still reaches the cap stops there: replaybench.limits).
        budget, cap = len(configs) * self.time_budget_s, max_run_s()
        if budget > cap:
            raise WorkloadError(f"the selection's time budget, {len(configs)} config{'s' if len(configs) != 1 else ''} x {self.time_budget_s:g} s of timed rounds "
                                f"= {budget:g} s, is more than the {cap:g} s a run may measure "
                                f"(${MAX_RUN_VARIABLE}, set where the runs are measured)")
        return configs


class RunParameters(Selection):
    confirm_limit: int = Field(
        5, ge=0, le=50, description="configs measured again the same night, in fresh processes, when they look off"
    )


class ABParameters(Selection):
    """An A/B run: the selection measured by two variants declared on the measuring host
    (``replaybench.variants``), named here, never described."""

    a: VariantName
    b: VariantName
    # Twelve pairs, not six: identical variants' B/A ratios scatter over pairs by each process's own
    # level (a capture's memory placement, eager's process effect), which only more pairs average out
    # (t/sqrt(n): 1.05 with six, 0.64 with twelve; benchmarks/ab_check.py measures it).
    processes: int = Field(12, ge=2, le=16, description="measuring processes per variant, a pair of them per core")
    time_budget_s: float = Field(6.0, gt=0, le=600, description="seconds of timed rounds per config, both variants together")
    min_effect: float = Field(
        MIN_EFFECT, ge=0.005, le=0.5, description="an interval holding no change and narrower than +/- this reads 'no difference'"
    )


class PlanParameters(BaseModel):
    """A capture plan (``replaybench plan``): one workload config, the candidate batch sizes, the
    traffic and the graph-memory budget. Text fields are parsed and bounded by ``replaybench.plan``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # nan passes no bound: refuse it by name

    workload: str = Field("gpt_decode_step", max_length=128, description="the workload to plan captures for")
    dtype: DType = "float32"
    sizes: dict[str, SizeValue] = Field(
        default_factory=dict, description="its other grid keys, one value each among those it declares, e.g. {\"layers\": 2}"
    )
    candidates: str = Field("1-256", max_length=1000, description="candidate batch sizes, e.g. 1-256 or 1,2,4,8-256:8")
    traffic: str = Field(
        "zipf", max_length=4000,
        description="how often each batch size comes: zipf (weight 1/b: most batches small), uniform, or weights such as 1:40,2-8:30,9-256:30",
    )
    memory_budget_mib: float | None = Field(None, gt=0, le=1 << 20, description="graph memory the plan may take; empty: no limit")
    calls: int = Field(2000, ge=100, le=100_000, description="batches in the replayed trace drawn from the traffic")
    passes: int = Field(5, ge=3, le=50, description="times each size, and the trace, is timed; the median is reported")
    timeout_s: float = Field(1800, ge=10, le=6 * 3600, description="limit for the whole plan; a hung one is killed")

    def config(self, registry: Registry) -> BenchConfig:
        """The workload config planned for: the dtype, the given grid values (checked against those the
        workload declares), and the first value of its default grid for every other key."""
        workload = registry.get(self.workload)
        if not workload.capturable:
            raise WorkloadError(f"{workload.name} cannot be captured as a CUDA graph: {workload.not_capturable_reason}")
        unknown = sorted(set(self.sizes) - set(workload.grid) | set(self.sizes) & {"batch_size", "dtype"})
        if unknown:
            raise WorkloadError(f"{workload.name}: {', '.join(unknown)} cannot be set here; its other grid keys: "
                                f"{', '.join(k for k in sorted(workload.grid) if k not in ('batch_size', 'dtype')) or 'none'}")
        params = {k: v[0] for k, v in (workload.default_grid or workload.grid).items() if k not in ("batch_size", "dtype")}
        for key, value in self.sizes.items():
            (params[key],) = workload.declared(key, [value])
        return BenchConfig(workload.name, {**params, "dtype": self.dtype})
