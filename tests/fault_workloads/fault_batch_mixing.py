"""Fault for capture plans: each row's output depends on the other rows (centred on the batch mean),
so a batch padded to a larger captured size computes something else."""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    x = torch.randn(params["batch_size"], 64, device=device, dtype=dtype)
    return Built(fn=lambda t: t - t.mean(dim=0), inputs=(x,))


WORKLOAD = Workload(
    name="fault_batch_mixing",
    description="rows depend on the whole batch: padding changes the output",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
