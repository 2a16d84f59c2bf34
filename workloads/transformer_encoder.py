"""One BERT-style transformer encoder layer (d_model 256, 4 heads, GELU FFN 1024) over a short sequence.

Stands for: a small encoder (text classifier, embedding model) at batch 1, where PyTorch's fused
encoder fast path already cuts the kernel count; graphs remove the launches that are left. There is no
padding mask, so no nested tensor is built and nothing synchronizes with the host.
"""

import torch

from replaybench.workload import Built, Workload

D_MODEL = 256
HEADS = 4
FFN = 1024


def build(params, device, dtype):
    layer = torch.nn.TransformerEncoderLayer(
        d_model=D_MODEL, nhead=HEADS, dim_feedforward=FFN, dropout=0.0, activation="gelu", batch_first=True
    )
    layer = layer.to(device=device, dtype=dtype).eval().requires_grad_(False)
    x = torch.randn(params["batch_size"], params["seq_len"], D_MODEL, device=device, dtype=dtype)
    return Built(fn=layer, inputs=(x,))


WORKLOAD = Workload(
    name="transformer_encoder",
    description="nn.TransformerEncoderLayer, d_model 256, 4 heads, short sequence",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16", "float16"], "seq_len": [16, 64, 128]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "seq_len": [16, 64]},
)
