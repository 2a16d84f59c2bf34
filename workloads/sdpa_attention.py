"""A multi-head self-attention block (8 heads of 64): q/k/v projections, scaled_dot_product_attention, output projection.

Stands for: the attention half of a transformer layer at short sequence lengths. No SDPA backend is
forced: flash or memory-efficient attention where the dtype allows, the math backend otherwise.
"""

import torch
import torch.nn.functional as F

from replaybench.workload import Built, Workload

HEADS = 8
HEAD_DIM = 64
D_MODEL = HEADS * HEAD_DIM


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(D_MODEL, D_MODEL)
        self.k = torch.nn.Linear(D_MODEL, D_MODEL)
        self.v = torch.nn.Linear(D_MODEL, D_MODEL)
        self.out = torch.nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)))
        return self.out(y.transpose(1, 2).reshape(b, s, D_MODEL))


def build(params, device, dtype):
    model = SelfAttention().to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], params["seq_len"], D_MODEL, device=device, dtype=dtype)
    return Built(fn=model, inputs=(x,))


WORKLOAD = Workload(
    name="sdpa_attention",
    description="self-attention: q/k/v projections + scaled_dot_product_attention",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16", "float16"], "seq_len": [16, 64, 256]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "seq_len": [16, 64]},
)
