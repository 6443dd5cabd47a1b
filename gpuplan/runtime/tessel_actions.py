"""Per-rank action lists for torch.distributed.pipelining, made from Tessel plans, and their checker.

Actions are strings in torch's syntax: `{stage}{F|B|I|W}{microbatch}` for compute, and
`{stage}SEND_F{mb}`, `{stage}RECV_F{mb}`, `{stage}SEND_B{mb}`, `{stage}RECV_B{mb}`,
`{stage}REDUCE_GRAD` for communication and the gradient reduction. This module needs no torch:
it builds the compute-only and the compute+communication forms and checks them (dependencies,
counts, matched sends, and a deadlock simulation that says who waits on what).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuplan.models.tessel import TesselPlan, TesselProblem

KIND_CODE = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
_ACTION = re.compile(r"^(\d+)(F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD)(\d*)$")

ActionLists = dict[int, list[str]]


class ActionListError(ValueError):
    """An action list that cannot run: broken dependency, wrong counts, unmatched comms or a deadlock."""


@dataclass(frozen=True)
class Action:
    """One parsed action: stage index, type (F, B, I, W, SEND_F, ...) and micro-batch (None for REDUCE_GRAD)."""

    stage: int
    op: str
    mb: int | None

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{'' if self.mb is None else self.mb}"


def parse(text: str) -> Action:
    """Return the Action written as `text` (torch's action syntax); raise ActionListError otherwise."""
    m = _ACTION.match(text.strip())
    if not m:
        raise ActionListError(f"not an action: {text!r} (expected e.g. 0F1, 2I0, 1W3, 0SEND_F1, 1REDUCE_GRAD)")
    return Action(int(m.group(1)), m.group(2), int(m.group(3)) if m.group(3) else None)


def executable_reason(problem: TesselProblem) -> str | None:
    """Return None when the placement can run under torch.distributed.pipelining, else why not.

    It needs single-device blocks, each with a stage, one forward per stage and either one full
    backward or one input + one weight backward, the stages forming one chain 0 -> 1 -> ... (a
    sequential model), and each stage on one device.
    """
    multi = [b.name for b in problem.blocks if len(b.devices) > 1]
    if multi:
        return (f"blocks {', '.join(multi)} span several devices (tensor-parallel); gpuplan run executes "
                "placements whose blocks each sit on one device, and no executor for multi-device blocks "
                "exists yet")
    if any(b.stage is None or b.kind not in KIND_CODE for b in problem.blocks):
        return "every block needs a `stage` and a kind among forward, backward, backward_input, backward_weight"
    per: dict[int, dict[str, list[str]]] = {}
    for b in problem.blocks:
        per.setdefault(b.stage or 0, {}).setdefault(KIND_CODE[b.kind], []).append(b.name)  # type: ignore[arg-type]
    if sorted(per) != list(range(len(per))):
        return f"stages must be numbered 0..{len(per) - 1} without gaps, got {sorted(per)}"
    for s, kinds in per.items():
        counts = {k: len(v) for k, v in kinds.items()}
        if counts.get("F") != 1 or not (counts.get("B") == 1 and "I" not in counts and "W" not in counts
                                        or counts.get("I") == 1 and counts.get("W") == 1 and "B" not in counts) \
                and problem.mode == "training":
            return f"stage {s} needs one forward and either one backward or one backward_input + backward_weight"
        devs = {problem.block(n).devices[0] for v in kinds.values() for n in v}
        if len(devs) != 1:
            return f"stage {s} has blocks on devices {sorted(devs)}; a stage runs on one device"
        if s > 0 and per[s - 1]["F"][0] not in problem.block(kinds["F"][0]).after:
            return f"stage {s}'s forward does not follow stage {s - 1}'s: torch runs one sequential model"
    return None


def stage_ranks(problem: TesselProblem) -> dict[int, int]:
    """Return the rank (device) of each stage."""
    return {b.stage: b.devices[0] for b in problem.blocks if b.stage is not None}


def compute_only(problem: TesselProblem, plan: TesselPlan) -> ActionLists:
    """Return each rank's compute actions in the plan's order (torch's `compute_only` format)."""
    reason = executable_reason(problem)
    if reason:
        raise ActionListError(reason)
    blocks = {b.name: b for b in problem.blocks}
    out: ActionLists = {}
    for d, dev in enumerate(plan.schedule):
        ordered = sorted(dev, key=lambda e: (e.start_s, e.end_s))
        out[d] = [f"{blocks[e.block].stage}{KIND_CODE[blocks[e.block].kind]}{e.microbatch}" for e in ordered]
    return out


def _sends(acts: list[str], r: int, ranks: dict[int, int], last: int) -> list[tuple[int, str]]:
    """Return (destination rank, receive action) for each send rank `r` makes, in its order."""
    out = []
    for text in acts:
        a = parse(text)
        if a.op == "F" and a.stage < last and ranks[a.stage + 1] != r:
            out.append((ranks[a.stage + 1], f"{a.stage + 1}RECV_F{a.mb}"))
        if a.op in ("B", "I") and a.stage > 0 and ranks[a.stage - 1] != r:
            out.append((ranks[a.stage - 1], f"{a.stage - 1}RECV_B{a.mb}"))
    return out


def with_comms(actions: ActionLists, ranks: dict[int, int], n_microbatches: int) -> ActionLists:
    """Return the compute+communication form: each send right after the compute that produces it,
    receives posted before the compute that consumes them and in the order the peer sends them
    (point-to-point messages between two ranks match first-in first-out), and `{stage}REDUCE_GRAD`
    after each stage's last backward."""
    last = max(ranks)
    queues: dict[tuple[int, int], list[str]] = {}
    for src, acts in actions.items():
        for dst, recv in _sends(acts, src, ranks, last):
            queues.setdefault((src, dst), []).append(recv)
    out: ActionLists = {r: [] for r in actions}
    done_bwd: dict[int, int] = {}
    for r, acts in actions.items():
        for text in acts:
            a = parse(text)
            s, mb = a.stage, a.mb
            need = None
            if a.op == "F" and s > 0 and ranks[s - 1] != r:
                need = (ranks[s - 1], f"{s}RECV_F{mb}")
            if a.op in ("B", "I") and s < last and ranks[s + 1] != r:
                need = (ranks[s + 1], f"{s}RECV_B{mb}")
            if need is not None and need[1] not in out[r]:
                queue = queues.get((need[0], r), [])
                if need[1] not in queue:
                    raise ActionListError(f"rank {r} needs {need[1]} but rank {need[0]} never sends it")
                while queue:
                    recv = queue.pop(0)
                    out[r].append(recv)
                    if recv == need[1]:
                        break
            out[r].append(text)
            if a.op == "F" and s < last and ranks[s + 1] != r:
                out[r].append(f"{s}SEND_F{mb}")
            if a.op in ("B", "I") and s > 0 and ranks[s - 1] != r:
                out[r].append(f"{s}SEND_B{mb}")
            if a.op in ("B", "W"):
                done_bwd[s] = done_bwd.get(s, 0) + 1
                if done_bwd[s] == n_microbatches:
                    out[r].append(f"{s}REDUCE_GRAD")
    return out


def check_actions(actions: ActionLists, ranks: dict[int, int], n_microbatches: int) -> None:
    """Check an action list (either form); raise ActionListError saying what is wrong.

    Static: actions sit on their stage's rank; per stage and micro-batch one F, and one B or one I
    and one W; between two ranks, receives are posted in the order the sends happen (messages match
    first-in first-out: another order silently swaps tensors of equal shape). Dynamic: every rank
    runs its list in order; a receive is posted without waiting; a compute waits for its inputs (the
    previous stage's forward / the next stage's backward: its receive posted and the peer's send
    done when on another rank; its own forward / input gradient). When no rank can move, the error
    lists each rank's blocked action and what it waits for.
    """
    parsed = {r: [parse(t) for t in acts] for r, acts in actions.items()}
    has_comms = any(a.op.startswith(("SEND", "RECV")) for acts in parsed.values() for a in acts)
    last = max(ranks)
    count: dict[tuple[int, str, int | None], int] = {}
    for r, acts in parsed.items():
        for a in acts:
            if ranks.get(a.stage) != r:
                raise ActionListError(f"rank {r} runs {a}, but stage {a.stage} lives on rank {ranks.get(a.stage)}")
            count[(a.stage, a.op, a.mb)] = count.get((a.stage, a.op, a.mb), 0) + 1
    for s in ranks:
        for mb in range(n_microbatches):
            f, b, i, w = (count.get((s, op, mb), 0) for op in ("F", "B", "I", "W"))
            if f != 1 or not (b == 1 and i == w == 0 or b == 0 and i == w == 1):
                raise ActionListError(f"stage {s} micro-batch {mb}: needs one F and one B (or one I and one W), "
                                      f"found F={f} B={b} I={i} W={w}")
    if has_comms:
        _check_fifo(parsed, ranks, last)
    done: set[tuple[int, str, int | None]] = set()
    pos = {r: 0 for r in parsed}

    def waits_for(r: int, a: Action) -> str | None:
        """Return what action `a` on rank `r` still waits for, or None when it can run."""
        need: list[tuple[int, str, int | None]] = []
        if a.op == "F" and a.stage > 0:
            if has_comms and ranks[a.stage - 1] != r:
                need += [(a.stage, "RECV_F", a.mb), (a.stage - 1, "SEND_F", a.mb)]
            else:
                need.append((a.stage - 1, "F", a.mb))
        if a.op in ("B", "I"):
            need.append((a.stage, "F", a.mb))
            if a.stage < last:
                if has_comms and ranks[a.stage + 1] != r:
                    need += [(a.stage, "RECV_B", a.mb), (a.stage + 1, "SEND_B", a.mb)]
                else:
                    need.append((a.stage + 1, "B" if (a.stage + 1, "B", a.mb) in count else "I", a.mb))
        if a.op == "W":
            need.append((a.stage, "I", a.mb))
        if a.op == "REDUCE_GRAD":
            need += [(a.stage, "B" if (a.stage, "B", mb) in count else "W", mb) for mb in range(n_microbatches)]
        if a.op == "SEND_F":
            need.append((a.stage, "F", a.mb))
        if a.op == "SEND_B":
            need.append((a.stage, "B" if (a.stage, "B", a.mb) in count else "I", a.mb))
        for key in need:
            if key not in done:
                return f"{key[0]}{key[1]}{key[2]}"
        return None

    while any(pos[r] < len(acts) for r, acts in parsed.items()):
        moved = False
        for r, acts in parsed.items():
            while pos[r] < len(acts) and waits_for(r, acts[pos[r]]) is None:
                done.add((acts[pos[r]].stage, acts[pos[r]].op, acts[pos[r]].mb))
                pos[r] += 1
                moved = True
        if not moved:
            stuck = [f"rank {r} blocks at {acts[pos[r]]} waiting for {waits_for(r, acts[pos[r]])}"
                     for r, acts in parsed.items() if pos[r] < len(acts)]
            missing = [w for w in (waits_for(r, acts[pos[r]]) for r, acts in parsed.items() if pos[r] < len(acts))
                       if w and not any(str(a) == w for acts in parsed.values() for a in acts)]
            why = f"; {', '.join(sorted(set(missing)))} never runs" if missing else ""
            raise ActionListError("deadlock: " + "; ".join(stuck) + why)


def _check_fifo(parsed: dict[int, list[Action]], ranks: dict[int, int], last: int) -> None:
    """Raise ActionListError when two ranks' sends and receives are not in the same order."""
    sent: dict[tuple[int, int], list[str]] = {}
    got: dict[tuple[int, int], list[str]] = {}
    for r, acts in parsed.items():
        for a in acts:
            if a.op == "SEND_F":
                sent.setdefault((r, ranks[a.stage + 1]), []).append(f"F{a.mb}->stage{a.stage + 1}")
            elif a.op == "SEND_B":
                sent.setdefault((r, ranks[a.stage - 1]), []).append(f"B{a.mb}->stage{a.stage - 1}")
            elif a.op == "RECV_F":
                got.setdefault((ranks[a.stage - 1], r), []).append(f"F{a.mb}->stage{a.stage}")
            elif a.op == "RECV_B":
                got.setdefault((ranks[a.stage + 1], r), []).append(f"B{a.mb}->stage{a.stage}")
    for pair in sorted(set(sent) | set(got)):
        s, g = sent.get(pair, []), got.get(pair, [])
        if s != g:
            k = next((i for i, (x, y) in enumerate(zip(s, g)) if x != y), min(len(s), len(g)))
            raise ActionListError(
                f"rank {pair[0]} sends to rank {pair[1]} in the order {s[k:k + 3]}... but rank {pair[1]} "
                f"receives {g[k:k + 3]}... (message {k}); point-to-point messages match in order, so "
                "tensors would be swapped")


def csv_text(actions: ActionLists) -> str:
    """Return the action lists as torch's CSV (one row per rank, one cell per action)."""
    return "".join(",".join(actions[r]) + "\n" for r in sorted(actions))
