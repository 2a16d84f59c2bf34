"""Fault: the measuring process crashes with a segmentation fault."""

import ctypes

from replaybench.workload import Workload


def build(params, device, dtype):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


WORKLOAD = Workload(
    name="fault_segfault",
    description="segmentation fault in the measuring process",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
