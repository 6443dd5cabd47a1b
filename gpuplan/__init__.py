"""gpuplan: placement and scheduling plans for measured GPU clusters.

    import gpuplan
    problem = gpuplan.load_problem("examples/oef/four-tenants.yaml")
    plan = gpuplan.solve(problem, time_limit_s=10, seed=0)
    assert gpuplan.check(problem, plan) == []
    plan.save("plan.json")
"""

from gpuplan.api import (check, compare, evaluate_config, load_plan, load_problem, plan_problem, plan_training, run,
                         solve)
from gpuplan.errors import GpuplanError, InfeasibleError, InputError, SolverError
from gpuplan.models.plan import Plan, Status
from gpuplan.models.profile import Profile, load_profile
from gpuplan.registry import kinds, solvers

__version__ = "0.1.0"

__all__ = ["check", "compare", "evaluate_config", "load_plan", "load_problem", "plan_problem", "plan_training", "run",
           "solve", "kinds", "solvers", "Plan", "Status", "Profile", "load_profile", "GpuplanError", "InfeasibleError",
           "InputError", "SolverError", "__version__"]
