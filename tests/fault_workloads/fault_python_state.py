"""Fault: a Python-side counter changes the output on every eager call, but a CUDA graph replays the
value seen during capture, so replay output differs from eager output."""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    x = torch.randn(params["batch_size"], 16, device=device, dtype=dtype)
    calls = [0]

    def forward(x):
        calls[0] += 1
        return x * float(calls[0])

    return Built(fn=forward, inputs=(x,))


WORKLOAD = Workload(
    name="fault_python_state",
    description="output depends on Python state: graph replay differs from eager",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
