"""A MobileNetV1-style stack of depthwise-separable blocks (depthwise 3x3, pointwise 1x1, BN, ReLU6).

Stands for: an edge/mobile image model at batch 1, whose depthwise convolutions do little arithmetic
per kernel: many cheap kernels, each BatchNorm and ReLU6 a kernel of its own in eager mode.
"""

import torch
from torch import nn

from replaybench.workload import Built, Workload

CLASSES = 10
# (channels in, channels out, stride of the depthwise conv) for each depthwise-separable block
BLOCKS = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1)]


def separable(cin, cout, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False),
        nn.BatchNorm2d(cin),
        nn.ReLU6(),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(),
    )


class MobileNetSmall(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())
        self.blocks = nn.Sequential(*(separable(*b) for b in BLOCKS))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(BLOCKS[-1][1], CLASSES)

    def forward(self, x):
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))


def build(params, device, dtype):
    model = MobileNetSmall().to(device=device, dtype=dtype).eval().requires_grad_(False)
    size = params["image"]
    x = torch.randn(params["batch_size"], 3, size, size, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="mobile_block",
    description="MobileNetV1-style depthwise-separable conv blocks, BN, ReLU6",
    build=build,
    grid={"batch_size": [1, 8, 32], "dtype": ["float32", "bfloat16", "float16"], "image": [32, 112, 224]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "image": [32]},
)
