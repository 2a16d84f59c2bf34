"""Plain data that crosses process boundaries: what to measure, and what was measured.

Times are seconds per iteration throughout; presentation converts units.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

Mode = Literal["eager", "graph", "compile", "compile_cudagraphs"]
MODES: tuple[str, ...] = ("eager", "graph", "compile", "compile_cudagraphs")
DEFAULT_MODES: tuple[str, ...] = ("eager", "graph")
MODE_LABELS = {
    "eager": "eager",
    "graph": "CUDA graph replay",
    "compile": "torch.compile()",
    "compile_cudagraphs": 'torch.compile(mode="reduce-overhead")',
}

# ok: measured, output checked; skipped: not applicable here (reason says why);
# failed: the workload or mode cannot be measured (deterministic, not retried);
# crashed: the measuring process died or hung (retried once in a fresh process).
Status = Literal["ok", "skipped", "failed", "crashed"]


class MeasureSettings(BaseModel):
    modes: list[Mode] = Field(default_factory=lambda: list(DEFAULT_MODES))
    precision: float = Field(
        0.02, gt=0, le=0.5, description="target relative half-width of every reported 95% interval (speedups included)"
    )
    min_units: int = Field(6, ge=3, le=10_000, description="fewest undisturbed timed units per measuring process")
    time_budget_s: float = Field(6.0, gt=0, le=600, description="seconds of timed rounds per config, all modes together: at most; "
                                  "from half of it on, rounds stop once every interval is within 4x the precision target")
    block_s: float = Field(0.005, gt=0, le=1, description="target duration of one timed block")
    warmup_iters: int = Field(20, ge=1, le=100_000)
    seed: int = 0
    force_cpu: bool = False

    @field_validator("modes")
    @classmethod
    def eager_first(cls, modes: list[str]) -> list[str]:
        """Eager is the baseline every speedup is computed against: always measured, first."""
        return ["eager", *dict.fromkeys(m for m in modes if m != "eager")]


class Series(BaseModel):
    """One metric of one mode (seconds per iteration), combined over the measuring processes.

    ``value`` is the reported figure: the geometric mean over processes of each process's median
    over its kept blocks; ``ci_low``/``ci_high`` its 95% interval (replaybench.stats.typical).
    """

    value: float
    ci_low: float
    ci_high: float
    n: int  # blocks the figure rests on (kept blocks of every process)
    minimum: float
    maximum: float
    iqr: float
    precision_met: bool
    blocks: list[float]  # every block, each process's in turn
    # blocks measured by each measuring process, in order (blocks[:k0] by the first, ...)
    per_process: list[int] = Field(default_factory=list)
    # per block: False where the block is set aside (the host's reference block showed the core
    # disturbed; a GPU-paced figure, graph replay, sets none aside)
    kept: list[bool] = Field(default_factory=list)
    process_values: list[float] = Field(default_factory=list)  # each process's own median

    def groups(self) -> list[list[float]]:
        sizes = self.per_process or [len(self.blocks)]
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        return [self.blocks[a:b] for a, b in zip(bounds, bounds[1:])]

    @property
    def rel_halfwidth(self) -> float:
        return (self.ci_high - self.ci_low) / 2 / self.value if self.value else float("inf")


class HostReference(BaseModel):
    """The host's speed while a config was measured: a fixed CPU block (``engine.reference_block``)
    timed before and after every timed unit. A unit whose reference took ``DISTURBED`` times the
    undisturbed reference time or more was measured while its core ran slow, and is set aside."""

    base_s: float  # the undisturbed reference time
    share_disturbed: float  # of the timed units
    slowest: float  # the slowest reference block over base_s
    # per process, per timed unit: the reference blocks timed before and after it
    before: list[list[float]] = Field(default_factory=list)
    after: list[list[float]] = Field(default_factory=list)


class ModeResult(BaseModel):
    mode: Mode
    status: Status
    reason: str | None = None
    phase: str | None = None  # where it failed: build, forward, capture, check, measure
    throughput: Series | None = None
    latency: Series | None = None
    gpu: Series | None = None
    host_enqueue: Series | None = None
    # eager only: every throughput block scaled to the standard host by the reference blocks timed
    # around it (analysis.Units.at_standard_host): steadier across runs than eager where the host's speed drifts
    host_normalised: Series | None = None
    iters_per_block: int | None = None
    kernels_per_iter: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    speedup_per_process: list[float] = Field(default_factory=list)  # each process's own speedup
    # the speedup on a host of a fixed speed (analysis.host_normalised_speedup): to compare runs by
    normalised_speedup: float | None = None
    normalised_speedup_ci_low: float | None = None
    normalised_speedup_ci_high: float | None = None
    capture_s: float | None = None
    first_replay_s: float | None = None
    graph_pool_bytes: int | None = None
    break_even_replays: float | None = None
    compile_s: float | None = None
    graphs_used: bool | None = None
    max_abs_diff: float | None = None
    flags: list[str] = Field(default_factory=list)

    @property
    def launch_overhead_s(self) -> float | None:
        if self.throughput and self.gpu:
            return max(self.throughput.value - self.gpu.value, 0.0)
        return None

    @property
    def launch_bound_fraction(self) -> float | None:
        overhead = self.launch_overhead_s
        return overhead / self.throughput.value if overhead is not None else None


class ConfigResult(BaseModel):
    workload: str
    params: dict[str, Any]
    device: str
    modes: list[ModeResult]
    cpu_core: int | None = None
    cpu_cores: list[int | None] = Field(default_factory=list)  # one per measuring process
    host: HostReference | None = None
    load_average: list[float] | None = None
    health_before: dict[str, Any] | None = None
    health_after: dict[str, Any] | None = None
    measuring_s: float | None = None  # the time measuring it took, from preparing to finishing, retries included
    attempts: int = 1
    # The measuring process cannot be trusted after this config (sticky CUDA error): restart it.
    process_unusable: bool = False

    def mode(self, name: str) -> ModeResult | None:
        return next((m for m in self.modes if m.mode == name), None)
