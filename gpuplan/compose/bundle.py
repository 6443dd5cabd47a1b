"""The training bundle: a directory of the three plans and a manifest with their digests.

    DIR/poseidon.json        the parallel plan (stages, degrees, layers, micro-batches)
    DIR/tessel.json          the schedule of those stages (one Tessel device per stage)
    DIR/lagom-stage{k}.json  NCCL settings of stage k (GPU stages that communicate)
    DIR/manifest.json        kind "training-bundle", files with their sha256, scales, predictions, gains

`check_bundle` trusts nothing in the manifest: each file's digest, each plan's own check, and their
agreement (the Tessel problem is rebuilt from the Poseidon plan and the manifest's scales, so stages,
devices and micro-batches must match; each Lagom plan is for its stage's device type and
micro-batches), and the predicted times recomputed from the schedule.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gpuplan.compose.comm import lagom_document
from gpuplan.compose.pipeline import (SCALE_TOLERANCE, baseline_schedule, composed_time_s, gains_table,
                                      stage_tails_s, tessel_problem)
from gpuplan.errors import InputError
from gpuplan.io import atomic_write_text, digest, make_output_dir, read_json
from gpuplan.models.base import Violation
from gpuplan.models.plan import Plan, same_figure

BUNDLE_KIND = "training-bundle"
BUNDLE_SCHEMA = 1
MANIFEST = "manifest.json"


def file_sha256(path: Path) -> str:
    """Return 'sha256:<hex>' of a file's bytes."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def write_bundle(directory: str | Path, comp: Any) -> Path:
    """Write a Composition as a bundle directory (created if missing); return the manifest's path."""
    out = make_output_dir(directory, "bundle directory")
    files: dict[str, Plan] = {"poseidon.json": comp.poseidon, "tessel.json": comp.tessel}
    files.update({f"lagom-stage{s}.json": p for s, p in sorted(comp.lagom.items())})
    entries = {}
    for name, plan in files.items():
        plan.save(out / name)
        entries[name] = {"kind": plan.kind, "sha256": file_sha256(out / name)}
    stages = comp.poseidon.stages
    manifest = {
        "kind": BUNDLE_KIND, "schema_version": BUNDLE_SCHEMA,
        "composition": {"method": "fixed-point", "rounds": comp.rounds, "converged": comp.converged},
        "files": entries,
        "stages": [{"index": s.index, "device_type": s.device_type, "gpu_ids": list(s.gpu_ids), "tp": s.tp,
                    "dp": s.dp, "layers": [s.first_layer, s.last_layer]} for s in stages],
        "num_microbatches": comp.poseidon.num_microbatches,
        "scales": comp.scales,
        "predicted": comp.predicted,
        "gains": comp.gains(),
        "step_times_s": comp.step_times_s,
        "notes": comp.notes,
    }
    return atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def is_bundle(path: str | Path) -> bool:
    """Return True when `path` is a directory holding a bundle manifest."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Return the manifest of a bundle; raise InputError naming the file when it is not one (its kind,
    schema version, or the shape of files, scales and predicted, which every reader relies on)."""
    path = Path(directory) / MANIFEST
    data = read_json(path, what="bundle manifest")
    if not isinstance(data, dict) or data.get("kind") != BUNDLE_KIND:
        raise InputError.at(str(path), "kind", data.get("kind") if isinstance(data, dict) else data,
                            f"{BUNDLE_KIND!r}")
    if data.get("schema_version") != BUNDLE_SCHEMA:
        raise InputError.at(str(path), "schema_version", data.get("schema_version"), str(BUNDLE_SCHEMA))
    for field_name in ("files", "scales", "predicted"):
        if field_name not in data:
            raise InputError.at(str(path), field_name, None, "present")
    files, scales, predicted = data["files"], data["scales"], data["predicted"]
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        raise InputError.at(str(path), "files", files, "a mapping of file names to {kind, sha256}")
    if not isinstance(scales, list) or not all(_is_number(x) for x in scales):
        raise InputError.at(str(path), "scales", scales, "a list of numbers, one per stage")
    if not isinstance(predicted, dict) or not all(_is_number(x) for x in predicted.values()):
        raise InputError.at(str(path), "predicted", predicted, "a mapping of figure names to numbers")
    return data


