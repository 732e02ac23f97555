"""Assignment solvers behind one registry, one module per concept:

* :mod:`.problem`: one replica's instance, built from the cost model's table;
* :mod:`.bounds`: the makespan lower bound every plan carries;
* :mod:`.reference`: the published KnapFormer greedy, exactly;
* :mod:`.construction`, :mod:`.local_search`, :mod:`.locality`: the parts of
* :mod:`.search`: ``local-search`` (alias ``ours``), the default, never worse than reference;
* :mod:`.exact`: the HiGHS MILP for small instances;
* :mod:`.driver`: options, replicas and the step-level guarantee;
* :mod:`.fast`: whether the hot loops (reference greedy, LPT, best fit, pair rounds) run as
  compiled numba kernels (:mod:`._kernels`, the default) or as their plain Python versions,
  which give the same plans bit for bit.

Errors live in :mod:`knapformer.planning.errors`; nothing here imports ``planning.plan``.
"""

from knapformer.planning.solvers import exact, reference, search  # noqa: F401  (registers)
from knapformer.planning.solvers.bounds import lower_bound, simple_lower_bound
from knapformer.planning.solvers.driver import solve, solver_names
from knapformer.planning.solvers.exact import solve_exact
from knapformer.planning.solvers.problem import Problem, SolveResult, build_problem
from knapformer.planning.solvers.reference import solve_reference
from knapformer.planning.solvers.registry import (
    ALIASES,
    DEFAULT_SOLVER,
    SOLVERS,
    canonical_solver,
    register_solver,
)
from knapformer.planning.solvers.search import solve_local_search

__all__ = [
    "ALIASES",
    "DEFAULT_SOLVER",
    "SOLVERS",
    "Problem",
    "SolveResult",
    "build_problem",
    "canonical_solver",
    "lower_bound",
    "register_solver",
    "simple_lower_bound",
    "solve",
    "solve_exact",
    "solve_local_search",
    "solve_reference",
    "solver_names",
]
