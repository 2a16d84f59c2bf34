"""Fault: an out-of-range index. On CUDA this is a device-side assert, a sticky error that leaves
the process's CUDA context unusable; on the CPU it is an ordinary IndexError."""

import torch

from replaybench.workload import Built, Workload


def build(params, device, dtype):
    table = torch.randn(10, 4, device=device, dtype=dtype)
    index = torch.tensor([3, 1_000_000], device=device)

    def forward(index):
        return table[index]

    return Built(fn=forward, inputs=(index,))


WORKLOAD = Workload(
    name="fault_device_assert",
    description="out-of-range index: device-side assert on CUDA",
    build=build,
    grid={"batch_size": [1], "dtype": ["float32"]},
)