def _is_number(value: Any) -> bool:
    """Return whether `value` is an int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_bundle(directory: str | Path) -> tuple[dict[str, Any], dict[str, Plan]]:
    """Return the manifest and the plans of a bundle by file name (nothing is executed)."""
    manifest = read_manifest(directory)
    return manifest, _load_plans(directory, manifest)


def _load_plans(directory: str | Path, manifest: dict[str, Any]) -> dict[str, Plan]:
    """Return the plans the manifest lists, by file name."""
    from gpuplan import api

    plans = {}
    for name in manifest["files"]:
        if "/" in name or "\\" in name or name.startswith("."):
            raise InputError.at(str(Path(directory) / MANIFEST), f"files.{name}", name, "a plain file name")
        plans[name] = api.load_plan(Path(directory) / name)
    return plans


def stage_envs(plans: dict[str, Plan]) -> dict[int, dict[str, str]]:
    """Return each stage's NCCL env from a bundle's Lagom plans (`lagom-stage{k}.json`), by stage."""
    return {int(name.removeprefix("lagom-stage").removesuffix(".json")): dict(p.env)  # type: ignore[attr-defined]
            for name, p in plans.items() if name.startswith("lagom-stage")}


def check_bundle(directory: str | Path) -> list[Violation]:
    """Return every violation of a bundle ([] when valid): digests, each plan's check, their agreement,
    and the predicted iteration times recomputed from the schedule."""
    return checked_bundle(directory)[0]


def checked_bundle(directory: str | Path) -> tuple[list[Violation], dict[str, Any], dict[str, Plan]]:
    """Return (`check_bundle`'s violations, the manifest, the plans by file name), reading each file
    once; the plans are {} when a file is missing or was edited after composing."""
    root = Path(directory)
    manifest = read_manifest(root)
    out: list[Violation] = []
    for name, entry in manifest["files"].items():
        path = root / name
        if not path.is_file():
            out.append(Violation(f"files.{name}", f"{name} is listed in the manifest but missing"))
            continue
        sha = file_sha256(path)
        if sha != entry.get("sha256"):
            out.append(Violation(f"files.{name}", f"{name}'s digest {sha[:19]}... differs from the "
                                 f"manifest's {str(entry.get('sha256'))[:19]}...: it was edited after composing"))
    if out:
        return out, manifest, {}
    plans = _load_plans(root, manifest)
    return _plan_violations(manifest, plans), manifest, plans


def _plan_violations(manifest: dict[str, Any], plans: dict[str, Plan]) -> list[Violation]:
    """Return the violations of a bundle's intact plans: each plan's check and their agreement."""
    from gpuplan import api

    out: list[Violation] = []
    for name, plan in plans.items():
        out += [Violation(f"{name}:{v.code}", v.message, v.data) for v in api.check(None, plan)]
    poseidon, tessel = plans.get("poseidon.json"), plans.get("tessel.json")
    if poseidon is None or tessel is None:
        return out + [Violation("files", "a bundle holds poseidon.json and tessel.json")]
    doc = poseidon.document()
    n, m = len(doc["stages"]), int(doc["num_microbatches"])
    scales = [float(x) for x in manifest["scales"]]
    if len(scales) != n:
        return out + [Violation("scales", f"{len(scales)} scales for {n} Poseidon stages")]
    claims = _manifest_claims(manifest, plans, scales)
    tprob = tessel.problem or {}
    if int(tprob.get("devices", -1)) != n:
        out.append(Violation("agreement.stages", f"the schedule has {tprob.get('devices')} devices, the "
                             f"parallel plan {n} stages"))
    if int(tprob.get("microbatches", -1)) != m:
        out.append(Violation("agreement.microbatches", f"the schedule runs {tprob.get('microbatches')} "
                             f"micro-batches, the parallel plan {m}"))
    if out:
        return out + claims
    split = any(b.get("kind") == "backward_weight" for b in tprob.get("blocks", []))
    expected = tessel_problem(doc, scales, split=split)
    if digest(expected.document()) != tessel.input_digest:
        out.append(Violation("agreement.tessel", "the schedule's problem is not the one the parallel plan and "
                             "the manifest's scales give (other stage times, blocks or memory caps)"))
    for s, st in enumerate(doc["stages"]):
        name = f"lagom-stage{s}.json"
        if name not in plans:
            if lagom_document(doc, s, expected, tessel.schedule) is not None:  # type: ignore[attr-defined]
                out.append(Violation(f"agreement.{name}", f"stage {s} communicates over NCCL but has no Lagom plan"))
            continue
        want = lagom_document(doc, s, expected, tessel.schedule)  # type: ignore[attr-defined]
        if want is None or digest(api.load_problem(want, "lagom").document()) != plans[name].input_digest:
            out.append(Violation(f"agreement.{name}", f"the Lagom plan of stage {s} is not for that stage's "
                                 f"devices ({st['device_type']}, tp {st['tp']}, dp {st['dp']}), micro-batches "
                                 f"({m}) and schedule order"))
    extra = sorted(set(plans) - {"poseidon.json", "tessel.json"} - {f"lagom-stage{s}.json" for s in range(n)})
    if extra:
        out.append(Violation("files", f"files {extra} belong to no stage of the plan"))
    want_stages = [{"index": st["index"], "device_type": st["device_type"], "gpu_ids": list(st["gpu_ids"]),
                    "tp": st["tp"], "dp": st["dp"], "layers": [st["first_layer"], st["last_layer"]]}
                   for st in doc["stages"]]
    if manifest.get("stages") != want_stages:
        out.append(Violation("agreement.stages", "the manifest's stages (devices, degrees or layers) differ from "
                             "the parallel plan's"))
    if manifest.get("num_microbatches") != m:
        out.append(Violation("agreement.microbatches", f"the manifest states {manifest.get('num_microbatches')} "
                             f"micro-batches, the parallel plan {m}"))
    out += _time_violations(manifest, doc, tessel, scales)
    return out + claims


def _manifest_claims(manifest: dict[str, Any], plans: dict[str, Plan], scales: list[float]) -> list[Violation]:
    """Return the violations of what the manifest says of its files and its composition: each file's kind
    is the plan's (and the one its name holds); the method is the fixed point, its rounds a count, and a
    composition that did not converge says so in its notes; each stage's compute scale lies between what
    its Lagom plan gives (tuned / NCCL-default iteration time, at most 1; less `SCALE_TOLERANCE`, within
    which the fixed point stops) and 1 (no speed-up), and is 1
    for a stage without one: a manifest may not claim a speed-up its Lagom plans do not give."""
    out: list[Violation] = []
    for name, entry in manifest["files"].items():
        want = "lagom" if name.startswith("lagom-stage") else name.removesuffix(".json")
        if entry.get("kind") != plans[name].kind or plans[name].kind != want:
            out.append(Violation(f"files.{name}", f"the manifest lists {name} as {entry.get('kind')!r}; it holds a "
                                 f"{plans[name].kind!r} plan, and a file of that name holds a {want!r} plan"))
    comp = manifest.get("composition")
    rounds = comp.get("rounds") if isinstance(comp, dict) else None
    if not isinstance(comp, dict) or comp.get("method") != "fixed-point" or isinstance(rounds, bool) \
            or not isinstance(rounds, int) or rounds < 0 or not isinstance(comp.get("converged"), bool):
        out.append(Violation("composition", f"composition {comp!r}: expected method 'fixed-point', rounds a count "
                             "and converged true or false"))
    elif not comp["converged"] and not any("without a fixed point" in str(note) for note in manifest.get("notes", [])):
        out.append(Violation("composition", "the composition did not converge but its notes do not say so"))
    for s, scale in enumerate(scales):
        lagom = plans.get(f"lagom-stage{s}.json")
        if lagom is None:
            low = 1.0
        else:
            default = float(lagom.predicted.get("iteration_s_nccl_default", float("nan")))
            low = min(1.0, float(lagom.iteration_s) / default) if default > 0 else 1.0  # type: ignore[attr-defined]
        if not low - SCALE_TOLERANCE <= scale <= 1.0 + 1e-12:  # the fixed point stops within SCALE_TOLERANCE
            out.append(Violation("scales", f"stage {s}'s compute scale {scale:.6g}: its "
                                 + (f"Lagom plan gives {low:.6g} (tuned / NCCL-default time)" if lagom is not None
                                    else "stage has no Lagom plan, so 1") + "; a scale lies between that and 1",
                                 {"stage": s, "scale": scale, "lowest": low}))
    return out


def _time_violations(manifest: dict[str, Any], doc: dict[str, Any], tessel: Plan, scales: list[float]
                     ) -> list[Violation]:
    """Return the violations of the manifest's predicted times and gains: the composed time from the
    schedule and scales, the Poseidon plan's own time, the 1F1B baseline re-solved (a classic schedule,
    deterministic), and every gain from those times. (The Tessel-only time comes from a time-limited
    search that is not in the bundle: it is only held to the gains it gives.)"""
    out: list[Violation] = []
    pred = manifest["predicted"]

    def stated(key: str) -> float:
        try:
            return float(pred.get(key, float("nan")))
        except (TypeError, ValueError):
            return float("nan")

    t = composed_time_s(tessel.schedule, stage_tails_s(doc, scales))  # type: ignore[attr-defined]
    base_t = baseline_schedule(doc)[2]
    for key, want, what in (("iteration_time_s", t, "the schedule and scales give"),
                            ("poseidon_iteration_time_s", float(doc.get("iteration_time_s", 0.0)),
                             "the parallel plan states"),
                            ("baseline_iteration_time_s", base_t, "1F1B with NCCL's defaults gives"),
                            ("gain_over_baseline", 1 - t / base_t, "its times give")):
        if not same_figure(stated(key), want):
            out.append(Violation(f"predicted.{key}", f"the manifest states {stated(key):.6g}; {what} {want:.6g}"))
    want_gains = gains_table(base_t, stated("tessel_iteration_time_s"), t)
    rows = manifest.get("gains")
    if not isinstance(rows, list) or len(rows) != len(want_gains):
        return out + [Violation("gains", f"the manifest's gains table has {len(rows) if isinstance(rows, list) else 0} "
                                f"rows; expected {len(want_gains)}")]
    for row, want in zip(rows, want_gains):
        bad = [k for k, v in want.items() if not isinstance(row, dict) or
               (row.get(k) != v if k == "step" else not _same_number(row.get(k), v))]
        if bad:
            out.append(Violation("gains", f"the gains row {want['step']!r} states other {', '.join(bad)} than the "
                                 "times give"))
    return out


def _same_number(stated: Any, want: float) -> bool:
    """True when `stated` is a number equal to `want` as figures compare (`same_figure`)."""
    try:
        return same_figure(float(stated), want)
    except (TypeError, ValueError):
        return False
