"""OmniServe's input: GPUs, CPU pools, the model, and the latency-sensitive (LS) and best-effort (BE)
services with their SLOs and traces. Pure data plus the derived figures every policy reads.

Units: seconds (`_s`), bytes (`_bytes`), gigabits/s (`_gbps`); an attention rate is in KV
token-layers per second (one layer of attention over one cached token of one request).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gpuplan.models.base import Problem, Schema
from gpuplan.models.catalog import catalog_entry
from gpuplan.models.workload import DTYPE_BYTES, TransformerConfig, model_config
from gpuplan.units import Bytes, Seconds

MAX_LAYERS = 1024          # per-layer arrays are allocated per iteration
MAX_POOLS = 256            # CPU pools after count expansion
MAX_REQUESTS = 20_000      # per service (bounds the simulated work)
MAX_TOKENS = 1 << 20       # one request's prompt or output


class GpuGroup(Schema):
    """The GPUs of one serving instance: catalog type, how many, the tensor-parallel degree (= count:
    one engine), and the fraction of their memory the engine may use for weights plus KV cache."""

    type: str = "A100-80GB"
    count: int = Field(default=4, ge=1, le=64)
    tp: int = Field(default=4, ge=1, le=64)
    memory_fraction: float = Field(default=0.9, gt=0, le=1)

    @model_validator(mode="after")
    def _one_engine(self) -> "GpuGroup":
        if catalog_entry(self.type) is None:
            raise ValueError(f"at type: a GPU type of the catalog (e.g. A100-80GB), not {self.type!r}")
        if self.tp != self.count:
            raise ValueError(f"at tp: equal to count ({self.count}): one tensor-parallel engine per problem, "
                             f"not tp={self.tp}")
        return self


class DenseFigures(Schema):
    """A stated or profiled staircase f_D(n) = c0_s + max(floor_s, step_s * ceil(n / tau)) for the whole
    model's dense modules per iteration of n tokens (seconds)."""

    c0_s: Seconds = Field(ge=0)
    floor_s: Seconds = Field(ge=0)
    step_s: Seconds = Field(gt=0)
    tau: int = Field(ge=1, le=4096)


class LatencyFigures(Schema):
    """Measured or stated latency figures replacing the catalog-built ones (any subset)."""

    dense: DenseFigures | None = None
    attention_s_per_kv_token: Seconds | None = Field(default=None, gt=0)


