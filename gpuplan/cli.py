"""The `gpuplan` command: a thin shell over the Python API (gpuplan.api)."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

from gpuplan import api, registry
from gpuplan.commands import ProblemInputs, default_inputs
from gpuplan.errors import GpuplanError, InputError, SolverError
from gpuplan.models.base import Table
from gpuplan.cliout import (STDOUT, OutputPath, Seconds, emit_json, json_flag, json_option, print_check, say,
                             setup_logging, table_doc)
from gpuplan.render import plan_header, print_tables

EXIT_VIOLATIONS = 1
EXIT_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_MISSING_EXTRA = 4
EXIT_SOLVER = 5  # the solver stopped without a plan (SolverError): not bad input, not a proof of infeasibility


def _command_modules() -> list[Any]:
    import gpuplan.commands as pkg

    return [importlib.import_module(f"gpuplan.commands.{m.name}")
            for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
            if not m.name.startswith("_")]


def _inputs() -> dict[str, ProblemInputs]:
    found = {k: default_inputs(k) for k in registry.kinds()}
    for mod in _command_modules():
        spec = getattr(mod, "INPUTS", None)
        if isinstance(spec, ProblemInputs):
            found[spec.kind] = spec
    return found


@contextmanager
def _progress(enabled: bool) -> Iterator[registry.Progress]:
    """Yield a progress callback drawing a rich progress bar on stderr (a no-op when disabled)."""
    if not enabled:
        yield registry.no_progress
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("solving", total=1.0)

        def update(fraction: float | None, message: str = "") -> None:
            bar.update(task, completed=fraction if fraction is not None else None,
                       description=message or "solving")

        yield update


_LOG = logging.getLogger("gpuplan.cli")

# The shipped example each kind's --help shows (solve, compare).
_EXAMPLES = {
    "oef": "examples/oef/four-tenants.yaml",
    "poseidon": "examples/poseidon/h100-a100-small.yaml",
    "tessel": "examples/tessel/1f1b-4.yaml",
    "lagom": "examples/lagom/small.yaml",
    "aurora": "examples/aurora/small-2regions.yaml",
    "psrl": "examples/psrl/small-agent.yaml",
    "omniserve": "examples/omniserve/llama70b-small.yaml",
    "stragglers": "examples/stragglers/three-jobs.yaml",
    "hetis": "examples/hetis/small.yaml",
}


def _article(word: str) -> str:
    """Return 'an' before a vowel sound, else 'a' (\"an aurora problem\", \"a tessel problem\")."""
    return "an" if word[:1].lower() in "aeio" else "a"


def _example(kind: str, verb: str) -> str:
    """Return the epilog of `gpuplan solve|compare KIND --help`: a worked example and the exit codes."""
    example = _EXAMPLES.get(kind, f"examples/{kind}/INPUT.yaml")
    if verb == "solve":
        lines = [f"  gpuplan solve {kind} {example} -o {kind}-plan.json",
                 f"  gpuplan solve {kind} {example} --json | jq .objective"]
    else:
        lines = [f"  gpuplan compare {kind} {example} --png compare.png",
                 f"  gpuplan compare {kind} {example} --json > table.json"]
    return "\b\nExamples:\n" + "\n".join(lines) + "\n\n" + EXIT_CODES_HELP


def _option_keys(kind: str) -> str:
    """Return 'Keys: solver: a, b; other: c.' listing each solver's option names (for --help)."""
    parts = []
    for s in registry.solvers(kind):
        names = sorted(registry.solver_options(s))
        if names:
            parts.append(f"{s.name}: {', '.join(names)}")
    return ("Keys: " + "; ".join(parts) + ".") if parts else "No solver of this kind takes options."


def _show_progress(quiet: bool) -> bool:
    """Return whether to draw a progress bar: on a terminal (stderr), unless -q or the global -q."""
    ctx = click.get_current_context(silent=True)
    root_quiet = bool(ctx and ctx.find_root().params.get("quiet"))
    return not quiet and not root_quiet and sys.stderr.isatty()


@contextmanager
def _spinner(message: str, enabled: bool) -> Iterator[None]:
    """Show a spinner with the elapsed time on stderr while the block runs (a no-op when disabled)."""
    if not enabled:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        bar.add_task(message, total=None)
        yield


def _plan_doc(plan: Any, plan_file: str, tables: list[Table]) -> dict[str, Any]:
    """Return the JSON document of a plan for solve/show: plan_file, kind, status, objective_name,
    objective, predicted, solver, seed, solve_time_s, message, input_digest, tables."""
    return {"plan_file": plan_file, "kind": plan.kind, "status": plan.status.value,
            "objective_name": plan.objective_name, "objective": plan.objective, "predicted": plan.predicted,
            "solver": plan.solver.name if plan.solver else None, "seed": plan.solver.seed if plan.solver else None,
            "solve_time_s": plan.solver.wall_time_s if plan.solver else None, "message": plan.message,
            "input_digest": plan.input_digest, "tables": [table_doc(t) for t in tables]}


def exit_code(exc: Exception) -> int:
    """Return the exit code of a gpuplan error: EXIT_SOLVER for a solver that stopped without a plan
    (SolverError), EXIT_INPUT for any other (bad input, option or output path)."""
    return EXIT_SOLVER if isinstance(exc, SolverError) else EXIT_INPUT


def _fail(exc: Exception, code: int | None = None) -> None:
    """Print `error: EXC` on stderr and exit with `code` (default: exit_code(exc))."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(exit_code(exc) if code is None else code)


def _parse_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """Return the --option KEY=VALUE pairs as a mapping, each VALUE read as YAML with the limits of
    input documents (finite numbers, bounded size); raise BadParameter or InputError otherwise."""
    from gpuplan.io import parse_document

    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p or not p.split("=", 1)[0]:
            raise click.BadParameter(f"expected KEY=VALUE, got {p!r}", param_hint="--option")
        k, v = p.split("=", 1)
        out[k] = parse_document(v, f"--option {k}")
    return out


def _build_problem(spec: ProblemInputs, values: dict[str, Any], profile: str | None) -> Any:
    problem = spec.build(**values)
    if profile:
        from gpuplan.models.profile import load_profile

        model = registry.model(problem.kind)
        if model.with_profile is None:
            raise GpuplanError(f"{problem.kind} problems do not read profiles")
        problem = model.with_profile(problem, load_profile(profile))
    return problem


_COMMON_SOLVE = [
    click.Option(["--time-limit", "time_limit"], type=Seconds(), default=None,
                 help="Solver time limit (seconds, positive)."),
    click.Option(["--seed"], type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
                 help="Seed for every random choice (0 to 2^31-1: CP-SAT's range)."),
    click.Option(["--profile"], type=click.Path(dir_okay=False), default=None,
                 help="Use measured figures from a `gpuplan profile` file in place of the catalog."),
    click.Option(["--quiet", "-q"], is_flag=True, help="No progress bar."),
]


def _common_solve(kind: str) -> list[click.Parameter]:
    """Return the options every solve/compare command has; --profile only where the kind reads profiles."""
    reads_profiles = registry.model(kind).with_profile is not None
    return [o for o in _COMMON_SOLVE if o.name != "profile" or reads_profiles]


def _solve_command(kind: str, spec: ProblemInputs) -> click.Command:
    def callback(solver: str | None, output: str, time_limit: float | None, seed: int,
                 profile: str | None = None, quiet: bool = False, option: tuple[str, ...] = (),
                 json_out: str | None = None, **values: Any) -> None:
        try:
            problem = _build_problem(spec, values, profile)
            _LOG.info("solving %s with %s", kind, solver or "the default solver")
            with _progress(_show_progress(quiet)) as progress:
                plan = api.solve(problem, solver=solver, time_limit_s=time_limit, seed=seed,
                                 progress=progress, **_parse_options(option))
            plan.save(output)
        except GpuplanError as exc:
            _fail(exc)
        model = registry.model(kind)
        tables = [plan_header(plan)]
        if plan.ok and model.describe is not None:
            tables += model.describe(problem, plan)[:1]
        if json_out != STDOUT:
            print_tables(tables)
        emit_json("solve", _plan_doc(plan, output, tables), json_out)
        say(f"plan written to {output}", json_out)
        if not plan.ok:
            sys.exit(EXIT_INFEASIBLE)

    params = list(spec.params) + [
        click.Option(["--solver"], default=None,
                     help=f"One of: {', '.join(s.name for s in registry.solvers(kind))}."),
        click.Option(["-o", "--output"], default=f"{kind}-plan.json", show_default=True,
                     type=OutputPath(), help="Where to write the plan (JSON)."),
        click.Option(["--option"], multiple=True,
                     help=f"Solver option KEY=VALUE (repeatable; `gpuplan list --options {kind}` lists "
                          f"them with types, defaults and allowed values). {_option_keys(kind)}"),
        json_option(),
    ] + _common_solve(kind)
    return click.Command(kind, params=params, callback=callback, epilog=_example(kind, "solve"),
                         help=f"Solve {_article(kind)} {kind} problem. {spec.help}")


def _compare_command(kind: str, spec: ProblemInputs) -> click.Command:
    def callback(solvers: str | None, json_out: str | None, time_limit: float | None, seed: int,
                 profile: str | None = None, quiet: bool = False, png: str | None = None,
                 **values: Any) -> None:
        try:
            problem = _build_problem(spec, values, profile)
            with _progress(_show_progress(quiet)) as progress:
                rows = api.compare(problem, solvers=solvers.split(",") if solvers else None,
                                   time_limit_s=time_limit, seed=seed, progress=progress)
        except GpuplanError as exc:
            _fail(exc)
        columns: list[str] = []
        for _, _, summary in rows:
            columns += [c for c in summary if c not in columns and c != "status"]
        columns = [c for c in columns if c != "solve_time_s"] + ["solve_time_s"]
        reasons = {name: plan.message for name, plan, _ in rows  # why a solver found no plan
                   if plan is not None and not plan.ok and plan.message}
        table = Table(f"{kind}: every solver on the same input", ["solver", "status"] + columns,
                      [[name, f"{s.get('status')}: {reasons[name]}" if name in reasons else s.get("status")]
                       + [s.get(c) for c in columns] for name, _, s in rows])
        if json_out != STDOUT:
            print_tables([table])
        emit_json("compare", [{"solver": n, **s, **({"reason": reasons[n]} if n in reasons else {})}
                              for n, _, s in rows], json_out)
        if png:
            from gpuplan.viz import compare_figure

            try:
                compare_figure(kind, rows, Path(png))
            except GpuplanError as exc:
                _fail(exc)
            say(f"figure written to {png}", json_out)

    params = list(spec.params) + [
        click.Option(["--solvers"], default=None, help="Comma-separated subset of solvers (default: all)."),
        json_option(),
        click.Option(["--png"], type=OutputPath(), default=None,
                     help="Also draw a bar chart of every solver's objective to a PNG file."),
    ] + _common_solve(kind)
    return click.Command(kind, params=params, callback=callback, epilog=_example(kind, "compare"),
                         help=f"Solve one {kind} input with the paper's method and every baseline. {spec.help}")


EXIT_CODES_HELP = """\b
Exit codes:
  0  success
  1  the plan has violations (check; run refuses such a plan)
  2  bad input, option or output path: one line naming the file, field, value and expectation
  3  the problem is infeasible (the plan file says why)
  4  an optional dependency is missing: the message names the extra (pip install 'gpuplan[torch]')
  5  the solver stopped without a plan (e.g. out of time; not a proof of infeasibility): raise --time-limit
  gpuplan run ... -- COMMAND exits with COMMAND's own exit code."""


class _Main(click.Group):
    """The top-level group: any gpuplan error a command lets through (and a pydantic validation error of
    a model built from its inputs) is reported in one line instead of a traceback, with exit code 2 (bad
    input), or 5 for a solver that stopped without a plan."""

    def invoke(self, ctx: click.Context) -> Any:
        from pydantic import ValidationError

        try:
            return super().invoke(ctx)
        except GpuplanError as exc:
            _fail(exc)
        except ValidationError as exc:  # a model built from inputs past the loaders: name its fields, no traceback
            from gpuplan.models.base import input_error_from

            _fail(input_error_from(exc, None))
        except ModuleNotFoundError as exc:  # an optional dependency: name the extra that brings it
            from gpuplan.extras import missing_extra

            err = missing_extra(exc)
            if err is None:
                raise
            _fail(err, EXIT_MISSING_EXTRA)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="\b\nExamples:\n  gpuplan solve oef examples/oef/four-tenants.yaml -o plan.json\n"
                    "  gpuplan check plan.json --json\n  gpuplan show plan.json --png plan.png\n"
                    "  gpuplan list --options oef\n  gpuplan doctor\n\n" + EXIT_CODES_HELP)
