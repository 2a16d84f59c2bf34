"""A small GPT-style decoder (d_model 256, 4 heads) generating ONE token per call against a static KV cache.

Stands for: the per-token decode step of LLM serving, the case CUDA graphs are used for in practice
(vLLM, TensorRT-LLM, gpt-fast): a few dozen small kernels per token at batch 1. The KV cache is
preallocated for ``cache_len`` positions; each call writes the new key and value in place
(``index_copy_`` at the position held in the device tensor ``pos``), attends over the whole cache
with an additive mask built from ``pos`` on the device, and advances ``pos`` in place, wrapping with
``torch.remainder`` so repeated calls (warm-up, timing) never run off the cache. Nothing
synchronizes with the host. ``reset`` zeroes the cache and puts ``pos`` back at the prompt length
(half the cache), so eager and replayed outputs are compared from the same state.
"""

import torch
import torch.nn.functional as F
from torch import nn

from replaybench.workload import Built, Workload

D_MODEL = 256
HEADS = 4
HEAD_DIM = D_MODEL // HEADS
VOCAB = 2048


class DecoderLayer(nn.Module):
    """Pre-norm GPT-2 block that reads and writes its slice of the KV cache."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x, k_cache, v_cache, pos, bias):
        """x: (batch, 1, D_MODEL); caches: (batch, HEADS, cache_len, HEAD_DIM); pos: (1,) int64;
        bias: (1, 1, 1, cache_len) additive attention mask."""
        b = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(b, 1, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=bias)
        x = x + self.proj(y.transpose(1, 2).reshape(b, 1, D_MODEL))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class GPTDecoder(nn.Module):
    """Token embedding + learned positions, ``layers`` decoder blocks, final norm, LM head; the KV
    cache, the position ``pos`` and every constant the step needs are buffers made here."""

    def __init__(self, layers, cache_len, batch_size):
        super().__init__()
        self.cache_len = cache_len
        self.prompt_len = cache_len // 2
        self.tok_emb = nn.Embedding(VOCAB, D_MODEL)
        self.pos_emb = nn.Embedding(cache_len, D_MODEL)
        self.layers = nn.ModuleList(DecoderLayer() for _ in range(layers))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)
        # cache[layer, 0] holds keys, cache[layer, 1] values
        self.register_buffer("cache", torch.zeros(layers, 2, batch_size, HEADS, cache_len, HEAD_DIM))
        self.register_buffer("pos", torch.full((1,), self.prompt_len, dtype=torch.long))
        self.register_buffer("positions", torch.arange(cache_len))
        self.register_buffer("zero", torch.zeros(()))
        self.register_buffer("neg_inf", torch.full((), float("-inf")))

    def reset(self):
        self.cache.zero_()
        self.pos.fill_(self.prompt_len)

    def step(self, tokens):
        """tokens: (batch,) int64 -> next-token logits (batch, VOCAB); writes the cache's first
        ``batch`` rows, advances pos."""
        b = tokens.shape[0]
        bias = torch.where(self.positions <= self.pos, self.zero, self.neg_inf).view(1, 1, 1, self.cache_len)
        x = (self.tok_emb(tokens) + self.pos_emb(self.pos)).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.cache[i, 0, :b], self.cache[i, 1, :b], self.pos, bias)
        logits = self.head(self.ln_f(x[:, 0]))
        self.pos.add_(1).remainder_(self.cache_len)
        return logits

    forward = step


def build_decoder(params, device, dtype):
    """The decoder and a batch of input tokens, on ``device`` in ``dtype``, from the prompt state."""
    decoder = GPTDecoder(params["layers"], params["cache_len"], params["batch_size"])
    decoder = decoder.to(device=device, dtype=dtype).eval().requires_grad_(False)
    tokens = torch.randint(0, VOCAB, (params["batch_size"],), device=device)
    return decoder, tokens


def build(params, device, dtype):
    decoder, tokens = build_decoder(params, device, dtype)
    return Built(fn=decoder.step, inputs=(tokens,), reset=decoder.reset)


def build_sizes(params, device, dtype, largest):
    """One decoder whose cache holds ``largest`` rows, as a server's does; a batch of b uses its
    first b rows (``replaybench plan``)."""
    decoder, tokens = build_decoder({**params, "batch_size": largest}, device, dtype)
    return lambda b: Built(fn=decoder.step, inputs=(tokens[:b].clone(),), reset=decoder.reset)


WORKLOAD = Workload(
    name="gpt_decode_step",
    description="GPT-style decoder, one token per call on a static in-place KV cache",
    build=build,
    grid={
        "batch_size": [1, 8, 64],
        "dtype": ["float32", "bfloat16", "float16"],
        "layers": [2, 4],
        "cache_len": [128, 512],
    },
    default_grid={"batch_size": [1], "dtype": ["float32"], "layers": [2], "cache_len": [128, 512]},
    build_sizes=build_sizes,
)
