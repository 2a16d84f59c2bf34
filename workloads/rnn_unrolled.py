"""A GRU or LSTM sequence encoder (hidden 128) unrolled step by step in Python over T time steps.

Stands for: a streaming/sequence model run one cell call per time step (speech, time series,
an RNN-T predictor): a few tiny kernels per step, T steps a call, the hidden state carried on the
device. The initial state is allocated once at build time.
"""

import torch
from torch import nn

from replaybench.workload import Built, Workload

INPUT = 128
HIDDEN = 128


class Unrolled(nn.Module):
    def __init__(self, cell, batch_size):
        super().__init__()
        self.lstm = cell == "lstm"
        self.cell = nn.LSTMCell(INPUT, HIDDEN) if self.lstm else nn.GRUCell(INPUT, HIDDEN)
        self.register_buffer("h0", torch.zeros(batch_size, HIDDEN))
        self.register_buffer("c0", torch.zeros(batch_size, HIDDEN))

    def forward(self, x):
        """x: (batch, steps, INPUT) -> the last hidden state (batch, HIDDEN)."""
        h, c = self.h0, self.c0
        for t in range(x.shape[1]):
            if self.lstm:
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return h


def build(params, device, dtype):
    model = Unrolled(params["cell"], params["batch_size"]).to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], params["steps"], INPUT, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="rnn_unrolled",
    description="GRUCell/LSTMCell (hidden 128) unrolled in Python over T steps",
    build=build,
    grid={
        "batch_size": [1, 8, 64],
        "dtype": ["float32", "bfloat16", "float16"],
        "steps": [8, 32, 128],
        "cell": ["gru", "lstm"],
    },
    default_grid={"batch_size": [1], "dtype": ["float32"], "steps": [8, 32], "cell": ["gru"]},
)