@click.version_option(package_name="gpuplan")
@click.option("-v", "--verbose", count=True, help="More log messages on stderr (-vv: debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr: no progress bars, no info.")
def main(verbose: int, quiet: bool) -> None:
    """gpuplan: placement and scheduling plans for measured GPU clusters.

    Every verb prints tables on stdout (plain text when stdout is not a terminal); --json prints one
    JSON document instead (keys documented in docs/index.md, Scripting)."""
    setup_logging(-1 if quiet else verbose)


@main.group()
def solve() -> None:
    """Solve a problem: gpuplan solve KIND INPUT... -o PLAN."""


@main.group()
def compare() -> None:
    """Compare the paper's solver with every baseline on one input."""


@main.command("check")
@click.argument("plan_file", type=click.Path())
@click.option("--input", "input_file", type=click.Path(dir_okay=False), default=None,
              help="The problem file (default: the problem stored in the plan).")
@json_flag(help="Print {command, plan_file, kind, status, valid, violations} as JSON (or write it to FILE).")
def check_cmd(plan_file: str, input_file: str | None, json_out: str | None = None) -> None:
    """Re-validate a plan with its model's own check, independently of the solver that made it.
    PLAN_FILE may be a training bundle (directory from `gpuplan plan train`): each plan and their agreement.

    \b
    Examples:
      gpuplan check oef-plan.json
      gpuplan check oef-plan.json --input examples/oef/four-tenants.yaml --json
    Exit codes: 0 valid, 1 violations, 2 unreadable plan or input."""
    try:
        if Path(plan_file).is_dir():  # a training bundle (gpuplan.compose)
            from gpuplan.commands.plan import check_bundle_cli

            return check_bundle_cli(plan_file, json_out)
        _refuse_profile(plan_file)
        plan = api.load_plan(plan_file)
        violations = api.check(input_file, plan)
    except GpuplanError as exc:
        _fail(exc)
    print_check(plan_file, plan.kind, plan.status.value, violations, f"{plan.kind}, {plan.status.value}", json_out)


