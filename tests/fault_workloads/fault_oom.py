"""Fault: the builder asks for far more memory than any device has (2**48 floats, 1 PiB)."""

import torch

from replaybench.workload import Workload


def build(params, device, dtype):
    torch.empty(1 << 48, device=device, dtype=dtype)
    raise AssertionError("unreachable: the allocation above must fail")


WORKLOAD = Workload(
    name="fault_oom",
    description="out of memory while building",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
