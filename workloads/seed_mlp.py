"""The seed tutorial's model: Linear(128,128) -> ReLU -> Linear(128,128), batch 1, fp32.

Stands for: the smallest launch-bound inference, three kernels a call.
"""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    width = params["width"]
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
    )
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], width, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="seed_mlp",
    description="Seed tutorial MLP: Linear(128,128) -> ReLU -> Linear(128,128); the smallest launch-bound model",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16"], "width": [128, 512]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "width": [128]},
)