@main.command("show")
@click.argument("plan_file", type=click.Path())
@click.option("--png", type=OutputPath(), default=None, help="Also draw the plan to a PNG file.")
@json_flag(help="Print the plan's figures and tables as one JSON document (or write it to FILE): the keys "
                   "of `solve --json` plus valid, violations and png.")
def show_cmd(plan_file: str, png: str | None, json_out: str | None = None) -> None:
    """Print a plan as readable tables; --png draws it. A plan that fails check shows only its header
    and violations (exit code 1): its tables would describe figures that do not hold. An infeasible
    plan shows its header and the reason; with --png it has nothing to draw: no figure is written
    and the exit code is 3. PLAN_FILE may be a training bundle (directory): --png draws its composed
    timeline.

    \b
    Examples:
      gpuplan show oef-plan.json --png oef.png
      gpuplan show oef-plan.json --json | jq '.tables[1].rows'
    Exit codes: 0 shown, 1 the plan fails check, 2 unreadable plan, 3 --png of an infeasible plan."""
    try:
        if Path(plan_file).is_dir():  # a training bundle (gpuplan.compose)
            from gpuplan.commands.plan import show_bundle_cli

            return show_bundle_cli(plan_file, png, json_out)
        _refuse_profile(plan_file)
        plan = api.load_plan(plan_file)
        problem = api.plan_problem(plan)
        model = registry.model(plan.kind)
        tables = [plan_header(plan)]
        violations = api.check(None, plan)
        if violations and json_out:
            emit_json("show", {**_plan_doc(plan, plan_file, tables), "valid": False,
                               "violations": [str(v) for v in violations], "png": None}, json_out)
            if json_out == STDOUT:
                sys.exit(EXIT_VIOLATIONS)
        if violations:
            print_tables(tables)
            click.echo(f"{plan_file}: {len(violations)} violation(s); only the header is shown")
            for v in violations:
                click.echo(f"  {v}")
            sys.exit(EXIT_VIOLATIONS)
        if plan.ok and model.describe is not None:
            tables += model.describe(problem, plan)
        if json_out != STDOUT:
            print_tables(tables)
        drawn = bool(png) and plan.ok  # an infeasible plan holds no solution: nothing to draw
        if drawn:
            if model.draw is None:
                raise GpuplanError(f"{plan.kind} plans have no drawing")
            model.draw(problem, plan, Path(png))
            say(f"figure written to {png}", json_out)
        emit_json("show", {**_plan_doc(plan, plan_file, tables), "valid": True, "violations": [],
                           "png": png if drawn else None}, json_out)
        if png and not drawn:
            click.echo(f"{plan_file}: the plan is infeasible, so there is nothing to draw; no figure written to "
                       f"{png} (its message says why)", err=True)
            sys.exit(EXIT_INFEASIBLE)
    except GpuplanError as exc:
        _fail(exc)


