"""A small DLRM-style click-through model: sum-pooled EmbeddingBag tables, bottom MLP, pairwise dot interaction, top MLP.

Stands for: recommendation inference (Criteo-style DLRM) at small batch: one EmbeddingBag lookup a
table, a dense MLP, the batched dot products between every pair of feature vectors, and a top MLP
to a click probability. Index and offset tensors are fixed-size int64 inputs (each bag holds
BAG_SIZE indices), made once at build time; the pairwise index is a constant made at build time too.
"""

import torch
from torch import nn

from replaybench.workload import Built, Workload

DENSE = 13  # Criteo's dense features
EMBED = 32  # embedding dimension, also the bottom MLP's output
ROWS = 10_000  # rows per table
BAG_SIZE = 4  # indices pooled (summed) per bag


class DLRM(nn.Module):
    def __init__(self, tables):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(ROWS, EMBED, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, EMBED), nn.ReLU())
        features = tables + 1
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("pairs", rows * features + cols)  # flat index of each pair (i > j)
        self.top = nn.Sequential(
            nn.Linear(EMBED + len(rows), 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1), nn.Sigmoid()
        )

    def forward(self, dense, indices, offsets):
        """dense: (batch, DENSE); indices: (tables, batch * BAG_SIZE) int64; offsets: (batch,) int64."""
        x = self.bottom(dense)
        z = torch.stack([x, *(table(indices[t], offsets) for t, table in enumerate(self.tables))], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2)).flatten(1).index_select(1, self.pairs)
        return self.top(torch.cat([x, dots], dim=1))


def build(params, device, dtype):
    batch, tables = params["batch_size"], params["tables"]
    model = DLRM(tables).to(device=device, dtype=dtype).eval().requires_grad_(False)
    dense = torch.randn(batch, DENSE, device=device, dtype=dtype)
    indices = torch.randint(0, ROWS, (tables, batch * BAG_SIZE), device=device)
    offsets = torch.arange(0, batch * BAG_SIZE, BAG_SIZE, device=device)
    return Built(fn=model, inputs=(dense, indices, offsets))


WORKLOAD = Workload(
    name="recommender",
    description="DLRM-style recommender: EmbeddingBag tables, MLPs, dot interaction",
    build=build,
    grid={"batch_size": [1, 8, 64], "dtype": ["float32", "bfloat16", "float16"], "tables": [4, 8, 26]},
    default_grid={"batch_size": [1], "dtype": ["float32"], "tables": [4, 26]},
)
