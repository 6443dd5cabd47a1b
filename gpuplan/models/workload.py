"""Model architectures: a catalog of transformer shapes and their per-layer FLOPs, bytes and memory.

Counts follow the usual conventions (Megatron-LM / Korthikanti et al. 2022): a multiply-add is
2 FLOPs; backward costs twice the forward; activations are counted in bytes for 16-bit training.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from gpuplan.models.base import Schema

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def storage_dtype(dtype: str) -> str:
    """Return the dtype a model trained in `dtype` keeps and communicates its weights, gradients and
    activations in: bf16 for fp8 training (Transformer Engine's recipe: only the linear layers'
    GEMMs run in fp8, on fp8 copies cast from bf16), else `dtype` itself."""
    return "bf16" if dtype == "fp8" else dtype


class TransformerConfig(Schema):
    """A decoder-only transformer's shape."""

    name: str
    num_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    ffn_hidden: int = Field(gt=0)
    vocab: int = Field(gt=0)
    gated_mlp: bool = True
    tied_embeddings: bool = False
    max_seq_len: int = Field(default=4096, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> "TransformerConfig":
        if self.heads % self.kv:
            raise ValueError(f"at kv_heads: a divisor of heads={self.heads}, not {self.kv}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"at heads: a divisor of hidden={self.hidden} (or give head_dim), not {self.heads}")
        return self

    @property
    def kv(self) -> int:
        """Number of key/value heads (grouped-query attention), = heads for plain attention."""
        return self.kv_heads or self.heads

    @property
    def dhead(self) -> int:
        """Width of one attention head."""
        return self.head_dim or self.hidden // self.heads

    # ---- parameters -------------------------------------------------------------------------
    def layer_params(self) -> int:
        """Return the parameter count of one transformer layer (attention + MLP + 2 norms)."""
        h, d = self.hidden, self.dhead
        attn = h * (self.heads * d) + 2 * h * (self.kv * d) + (self.heads * d) * h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden
        return attn + mlp + 2 * h

    def embedding_params(self) -> int:
        """Return the parameter count of the token embedding."""
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Return the parameter count of the output head (0 when tied to the embedding) + final norm."""
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + self.hidden

    def total_params(self) -> int:
        """Return the parameter count of the whole model."""
        return self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()

    # ---- compute ------------------------------------------------------------------------------
    def layer_forward_flops(self, batch: int, seq: int) -> float:
        """Return the forward FLOPs of one layer for `batch` sequences of `seq` tokens."""
        tokens = batch * seq
        dense = 2.0 * tokens * (self.layer_params() - 2 * self.hidden)
        attention = 2.0 * 2.0 * batch * seq * seq * self.heads * self.dhead  # QK^T and AV
        return dense + attention

    def head_forward_flops(self, batch: int, seq: int) -> float:
        """Return the forward FLOPs of the output projection onto the vocabulary."""
        return 2.0 * batch * seq * self.hidden * self.vocab

    def layer_activation_bytes(self, batch: int, seq: int, tp: int = 1, flash: bool = True,
                               sequence_parallel: bool = True) -> float:
        """Return the bytes of activations one layer keeps for backward (16-bit training).

        Korthikanti et al.: s*b*h*(34 + 5*a*s/h) without recomputation; with a fused (flash)
        attention kernel the a*s^2 score term is not stored. Divided by tp for the parts split by
        tensor parallelism (all of them when sequence parallelism is on).
        """
        s, b, h = seq, batch, self.hidden
        mlp_scale = self.ffn_hidden / (4.0 * h) * (1.5 if self.gated_mlp else 1.0)
        kv_scale = self.kv / self.heads
        # 10*sbh stays replicated without sequence parallelism (norm inputs, dropout masks);
        # 24*sbh is split by tensor parallelism: attention 11 (K, V shrink under GQA) and MLP 13.
        replicated = 10.0 * s * b * h
        split = s * b * h * (11.0 - 4.0 * (1.0 - kv_scale) + 13.0 * mlp_scale)
        score = 0.0 if flash else 5.0 * self.heads * s * s * b
        if sequence_parallel:
            return (replicated + split + score) / tp
        return replicated + (split + score) / tp

    def layer_weight_bytes(self, dtype: str = "bf16") -> float:
        """Return the bytes of one layer's weights in `dtype`."""
        return self.layer_params() * DTYPE_BYTES[dtype]


def _cfg(name: str, layers: int, hidden: int, heads: int, ffn: int, vocab: int, *, kv: int | None = None,
         head_dim: int | None = None, gated: bool = True, tied: bool = False, seq: int = 4096) -> TransformerConfig:
    return TransformerConfig(name=name, num_layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
                             head_dim=head_dim, ffn_hidden=ffn, vocab=vocab, gated_mlp=gated,
                             tied_embeddings=tied, max_seq_len=seq)


_GPT3_VOCAB = 50257
CATALOG: dict[str, TransformerConfig] = {c.name: c for c in [
    _cfg("gpt3-125m", 12, 768, 12, 3072, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-350m", 24, 1024, 16, 4096, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-760m", 24, 1536, 16, 6144, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-1.3b", 24, 2048, 16, 8192, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-2.7b", 32, 2560, 32, 10240, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-6.7b", 32, 4096, 32, 16384, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-13b", 40, 5120, 40, 20480, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    _cfg("gpt3-175b", 96, 12288, 96, 49152, _GPT3_VOCAB, gated=False, tied=True, seq=2048),
    # Narayanan et al. 2021 (Megatron-LM PTD-P), Table 1: 529.6 B and 1008 B GPT models, vocabulary 51,200
    _cfg("gpt-530b", 105, 20480, 128, 81920, 51200, gated=False, tied=True, seq=2048),
    _cfg("gpt-1t", 128, 25600, 160, 102400, 51200, gated=False, tied=True, seq=2048),
    _cfg("llama2-7b", 32, 4096, 32, 11008, 32000),
    _cfg("llama2-13b", 40, 5120, 40, 13824, 32000),
    _cfg("llama2-70b", 80, 8192, 64, 28672, 32000, kv=8),
    _cfg("llama3-8b", 32, 4096, 32, 14336, 128256, kv=8, seq=8192),
    _cfg("llama3-70b", 80, 8192, 64, 28672, 128256, kv=8, seq=8192),
    _cfg("qwen3-0.6b", 28, 1024, 16, 3072, 151936, kv=8, head_dim=128, tied=True, seq=32768),
    _cfg("qwen3-1.7b", 28, 2048, 16, 6144, 151936, kv=8, head_dim=128, tied=True, seq=32768),
    _cfg("qwen3-4b", 36, 2560, 32, 9728, 151936, kv=8, head_dim=128, tied=True, seq=32768),
    _cfg("qwen3-8b", 36, 4096, 32, 12288, 151936, kv=8, head_dim=128, seq=32768),
    _cfg("qwen3-14b", 40, 5120, 40, 17408, 151936, kv=8, head_dim=128, seq=32768),
    _cfg("qwen3-32b", 64, 5120, 64, 25600, 151936, kv=8, head_dim=128, seq=32768),
]}


def model_config(name: str | TransformerConfig | dict) -> TransformerConfig:
    """Return the TransformerConfig for a catalog name (case-insensitive), a mapping, or a config.

    Raises ValueError listing the catalog when the name is unknown.
    """
    if isinstance(name, TransformerConfig):
        return name
    if isinstance(name, dict):
        return TransformerConfig.model_validate(name)
    key = name.strip().lower()
    if key not in CATALOG:
        raise ValueError(f"a model from the catalog ({', '.join(CATALOG)}) or a mapping of its shape, "
                         f"not {name!r}")
    return CATALOG[key]


def model_by_name(data: Any) -> Any:
    """Return a problem document with a catalog model name under `model` replaced by that model's shape
    (a pydantic 'before' validator's helper); other documents unchanged. Raises ValueError at 'model'."""
    if isinstance(data, dict) and isinstance(data.get("model"), str):
        data = dict(data)
        try:
            data["model"] = model_config(data["model"]).model_dump()
        except ValueError as exc:
            raise ValueError(f"at model: {exc}") from None
    return data


def scaled(config: TransformerConfig, *, num_layers: int | None = None, hidden: int | None = None,
           vocab: int | None = None) -> TransformerConfig:
    """Return a smaller copy of `config` (fewer layers, narrower, smaller vocabulary), renamed to say so.

    Keeps the head width and the FFN/hidden and KV/head ratios, so per-layer costs scale predictably.
    """
    h = hidden or config.hidden
    heads = max(1, h // config.dhead) if hidden else config.heads
    kv = max(1, heads * config.kv // config.heads)
    while heads % kv:
        kv -= 1
    ffn = int(round(config.ffn_hidden * h / config.hidden))
    return config.model_copy(update={
        "name": f"{config.name}(scaled: layers={num_layers or config.num_layers}, hidden={h})",
        "num_layers": num_layers or config.num_layers, "hidden": h, "heads": heads, "kv_heads": kv,
        "head_dim": config.dhead if config.head_dim else None, "ffn_hidden": ffn,
        "vocab": vocab or config.vocab})
