"""The gpt_decode_step decoder generating several tokens greedily per call, all on the device, as one graph.

Stands for: multi-token decoding captured as a single CUDA graph (speculative/multi-step scheduling
in LLM servers): ``steps`` decode steps a call, each step's argmax token fed back as the next input
without leaving the device. The decoder, its static KV cache and its in-place position come from
``workloads.gpt_decode_step``; ``reset`` restores the prompt state.
"""

import torch
from torch import nn

from replaybench.workload import Built, Workload
from workloads.gpt_decode_step import build_decoder


class GreedyDecode(nn.Module):
    def __init__(self, decoder, steps):
        super().__init__()
        self.decoder = decoder
        self.steps = steps

    def forward(self, tokens):
        """tokens: (batch,) int64 -> (generated tokens (batch, steps) int64, last logits (batch, VOCAB))."""
        generated = []
        for _ in range(self.steps):
            logits = self.decoder.step(tokens)
            tokens = logits.argmax(dim=-1)
            generated.append(tokens)
        return torch.stack(generated, dim=1), logits


def build(params, device, dtype):
    decoder, tokens = build_decoder(params, device, dtype)
    model = GreedyDecode(decoder, params["steps"]).eval()
    return Built(fn=model, inputs=(tokens,), reset=decoder.reset)


WORKLOAD = Workload(
    name="gpt_multi_step",
    description="GPT-style decoder, `steps` greedy tokens per call in one graph",
    build=build,
    grid={
        "batch_size": [1, 8, 64],
        "dtype": ["float32", "bfloat16", "float16"],
        "layers": [2, 4],
        "cache_len": [128, 512],
        "steps": [4, 8],
    },
    default_grid={"batch_size": [1], "dtype": ["float32"], "layers": [2], "cache_len": [128], "steps": [4]},
)