def _refuse_profile(path: str) -> None:
    """Raise InputError pointing to `gpuplan profile show` when `path` is a profile, not a plan; return None."""
    if not Path(path).is_file():  # never open a FIFO or device here: load_plan refuses those
        return
    try:
        with open(path, "rb") as f:
            head = f.read(200)
    except OSError:
        return  # load_plan reports the unreadable file
    if b'"kind": "profile"' in head or b'"kind":"profile"' in head:
        raise InputError(f"{path} is a profile (from `gpuplan profile`), not a plan; "
                         f"print it with: gpuplan profile show {path}", file=path, field="kind", value="profile")


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_cmd(args: tuple[str, ...]) -> None:
    """Execute a plan with torch.distributed: gpuplan run [KIND] PLAN [--option KEY=VALUE]... [--json[=FILE]]
    [-- COMMAND...].

    The plan is checked first (as `gpuplan check PLAN` does); a plan with violations is refused with
    exit code 1 before any process starts. Needs the torch extra (pip install 'gpuplan[torch]').

    --option KEY=VALUE (repeatable) sets a runner option, e.g. steps=5, warmup=1, threads=2,
    calibrate=3, timeout_s=300, check_grads=true (tessel), return_grads=true (poseidon);
    `gpuplan list --options KIND` lists every run option of KIND with its type and default, and an
    unknown or mistyped one is refused. --json prints the measured figures as one JSON document
    {command, plan_file, kind, result} (result: the runner's figures; its tables as title/columns/rows). --png FILE draws predicted next to measured (per stage or block, and the
    iteration) from the run's report tables.

    \b
    Examples:
      gpuplan run tessel-plan.json --png measured.png
      gpuplan run tessel-plan.json --option steps=5 --option threads=1
      gpuplan run poseidon-plan.json --json > measured.json
      gpuplan run lagom-plan.json -- torchrun --nproc-per-node 2 train.py
    Exit codes: 0 ran, 1 the plan fails check, 2 bad input or option, 4 torch missing;
    with -- COMMAND, COMMAND's own exit code.
    """
    items, json_out, option_pairs, png = _run_flags(list(args))
    kind = items.pop(0) if len(items) >= 2 and items[0] in registry.kinds() else None
    if not items:
        _fail(GpuplanError("usage: gpuplan run [KIND] PLAN [-- COMMAND...]"))
    plan_file, rest = items[0], items[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    try:
        from gpuplan.io import check_output_path

        for out in (png, None if json_out == STDOUT else json_out):  # refused now, not after the run
            if out is not None:
                check_output_path(out)
        if Path(plan_file).is_dir():  # a training bundle (gpuplan plan train)
            if rest:
                raise GpuplanError("a training bundle runs its own model; `gpuplan run BUNDLE` takes no command")
            from gpuplan.compose.bundle import BUNDLE_KIND
            from gpuplan.runtime.bundle import run_bundle

            run_kind = kind or BUNDLE_KIND
            bundle_options = _parse_options(option_pairs)
            import inspect

            from gpuplan.run_options import check_option_values

            known = {n: p.default for n, p in inspect.signature(run_bundle).parameters.items() if n != "directory"}
            check_option_values(known, bundle_options, "a training bundle's run")
            with _spinner(f"running the bundle {plan_file}", _show_progress(False)):
                result = run_bundle(plan_file, **bundle_options)
        else:
            plan = api.load_plan(plan_file)
            if kind and plan.kind != kind:
                raise GpuplanError(f"{plan_file} is a {plan.kind} plan, not {kind}")
            run_kind = plan.kind
            run_options = _parse_options(option_pairs)
            if run_options:
                from gpuplan.run_options import check_run_options

                check_run_options(plan.kind, run_options)
            _LOG.info("running %s with options %s", plan_file, run_options)
            with _spinner(f"running {plan_file}", _show_progress(False) and not rest):
                result = (api.run(plan, command=rest, **run_options) if rest else api.run(plan, **run_options))
    except api.PlanRejected as exc:  # the plan fails check: exit as check does, nothing was started
        _fail(exc, EXIT_VIOLATIONS)
    except GpuplanError as exc:
        _fail(exc)
    if json_out is not None:
        emit_json("run", {"plan_file": plan_file, "kind": run_kind,
                          "result": {k: ([table_doc(t) if isinstance(t, Table) else t for t in v]
                                         if k == "report" and isinstance(v, list) else v)
                                     for k, v in result.items()}}, json_out)
    report = [t for t in result.get("report", []) if isinstance(t, Table)]
    if png:
        from gpuplan.viz import run_figure

        try:
            run_figure(f"gpuplan run {plan_file}: predicted vs measured", report, Path(png))
        except GpuplanError as exc:
            _fail(exc)
        say(f"figure written to {png}", json_out)
    code = result.get("returncode") if rest else None
    failed = isinstance(code, int) and not isinstance(code, bool) and code != 0
    if json_out != STDOUT:
        if report:  # the runner's own tables: predicted next to measured, and the machine
            print_tables(report)
            if result.get("verdict"):
                click.echo(f"machine: {result['verdict']}")
        else:
            rows = [[k, v] for k, v in result.items() if not isinstance(v, (list, dict))]
            print_tables([Table("run", ["measure", "value"], rows)])
        for warning in result.get("warnings", []):
            click.echo(f"warning: {warning}")
        if failed:
            click.echo(f"error: the command exited with code {code}", err=True)
    if failed:
        sys.exit(code if code > 0 else 128 - code)  # killed by signal N: 128 + N, as shells report it


def _run_flags(items: list[str]) -> tuple[list[str], str | None, tuple[str, ...], str | None]:
    """Split `gpuplan run`'s raw arguments before `--` into (the rest, --json destination or None,
    the --option KEY=VALUE pairs, the --png FILE or None); raise BadParameter when a value is missing."""
    out: list[str] = []
    json_out: str | None = None
    pairs: list[str] = []
    pairs_png: list[str] = []
    i = 0
    while i < len(items):
        a = items[i]
        if a == "--":
            out += items[i:]
            break
        if a == "--json":
            json_out = STDOUT
        elif a.startswith("--json="):
            json_out = a.split("=", 1)[1] or STDOUT
        elif a == "--png":
            if i + 1 >= len(items):
                raise click.BadParameter("expected a FILE after --png", param_hint="--png")
            pairs_png.append(items[i + 1])
            i += 1
        elif a in ("--option", "-O"):
            if i + 1 >= len(items):
                raise click.BadParameter("expected KEY=VALUE after --option", param_hint="--option")
            pairs.append(items[i + 1])
            i += 1
        elif a.startswith("--option="):
            pairs.append(a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    return out, json_out, tuple(pairs), (pairs_png[-1] if pairs_png else None)


@main.command("list")
@click.option("--options", "options_kind", default=None, metavar="KIND",
              help="List each solver's options of KIND (and its run options) with types, defaults and the "
                   "values allowed.")
@json_flag(help="Print {command, solvers: [{kind, solver, role, default, description}]} as JSON; with "
                   "--options: {command, kind, options: [{scope, name, type, default, allowed}]}.")
def list_cmd(options_kind: str | None = None, json_out: str | None = None) -> None:
    """List the models and their solvers; --options KIND lists the options of KIND's solvers
    (`solve KIND --option KEY=VALUE`) and of its runner (`run PLAN --option KEY=VALUE`).

    \b
    Examples:
      gpuplan list
      gpuplan list --options poseidon
      gpuplan list --json | jq -r '.solvers[].solver'
    Exit codes: 0 listed, 2 unknown KIND."""
    if options_kind is not None:
        return _list_options(options_kind, json_out)
    rows = []
    for kind in registry.kinds():
        for s in registry.solvers(kind):
            rows.append([kind, s.name, s.role, "yes" if s.default else "", s.description])
    emit_json("list", {"solvers": [dict(zip(("kind", "solver", "role", "default", "description"),
                                            [r[0], r[1], r[2], r[3] == "yes", r[4]])) for r in rows]}, json_out)
    if json_out != STDOUT:
        print_tables([Table("models and solvers", ["kind", "solver", "role", "default", "what"], rows)])


def _list_options(kind: str, json_out: str | None) -> None:
    """Print (or emit as JSON) every option of `kind`'s solvers and runner with its type, default and the
    values allowed (a solver option's OptionRule; a run option's RUN_OPTION_RULES entry)."""
    from gpuplan.run_options import (RUN_OPTION_RULES, annotations_of, describe_default, runner_function,
                                     runner_options)

    try:
        specs = registry.solvers(kind)
    except GpuplanError as exc:
        _fail(exc)
    rows: list[list[Any]] = []
    for s in specs:
        types = annotations_of(s.fn)
        for name, default in sorted(registry.solver_options(s).items()):
            rule = registry.option_rule(s, name)
            rows.append([f"solve --solver {s.name}", name, *describe_default(default, types.get(name, "")),
                         rule.describe() if rule is not None else ""])
    notes: list[str] = []
    if registry.model(kind).runner is not None:
        try:
            types = annotations_of(runner_function(kind))
            for name, default in sorted(runner_options(kind).items()):
                run_rule = RUN_OPTION_RULES.get(name)
                rows.append(["run", name, *describe_default(default, types.get(name, "")),
                             run_rule.describe() if run_rule is not None else ""])
        except ModuleNotFoundError as exc:  # the runner needs torch
            from gpuplan.extras import missing_extra

            err = missing_extra(exc)
            if err is None:
                raise
            notes.append(f"run options not listed: {err}")
    emit_json("list", {"kind": kind, "options": [dict(zip(("scope", "name", "type", "default", "allowed"), r))
                                                 for r in rows], "notes": notes}, json_out)
    if json_out != STDOUT:
        print_tables([Table(f"{kind}: options (--option KEY=VALUE)", ["for", "option", "type", "default", "allowed"],
                            rows)])
        for n in notes:
            click.echo(f"note: {n}")


def _attach() -> None:
    for kind, spec in _inputs().items():
        solve.add_command(_solve_command(kind, spec))
        compare.add_command(_compare_command(kind, spec))
    for mod in _command_modules():
        reg = getattr(mod, "register", None)
        if callable(reg):
            reg(main)


_attach()

if __name__ == "__main__":
    main()
