"""A CIFAR-style ResNet (3x3 stem, four basic residual blocks at 32 then 64 channels, 10 classes).

Stands for: a small image classifier at batch 1: Conv-BN-ReLU residual blocks, BatchNorm in eval
mode (running statistics, one kernel of its own in eager mode), global average pool and a linear
head.
"""

import torch
from torch import nn

from replaybench.workload import Built, Workload

CLASSES = 10


def conv_bn(cin, cout, kernel, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)
    )


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, 1)
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))) + self.shortcut(x))


class ResNetSmall(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 32, 3, 1), nn.ReLU())
        self.blocks = nn.Sequential(
            BasicBlock(32, 32, 1), BasicBlock(32, 32, 1), BasicBlock(32, 64, 2), BasicBlock(64, 64, 1)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))


def build(params, device, dtype):
    model = ResNetSmall().to(device=device, dtype=dtype).eval().requires_grad_(False)
    size = params["image"]
    x = torch.randn(params["batch_size"], 3, size, size, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="resnet_small",
    description="small ResNet: four Conv-BN-ReLU residual blocks, 32-64 channels",
    build=build,
    grid={"batch_size": [1, 8, 32], "dtype": ["float32", "bfloat16", "float16"], "image": [32, 64, 128, 224]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "image": [32]},
)
