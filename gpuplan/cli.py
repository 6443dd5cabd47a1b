"""The `gpuplan` command: a thin shell over the Python API (gpuplan.api)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

from gpuplan import api, registry
from gpuplan.commands import ProblemInputs, default_inputs
from gpuplan.errors import GpuplanError
from gpuplan.models.base import Table
from gpuplan.render import plan_header, print_tables

EXIT_VIOLATIONS = 1
EXIT_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_MISSING_EXTRA = 4


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


def _fail(exc: Exception, code: int = EXIT_INPUT) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


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


class _Seconds(click.ParamType):
    """A positive, finite number of seconds (refuses 0, negatives, inf and nan)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number <= 0:
            self.fail(f"{value!r}: expected a positive, finite number of seconds", param, ctx)
        return number


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
    click.Option(["--time-limit", "time_limit"], type=_Seconds(), default=None,
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
                 **values: Any) -> None:
        try:
            problem = _build_problem(spec, values, profile)
            with _progress(not quiet) as progress:
                plan = api.solve(problem, solver=solver, time_limit_s=time_limit, seed=seed,
                                 progress=progress, **_parse_options(option))
            plan.save(output)
        except GpuplanError as exc:
            _fail(exc)
        model = registry.model(kind)
        tables = [plan_header(plan)]
        if plan.ok and model.describe is not None:
            tables += model.describe(problem, plan)[:1]
        print_tables(tables)
        click.echo(f"plan written to {output}")
        if not plan.ok:
            sys.exit(EXIT_INFEASIBLE)

    params = list(spec.params) + [
        click.Option(["--solver"], default=None,
                     help=f"One of: {', '.join(s.name for s in registry.solvers(kind))}."),
        click.Option(["-o", "--output"], default=f"{kind}-plan.json", show_default=True,
                     type=click.Path(dir_okay=False), help="Where to write the plan (JSON)."),
        click.Option(["--option"], multiple=True, help="Solver option KEY=VALUE (repeatable)."),
    ] + _common_solve(kind)
    return click.Command(kind, params=params, callback=callback,
                         help=f"Solve a {kind} problem. {spec.help}")


def _compare_command(kind: str, spec: ProblemInputs) -> click.Command:
    def callback(solvers: str | None, json_out: str | None, time_limit: float | None, seed: int,
                 profile: str | None = None, quiet: bool = False, **values: Any) -> None:
        try:
            problem = _build_problem(spec, values, profile)
            with _progress(not quiet) as progress:
                rows = api.compare(problem, solvers=solvers.split(",") if solvers else None,
                                   time_limit_s=time_limit, seed=seed, progress=progress)
        except GpuplanError as exc:
            _fail(exc)
        columns: list[str] = []
        for _, _, summary in rows:
            columns += [c for c in summary if c not in columns and c != "status"]
        columns = [c for c in columns if c != "solve_time_s"] + ["solve_time_s"]
        table = Table(f"{kind}: every solver on the same input", ["solver", "status"] + columns,
                      [[name, s.get("status")] + [s.get(c) for c in columns] for name, _, s in rows])
        print_tables([table])
        if json_out:
            import json

            from gpuplan.io import atomic_write_text

            atomic_write_text(json_out, json.dumps([{"solver": n, **s} for n, _, s in rows], indent=1,
                                                   default=str))

    params = list(spec.params) + [
        click.Option(["--solvers"], default=None, help="Comma-separated subset of solvers (default: all)."),
        click.Option(["--json", "json_out"], default=None, type=click.Path(dir_okay=False),
                     help="Also write the table as JSON."),
    ] + _common_solve(kind)
    return click.Command(kind, params=params, callback=callback,
                         help=f"Solve one {kind} input with the paper's method and every baseline. {spec.help}")


EXIT_CODES_HELP = """\b
Exit codes:
  0  success
  1  the plan has violations (check; run refuses such a plan)
  2  bad input, option or output path: one line naming the file, field, value and expectation
  3  the problem is infeasible (the plan file says why)
  4  an optional dependency is missing: the message names the extra (pip install 'gpuplan[torch]')
  gpuplan run ... -- COMMAND exits with COMMAND's own exit code."""