class CpuPool(Schema):
    """A CPU pool for BE attention: the GPU server's host (`local`) or a remote CPU-only server.

    attention_tokens_per_s: KV token-layers attended per second by the whole pool (profiled or
    stated); memory_bytes: memory for BE KV; network to the GPU server: bandwidth (Gb/s) and one-way
    latency (s). `count` repeats the pool (names name0, name1, ...)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    count: int = Field(default=1, ge=1, le=64)
    local: bool = False
    cores: int = Field(default=48, ge=1, le=4096)
    attention_tokens_per_s: float = Field(gt=0, le=1e13)
    memory_bytes: Bytes = Field(gt=0)
    network_gbps: float = Field(default=100.0, gt=0, le=1e5)
    latency_s: Seconds = Field(default=1e-5, ge=0, le=1.0)


class LsService(Schema):
    """The latency-sensitive service: Poisson (or gamma) arrivals with ShareGPT lengths, and its SLOs."""

    rate_per_s: float = Field(gt=0, le=1e4)
    requests: int = Field(ge=1, le=MAX_REQUESTS)
    ttft_slo_s: Seconds = Field(gt=0, le=3600)
    tpot_slo_s: Seconds = Field(gt=0, le=60)
    lengths: Literal["sample", "sharegpt", "auto"] = "sample"
    arrival: Literal["poisson", "gamma"] = "poisson"
    cv: float = Field(default=1.0, gt=0, le=100)


class BeService(Schema):
    """The best-effort service: long-prompt (LongBench-like) requests with lognormal lengths."""

    rate_per_s: float = Field(gt=0, le=1e4)
    requests: int = Field(ge=0, le=MAX_REQUESTS)
    mean_prompt_tokens: float = Field(default=8952.0, ge=16, le=MAX_TOKENS)
    mean_output_tokens: float = Field(default=136.0, ge=4, le=MAX_TOKENS)
    sigma: float = Field(default=0.6, ge=0, le=3)
    max_tokens: int = Field(default=32768, ge=16, le=MAX_TOKENS)


class OmniServeProblem(Problem):
    """LS and BE services on one GPU engine plus CPU pools for BE attention (see docs/omniserve.md)."""

    kind: Literal["omniserve"] = "omniserve"
    model: str | TransformerConfig = "llama2-70b"
    dtype: str = "bf16"
    gpus: GpuGroup = Field(default_factory=GpuGroup)
    latency: LatencyFigures | None = None
    cpu_pools: list[CpuPool] = Field(default_factory=list, max_length=MAX_POOLS)
    ls: LsService
    be: BeService
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    tpot_margin: float = Field(default=0.1, ge=0, lt=1)
    piggyback_overhead_s: Seconds = Field(default=5e-4, ge=0, le=1.0)
    schedule_limit: int = Field(default=3000, ge=0, le=100_000)

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                model_config(v)
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "OmniServeProblem":
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"at dtype: one of {', '.join(DTYPE_BYTES)}, not {self.dtype!r}")
        cfg = self.config
        if cfg.num_layers > MAX_LAYERS:
            raise ValueError(f"at model.num_layers: at most {MAX_LAYERS}, not {cfg.num_layers}")
        if sum(p.count for p in self.cpu_pools) > MAX_POOLS:
            raise ValueError(f"at cpu_pools: at most {MAX_POOLS} pools after count expansion")
        names = [n for n, _ in self.pools()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"at cpu_pools: distinct pool names (after count expansion), but {dup} repeat")
        free = self.gpu_memory_bytes() - self.weight_bytes()
        if free <= 0 or not math.isfinite(free) or self.kv_capacity_tokens() < 1:
            raise ValueError(f"at gpus: memory for the weights and a KV cache; the model's weights take "
                             f"{self.weight_bytes() / 1e9:.1f} GB of {self.gpu_memory_bytes() / 1e9:.1f} GB usable")
        return self

    # ---------------------------------------------------------------- derived figures

    @cached_property
    def config(self) -> TransformerConfig:
        """Return the model's transformer shape (catalog name or inline)."""
        return model_config(self.model)

    def layers(self) -> int:
        """Return the number of transformer layers."""
        return self.config.num_layers

    def pools(self) -> list[tuple[str, CpuPool]]:
        """Return (name, pool) for every CPU pool after expanding `count`."""
        out: list[tuple[str, CpuPool]] = []
        for p in self.cpu_pools:
            out += [(p.name, p)] if p.count == 1 else [(f"{p.name}{i}", p) for i in range(p.count)]
        return out

    def pool_names(self) -> list[str]:
        """Return the CPU pool names in order."""
        return [n for n, _ in self.pools()]

    def gpu_memory_bytes(self) -> float:
        """Return the GPU memory the engine may use (bytes, all GPUs of the instance)."""
        entry = catalog_entry(self.gpus.type)
        assert entry is not None
        return float(entry["memory_bytes"]) * self.gpus.count * self.gpus.memory_fraction  # type: ignore[arg-type]

    def weight_bytes(self) -> float:
        """Return the model's weight bytes in `dtype`."""
        return float(self.config.total_params()) * DTYPE_BYTES[self.dtype]

    def kv_bytes_per_token(self) -> float:
        """Return the KV-cache bytes one token holds over all layers (K and V, all KV heads)."""
        cfg = self.config
        return 2.0 * cfg.kv * cfg.dhead * DTYPE_BYTES[self.dtype] * cfg.num_layers

    def kv_capacity_tokens(self) -> int:
        """Return the GPU KV cache size in tokens (memory left after the weights)."""
        return int(max(0.0, self.gpu_memory_bytes() - self.weight_bytes()) // self.kv_bytes_per_token())

    def attention_io_bytes(self) -> tuple[float, float]:
        """Return the bytes shipped per BE request per layer: (q + k + v of one token to the CPU, the
        attention output back)."""
        cfg = self.config
        e = DTYPE_BYTES[self.dtype]
        return (cfg.heads + 2 * cfg.kv) * cfg.dhead * e, cfg.heads * cfg.dhead * e

    def tpot_target_s(self) -> float:
        """Return the per-iteration time the controller keeps under: the TPOT SLO less the margin (s)."""
        return self.ls.tpot_slo_s * (1.0 - self.tpot_margin)
