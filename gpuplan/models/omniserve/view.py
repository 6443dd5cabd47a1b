"""What `compare`, `show` and `show --png` print for an OmniServe plan."""

from __future__ import annotations

from typing import Any

from gpuplan.models.base import Table

RATE_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)   # LS rates of the --png sweep, relative to the problem's


def summarize(problem: Any, plan: Any) -> dict[str, Any]:
    """Return the figures `gpuplan compare omniserve` prints for a plan."""
    p = plan.predicted
    return {"policy": plan.policy, "token_budget": plan.token_budget, "be_gpu_fraction": plan.be_gpu_fraction,
            "ls_attainment": p.get("ls_attainment"), "ls_ttft_p95_s": p.get("ls_ttft_p95_s"),
            "ls_tpot_p95_s": p.get("ls_tpot_p95_s"), "ls_rejected": p.get("ls_rejected"),
            "be_tokens_per_s": p.get("be_output_tokens_per_s"), "be_finished": p.get("be_finished")}


def describe(problem: Any, plan: Any) -> list[Table]:
    """Return the policy, the pools and the first iterations of the schedule as tables."""
    params = Table(f"policy {plan.policy}", ["token_budget", "tpot_target_s", "be_gpu_fraction", "admission",
                                             "be_batch_max", "pace_factor", "be_prefill_max",
                                             "be_inflight_max"],
                   [[plan.token_budget, plan.tpot_target_s, plan.be_gpu_fraction, plan.admission, plan.be_batch_max,
                     plan.pace_factor, plan.be_prefill_max, plan.be_inflight_max]])
    figs = Table("predicted", ["figure", "value"], [[k, v] for k, v in plan.predicted.items()])
    pools = {n: p for n, p in problem.pools()}
    prow = [[n, pools[n].local, pools[n].attention_tokens_per_s, pools[n].memory_bytes / 1e9, pools[n].network_gbps]
            for n in plan.pools if n in pools]
    tables = [params, figs]
    if prow:
        tables.append(Table("CPU pools used", ["pool", "local", "attention token-layers/s", "memory GB", "Gb/s"], prow))
    rows = [[k, r.start_s, r.duration_s, r.ls_decodes, r.ls_prefill_tokens, r.be_prefill_tokens, r.be_decodes,
             len(r.merges), r.gpu_kv_tokens] for k, r in enumerate(plan.schedule[:20])]
    if rows:
        tables.append(Table(f"schedule: first {len(rows)} of {len(plan.schedule)} recorded iterations",
                            ["k", "start_s", "duration_s", "LS decodes", "LS prefill", "BE prefill", "BE tokens",
                             "merges", "GPU KV tokens"], rows))
    return tables


def rate_sweep(problem: Any, params: Any, scales: tuple[float, ...] = RATE_SCALES) -> list[dict[str, float]]:
    """Return [{ls_rate_per_s, ls_attainment, be_output_tokens_per_s}] simulating `params` at the problem's
    LS rate times each scale (same seed)."""
    from gpuplan.models.omniserve.evaluate import run_policy

    out = []
    for s in scales:
        rate = problem.ls.rate_per_s * s
        ev = run_policy(problem, params, ls_rate_per_s=rate, record=False)
        out.append({"ls_rate_per_s": rate, "ls_attainment": ev.figures["ls_attainment"],
                    "be_output_tokens_per_s": ev.figures["be_output_tokens_per_s"]})
    return out


def draw(problem: Any, plan: Any, path: Any) -> None:
    """Write a PNG of LS SLO attainment and BE throughput vs LS request rate: the plan's policy and the
    GPU-only Sarathi-Serve reference at the same token budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpuplan.io import atomic_write_figure
    from gpuplan.models.omniserve import params_of
    from gpuplan.models.omniserve.policy import PolicyParams

    mine = params_of(plan)
    curves = {plan.policy: rate_sweep(problem, mine)}
    if plan.policy != "sarathi":
        curves["sarathi"] = rate_sweep(problem, PolicyParams("sarathi", plan.token_budget, plan.tpot_target_s))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, pts in curves.items():
        x = [p["ls_rate_per_s"] for p in pts]
        a.plot(x, [100 * p["ls_attainment"] for p in pts], marker="o", label=name)
        b.plot(x, [p["be_output_tokens_per_s"] for p in pts], marker="o", label=name)
    a.set_xlabel("LS request rate (req/s)")
    a.set_ylabel("LS SLO attainment (%)")
    b.set_xlabel("LS request rate (req/s)")
    b.set_ylabel("BE output tokens/s")
    a.legend()
    fig.suptitle(f"{problem.name or 'omniserve'}: LS attainment and BE throughput vs LS rate")
    fig.tight_layout()
    atomic_write_figure(fig, path, dpi=100)