class _Main(click.Group):
    """The top-level group: any gpuplan error a command lets through is reported as bad input
    (one line, exit code 2) instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpuplanError as exc:
            _fail(exc)
        except ModuleNotFoundError as exc:  # an optional dependency: name the extra that brings it
            from gpuplan.extras import missing_extra

            err = missing_extra(exc)
            if err is None:
                raise
            _fail(err, EXIT_MISSING_EXTRA)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(package_name="gpuplan")
def main() -> None:
    """gpuplan: placement and scheduling plans for measured GPU clusters."""


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
def check_cmd(plan_file: str, input_file: str | None) -> None:
    """Re-validate a plan with its model's own check, independently of the solver that made it.
    PLAN_FILE may be a training bundle (directory from `gpuplan plan train`): each plan and their agreement."""
    try:
        if Path(plan_file).is_dir():  # a training bundle (gpuplan.compose)
            from gpuplan.commands.plan import check_bundle_cli

            return check_bundle_cli(plan_file)
        plan = api.load_plan(plan_file)
        violations = api.check(input_file, plan)
    except GpuplanError as exc:
        _fail(exc)
    if not violations:
        click.echo(f"{plan_file}: valid ({plan.kind}, {plan.status.value})")
        return
    click.echo(f"{plan_file}: {len(violations)} violation(s)")
    for v in violations:
        click.echo(f"  {v}")
    sys.exit(EXIT_VIOLATIONS)


@main.command("show")
@click.argument("plan_file", type=click.Path())
@click.option("--png", type=click.Path(dir_okay=False), default=None, help="Also draw the plan to a PNG file.")
def show_cmd(plan_file: str, png: str | None) -> None:
    """Print a plan as readable tables; --png draws it. A plan that fails check shows only its header
    and violations (exit code 1): its tables would describe figures that do not hold. PLAN_FILE may be
    a training bundle (directory): --png draws its composed timeline."""
    try:
        if Path(plan_file).is_dir():  # a training bundle (gpuplan.compose)
            from gpuplan.commands.plan import show_bundle_cli

            return show_bundle_cli(plan_file, png)
        plan = api.load_plan(plan_file)
        problem = api.plan_problem(plan)
        model = registry.model(plan.kind)
        tables = [plan_header(plan)]
        violations = api.check(None, plan)
        if violations:
            print_tables(tables)
            click.echo(f"{plan_file}: {len(violations)} violation(s); only the header is shown")
            for v in violations:
                click.echo(f"  {v}")
            sys.exit(EXIT_VIOLATIONS)
        if plan.ok and model.describe is not None:
            tables += model.describe(problem, plan)
        print_tables(tables)
        if png:
            if model.draw is None:
                raise GpuplanError(f"{plan.kind} plans have no drawing")
            if not plan.ok:
                raise GpuplanError("an infeasible plan has nothing to draw")
            model.draw(problem, plan, Path(png))
            click.echo(f"figure written to {png}")
    except GpuplanError as exc:
        _fail(exc)


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_cmd(args: tuple[str, ...]) -> None:
    """Execute a plan with torch.distributed: gpuplan run [KIND] PLAN [-- COMMAND...].

    The plan is checked first (as `gpuplan check PLAN` does); a plan with violations is refused with
    exit code 1 before any process starts.
    """
    items = list(args)
    kind = items.pop(0) if len(items) >= 2 and items[0] in registry.kinds() else None
    if not items:
        _fail(GpuplanError("usage: gpuplan run [KIND] PLAN [-- COMMAND...]"))
    plan_file, rest = items[0], items[1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    try:
        if Path(plan_file).is_dir():  # a training bundle (gpuplan plan train)
            if rest:
                raise GpuplanError("a training bundle runs its own model; `gpuplan run BUNDLE` takes no command")
            from gpuplan.runtime.bundle import run_bundle

            result = run_bundle(plan_file)
        else:
            plan = api.load_plan(plan_file)
            if kind and plan.kind != kind:
                raise GpuplanError(f"{plan_file} is a {plan.kind} plan, not {kind}")
            result = api.run(plan, command=rest) if rest else api.run(plan)
    except api.PlanRejected as exc:  # the plan fails check: exit as check does, nothing was started
        _fail(exc, EXIT_VIOLATIONS)
    except GpuplanError as exc:
        _fail(exc)
    report = [t for t in result.get("report", []) if isinstance(t, Table)]
    if report:  # the runner's own tables: predicted next to measured, and the machine
        print_tables(report)
        if result.get("verdict"):
            click.echo(f"machine: {result['verdict']}")
    else:
        rows = [[k, v] for k, v in result.items() if not isinstance(v, (list, dict))]
        print_tables([Table("run", ["measure", "value"], rows)])
    for warning in result.get("warnings", []):
        click.echo(f"warning: {warning}")
    code = result.get("returncode") if rest else None
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        click.echo(f"error: the command exited with code {code}", err=True)
        sys.exit(code if code > 0 else 128 - code)  # killed by signal N: 128 + N, as shells report it


@main.command("list")
def list_cmd() -> None:
    """List the models and their solvers."""
    rows = []
    for kind in registry.kinds():
        for s in registry.solvers(kind):
            rows.append([kind, s.name, s.role, "yes" if s.default else "", s.description])
    print_tables([Table("models and solvers", ["kind", "solver", "role", "default", "what"], rows)])


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
