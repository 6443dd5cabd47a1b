"""A GPT-style decoder built with torch from a catalog TransformerConfig, cut into stages.

Every layer is initialised from its own seed (seed + layer index), so a pipeline of stage modules
holds exactly the weights of the whole model: executors compare gradients against a single-process
run, and the profiler times the very blocks the executors run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpuplan.models.workload import TransformerConfig


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads (fused kernel via scaled_dot_product_attention)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.heads, self.kv, self.dhead = cfg.heads, cfg.kv, cfg.dhead
        self.q = nn.Linear(cfg.hidden, cfg.heads * cfg.dhead, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.kv * cfg.dhead, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.kv * cfg.dhead, bias=False)
        self.o = nn.Linear(cfg.heads * cfg.dhead, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dhead).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, self.dhead).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv, self.dhead).transpose(1, 2)
        if self.kv != self.heads:
            rep = self.heads // self.kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, self.heads * self.dhead))


class MLP(nn.Module):
    """The feed-forward block: SwiGLU when the config is gated, GELU otherwise."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.gated = cfg.gated_mlp
        self.up = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)
        self.gate = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False) if cfg.gated_mlp else None
        self.down = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """One pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.norm2 = nn.RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Embedding(nn.Module):
    """Token embedding: int64 tokens (batch, seq) -> activations (batch, seq, hidden)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class Head(nn.Module):
    """Final norm and projection onto the vocabulary: activations -> logits."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def _seeded(seed: int, build: Any) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def embedding(cfg: TransformerConfig, seed: int = 0) -> Embedding:
    """Return the embedding, initialised from `seed`."""
    return _seeded(seed, lambda: Embedding(cfg))  # type: ignore[return-value]


def block(cfg: TransformerConfig, layer: int, seed: int = 0) -> Block:
    """Return transformer layer number `layer`, initialised from seed + 1 + layer."""
    return _seeded(seed + 1 + layer, lambda: Block(cfg))  # type: ignore[return-value]


def head(cfg: TransformerConfig, seed: int = 0) -> Head:
    """Return the output head, initialised from seed + 1 + num_layers."""
    return _seeded(seed + 1 + cfg.num_layers, lambda: Head(cfg))  # type: ignore[return-value]


class Stage(nn.Sequential):
    """Layers [first, last) of the model, with the embedding in front when first == 0 and the head
    behind when last == num_layers. Input: tokens (first stage) or activations; output: activations
    or logits (last stage)."""


def stage(cfg: TransformerConfig, first: int, last: int, seed: int = 0) -> Stage:
    """Return the stage module holding layers [first, last) (see Stage); weights match `model`."""
    if not 0 <= first < last <= cfg.num_layers:
        raise ValueError(f"a layer range inside 0..{cfg.num_layers}, not [{first}, {last})")
    parts: list[nn.Module] = []
    if first == 0:
        parts.append(embedding(cfg, seed))
    parts += [block(cfg, i, seed) for i in range(first, last)]
    if last == cfg.num_layers:
        parts.append(head(cfg, seed))
    return Stage(*parts)


def model(cfg: TransformerConfig, seed: int = 0) -> Stage:
    """Return the whole model as one stage: tokens -> logits."""
    return stage(cfg, 0, cfg.num_layers, seed)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Return the mean next-token cross-entropy of logits (b, s, vocab) against targets (b, s)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def synthetic_batch(cfg: TransformerConfig, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (tokens, targets) of shape (batch, seq), drawn from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
