"""Pure planning core: bag layouts, cost model, solvers and the per-step plan (numpy only)."""

from knapformer.planning.cost import CostModel, CostModelError
from knapformer.planning.errors import InfeasibleError, PlanError
from knapformer.planning.layout import BagLayout, LayoutError
from knapformer.planning.plan import Plan, max_over_mean, plan_step
from knapformer.planning.solvers import DEFAULT_SOLVER, SOLVERS, lower_bound, register_solver

__all__ = [
    "DEFAULT_SOLVER",
    "SOLVERS",
    "BagLayout",
    "CostModel",
    "CostModelError",
    "InfeasibleError",
    "LayoutError",
    "Plan",
    "PlanError",
    "lower_bound",
    "max_over_mean",
    "plan_step",
    "register_solver",
]
