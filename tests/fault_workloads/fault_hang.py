"""Fault: the forward never returns. On CUDA a spin kernel holds the GPU and the host waits on it;
on the CPU the host sleeps. Only killing the measuring process ends it."""

import time

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    x = torch.randn(1, 4, device=device, dtype=dtype)

    def forward(x):
        if x.is_cuda:
            torch.cuda._sleep(1 << 62)
            torch.cuda.synchronize()
        while True:
            time.sleep(1)

    return Built(fn=forward, inputs=(x,))


WORKLOAD = Workload(
    name="fault_hang",
    description="forward hangs",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
