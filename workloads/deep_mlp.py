"""A deep narrow MLP (Linear+ReLU stacked, width 128): a tabular/feature model whose depth sets its kernel count.

Stands for: launch-bound inference whose cost grows with depth, two kernels a layer; the README's
field-guide figures (2 and 32 layers at width 128) come from this shape.
"""

import torch

from replaybench.workload import Built, Workload

WIDTH = 128


def build(params, device, dtype):
    layers = []
    for _ in range(params["depth"]):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], WIDTH, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="deep_mlp",
    description="Linear(128,128)+ReLU repeated `depth` times",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16", "float16"], "depth": [2, 8, 32, 64]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "depth": [2, 8, 32]},
)
