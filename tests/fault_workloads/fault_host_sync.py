"""Fault: the forward reads a value back to the host (.item()), which cannot be captured."""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    x = torch.randn(params["batch_size"], 16, device=device, dtype=dtype)

    def forward(x):
        scale = x.abs().max().item()  # a host synchronisation: not permitted while capturing
        return x / (scale + 1.0)

    return Built(fn=forward, inputs=(x,))


WORKLOAD = Workload(
    name="fault_host_sync",
    description="host synchronisation (.item()) in forward: capture fails",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
