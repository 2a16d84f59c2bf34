"""A chain of pre-norm residual blocks (LayerNorm -> GELU -> layer scale -> residual add), width 256.

Stands for: the normalisation/activation glue between a model's matmuls (the part kernel fusion and
graphs target): four tiny memory-bound kernels a block, no matmul at all.
"""

import torch

from replaybench.workload import Built, Workload

WIDTH = 256


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.act = torch.nn.GELU()
        self.scale = torch.nn.Parameter(torch.full((width,), 0.1))  # layer scale, as in CaiT / ConvNeXt

    def forward(self, x):
        return x + self.act(self.norm(x)) * self.scale


def build(params, device, dtype):
    model = torch.nn.Sequential(*(Block(WIDTH) for _ in range(params["blocks"])))
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], WIDTH, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="pointwise_chain",
    description="LayerNorm, GELU, scale, residual add repeated: tiny elementwise kernels",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16", "float16"], "blocks": [4, 16, 32]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "blocks": [4, 16]},
)
