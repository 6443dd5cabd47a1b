"""Packaging: planning works without torch (the `torch` extra), and a command that needs torch names
the extra to install. Each test runs a child Python in which `import torch` fails, as it does in a
planning-only install (`pip install gpuplan`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The smallest shipped example of every kind (each solves in about a second).
EXAMPLES = {
    "oef": "examples/oef/four-tenants.yaml",
    "poseidon": "examples/poseidon/h100-a100-small.yaml",
    "tessel": "examples/tessel/hand-2.yaml",
    "lagom": "examples/lagom/small.yaml",
    "aurora": "examples/aurora/small-2regions.yaml",
    "psrl": "examples/psrl/small-agent.yaml",
    "omniserve": "examples/omniserve/llama70b-small.yaml",
    "stragglers": "examples/stragglers/three-jobs.yaml",
    "hetis": "examples/hetis/small.yaml",
}

BLOCKER = textwrap.dedent('''
    import sys

    class _NoTorch:
        """A meta-path finder that makes torch (and safetensors) unimportable, as without the extra."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "safetensors"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
''')


def _run_without_torch(body: str, tmp_path: Path) -> dict:
    """Run `body` after the torch blocker in a child Python; return the JSON it prints last."""
    script = tmp_path / "child.py"
    script.write_text(BLOCKER + textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_extras_declared_and_test_extra_pulls_torch() -> None:
    """pyproject: torch and matplotlib are extras, `test` pulls both, clarabel is not listed (cvxpy's own)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("[")[0].strip() for d in project["dependencies"]]
    assert "torch" not in names and "matplotlib" not in names and "clarabel" not in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["torch"])
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    assert any("gpuplan[" in d and "torch" in d and "plot" in d for d in extras["test"])
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().split()


def test_planning_never_imports_torch(tmp_path: Path) -> None:
    """solve, check, show (with --png) and compare every kind's shipped example with torch unimportable;
    torch is never in sys.modules; `gpuplan profile` names the extra and exits 4."""
    out = _run_without_torch(f'''
        import json, sys
        from click.testing import CliRunner
        from gpuplan.cli import main

        examples = {EXAMPLES!r}
        tmp = {str(tmp_path)!r}
        runner = CliRunner()
        codes = {{}}
        for kind, example in examples.items():
            plan = f"{{tmp}}/{{kind}}.json"
            for name, args in (("solve", ["solve", kind, example, "-o", plan, "-q", "--time-limit", "2"]),
                               ("check", ["check", plan]),
                               ("show", ["show", plan, "--png", f"{{tmp}}/{{kind}}.png"])):
                r = runner.invoke(main, args)
                codes[f"{{kind}} {{name}}"] = [r.exit_code, (r.output + repr(r.exception))[-400:]]
        r = runner.invoke(main, ["compare", "lagom", examples["lagom"], "-q"])
        codes["lagom compare"] = [r.exit_code, r.output[-400:]]
        torch_loaded = "torch" in sys.modules
        r = runner.invoke(main, ["profile", "--quick", "-o", f"{{tmp}}/profile.json", "-q"])
        print(json.dumps({{"codes": codes, "torch_loaded": torch_loaded,
                          "profile": [r.exit_code, r.output]}}))
    ''', tmp_path)
    for what, (code, text) in out["codes"].items():
        assert code == 0, f"{what}: exit {code}: {text}"
    assert out["torch_loaded"] is False
    for kind in EXAMPLES:
        assert (tmp_path / f"{kind}.png").stat().st_size > 1000
    code, text = out["profile"]
    assert code == 4, text
    assert "pip install 'gpuplan[torch]'" in text


def test_missing_extra_maps_only_known_modules() -> None:
    """A missing torch names the torch extra, matplotlib the plot extra; an unknown module is not mapped."""
    from gpuplan.extras import missing_extra

    torch_err = missing_extra(ModuleNotFoundError("No module named 'torch.distributed'", name="torch.distributed"))
    assert torch_err is not None and "gpuplan[torch]" in str(torch_err)
    plot_err = missing_extra(ModuleNotFoundError("x", name="matplotlib.pyplot"))
    assert plot_err is not None and "gpuplan[plot]" in str(plot_err)
    assert missing_extra(ModuleNotFoundError("x", name="gpuplan.nothing")) is None


def test_doctor_without_torch(tmp_path: Path) -> None:
    """`gpuplan doctor --json` works without torch and says profile and run need the torch extra."""
    out = _run_without_torch('''
        import json
        from click.testing import CliRunner
        from gpuplan.cli import main

        r = CliRunner().invoke(main, ["doctor", "--json"])
        print(json.dumps({"code": r.exit_code, "doc": json.loads(r.output)}))
    ''', tmp_path)
    assert out["code"] == 0
    doc = out["doc"]
    assert doc["torch"]["installed"] is False
    assert doc["commands"]["solve"]["works"] is True
    assert doc["commands"]["profile"]["works"] is False
    assert "gpuplan[torch]" in doc["commands"]["profile"]["why"]


def test_png_without_matplotlib_names_the_plot_extra(tmp_path: Path) -> None:
    """Without matplotlib (the `plot` extra) tables still show; --png exits 4 naming gpuplan[plot]."""
    script = tmp_path / "child.py"
    script.write_text(BLOCKER.replace('("torch", "safetensors")', '("torch", "safetensors", "matplotlib")')
                      + textwrap.dedent(f'''
        import json
        from click.testing import CliRunner
        from gpuplan.cli import main

        plan = {str(tmp_path / "p.json")!r}
        r = CliRunner()
        solved = r.invoke(main, ["solve", "oef", {EXAMPLES["oef"]!r}, "-o", plan, "-q"])
        shown = r.invoke(main, ["show", plan])
        drawn = r.invoke(main, ["show", plan, "--png", {str(tmp_path / "p.png")!r}])
        print(json.dumps([solved.exit_code, shown.exit_code, drawn.exit_code, drawn.output]))
    '''))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    solved, shown, drawn, text = json.loads(done.stdout.strip().splitlines()[-1])
    assert (solved, shown, drawn) == (0, 0, 4), text
    assert "pip install 'gpuplan[plot]'" in text
