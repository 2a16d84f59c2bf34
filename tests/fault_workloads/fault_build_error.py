"""Fault: the builder raises."""

from replaybench.workload import Workload


def build(params, device, dtype):
    raise RuntimeError("weights file missing (deliberate build fault)")


WORKLOAD = Workload(
    name="fault_build_error",
    description="raises while building",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
