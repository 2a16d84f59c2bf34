"""Fault: the measuring process is killed (SIGKILL) while measuring."""

import os
import signal

from replaybench.workload import Workload


def build(params, device, dtype):
    os.kill(os.getpid(), signal.SIGKILL)


WORKLOAD = Workload(
    name="fault_kill",
    description="SIGKILL of the measuring process",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
