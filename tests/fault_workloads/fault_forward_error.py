"""Fault: the forward raises."""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    x = torch.randn(params["batch_size"], 8, device=device, dtype=dtype)
    w = torch.randn(16, 16, device=device, dtype=dtype)
    return Built(fn=lambda x: x @ w, inputs=(x,))  # 8 columns times 16 rows: shape error


WORKLOAD = Workload(
    name="fault_forward_error",
    description="raises in forward (shape mismatch)",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
